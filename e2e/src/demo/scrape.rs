//! One rank's `/metrics`, read over plain HTTP and reduced to the figures
//! the live table shows.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use heterotrain_crds::metrics as m;

/// One scrape of a rank's `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub samples: f64,
    pub steps: f64,
    pub step: f64,
    pub step_sum: f64,
    pub step_count: f64,
    pub batch: f64,
    pub generation: f64,
    pub accuracy: Option<f64>,
    pub finished: bool,
}

/// The figures of one exposition text.
pub fn parse_metrics(text: &str) -> Sample {
    let mut s = Sample::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        let name = key.split('{').next().unwrap_or("");
        match name {
            n if n == m::SAMPLES_TOTAL => s.samples += v,
            n if n == m::STEPS_TOTAL => s.steps += v,
            n if n == m::STEP => s.step = v,
            n if n == format!("{}_sum", m::STEP_SECONDS) => s.step_sum += v,
            n if n == format!("{}_count", m::STEP_SECONDS) => s.step_count += v,
            n if n == m::LOCAL_BATCH_SIZE => s.batch = v,
            n if n == m::PLAN_GENERATION => s.generation = v,
            n if n == m::EVAL_ACCURACY_RATIO => s.accuracy = Some(v),
            n if n == m::FINISHED => s.finished = v > 0.0,
            _ => {}
        }
    }
    s
}

/// Scrape `http://<ip>:<port>/metrics`; None when it does not answer.
pub fn scrape(ip: &str, port: u16) -> Option<Sample> {
    let mut s = TcpStream::connect_timeout(
        &format!("{ip}:{port}").parse().ok()?,
        Duration::from_millis(500),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    Some(parse_metrics(text.split_once("\r\n\r\n")?.1))
}
