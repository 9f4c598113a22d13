//! The live per-rank table: what each rank shows, and drawing it in place
//! on a terminal (or printing it every five seconds when not on one).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use super::scrape::Sample;

/// One rank as the table shows it.
pub struct RankView {
    pub rank: u32,
    pub node: String,
    pub ip: String,
    /// The last scrape and when it was taken.
    pub last: Option<(Instant, Sample)>,
    /// Samples per second since the scrape before.
    pub rate: f64,
    /// Mean seconds a step since the scrape before.
    pub step_time: f64,
}

impl RankView {
    /// A rank not scraped yet.
    pub fn new(rank: u32, node: String, ip: String) -> RankView {
        RankView {
            rank,
            node,
            ip,
            last: None,
            rate: 0.0,
            step_time: 0.0,
        }
    }

    /// Take the scrape `s` made at `now`: rate and step time since the last one.
    pub fn observe(&mut self, now: Instant, s: Sample) {
        if let Some((t, prev)) = &self.last {
            let dt = now.duration_since(*t).as_secs_f64();
            if dt > 0.0 && s.samples >= prev.samples {
                self.rate = (s.samples - prev.samples) / dt;
            }
            let dc = s.step_count - prev.step_count;
            if dc > 0.0 {
                self.step_time = (s.step_sum - prev.step_sum) / dc;
            }
        }
        self.last = Some((now, s));
    }
}

/// The table's lines under `headline`.
pub fn lines(headline: String, ranks: &[RankView]) -> Vec<String> {
    let mut lines = vec![headline];
    lines.push(format!(
        "  {:>4}  {:<8} {:<7} {:>6} {:>11} {:>10}",
        "rank", "node", "device", "batch", "samples/s", "step time"
    ));
    for r in ranks {
        let batch = r.last.as_ref().map(|(_, s)| s.batch).unwrap_or(0.0);
        lines.push(format!(
            "  {:>4}  {:<8} {:<7} {:>6.0} {:>11.1} {:>9.0}ms",
            r.rank,
            r.node,
            "cpu",
            batch,
            r.rate,
            r.step_time * 1000.0
        ));
    }
    lines
}

/// Where the table goes: redrawn in place on a terminal, else printed
/// every five seconds.
pub struct Screen {
    tty: bool,
    drawn: usize,
    last_print: Instant,
}

impl Screen {
    /// A screen on stdout.
    pub fn stdout() -> Screen {
        Screen {
            tty: std::io::stdout().is_terminal(),
            drawn: 0,
            last_print: Instant::now() - Duration::from_secs(10),
        }
    }

    /// Show `lines`, replacing what was drawn before.
    pub fn show(&mut self, lines: &[String]) {
        if self.tty {
            let mut out = std::io::stdout();
            if self.drawn > 0 {
                let _ = write!(out, "\x1b[{}A", self.drawn);
            }
            for l in lines {
                let _ = writeln!(out, "\x1b[2K{l}");
            }
            let _ = out.flush();
            self.drawn = lines.len();
        } else if self.last_print.elapsed() >= Duration::from_secs(5) {
            println!("{}", lines.join("\n"));
            self.last_print = Instant::now();
        }
    }
}
