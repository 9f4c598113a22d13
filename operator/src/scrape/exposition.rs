//! Prometheus/OpenMetrics text exposition (a rank's `/metrics` body) into
//! [`Series`]; histograms and summaries are skipped. A body is read as it
//! streams in ([`Lines`]): only the lines the operator reads (the trainer's
//! `heterotrain_` series and their `# TYPE` comments) are kept, so a scrape
//! holds those plus one partial line, however large the body.

use super::Series;

/// Parse Prometheus/OpenMetrics text exposition into series.
pub fn parse_exposition(text: &str) -> Result<Vec<Series>, std::io::Error> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))?;
    Ok(scrape
        .samples
        .into_iter()
        .filter_map(|s| {
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => return None,
            };
            let labels = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Some(Series {
                name: s.metric,
                labels,
                value,
            })
        })
        .collect())
}

/// The prefix of every series the operator reads.
pub const PREFIX: &str = "heterotrain_";

/// The longest line kept: a `heterotrain_` line past it fails the scrape
/// (the trainer's lines are under 300 bytes); any other line is skipped
/// whatever its length.
pub const MAX_LINE_BYTES: usize = 64 << 10;

/// Whether the operator reads `line`: a `heterotrain_` sample or its `# TYPE`.
pub fn wanted(line: &[u8]) -> bool {
    let l = line.trim_ascii_start();
    l.starts_with(PREFIX.as_bytes())
        || l.strip_prefix(b"# TYPE ")
            .is_some_and(|r| r.trim_ascii_start().starts_with(PREFIX.as_bytes()))
}

/// The wanted lines of a body that arrives in pieces ([`Lines::push`]),
/// holding at most one partial line besides them.
#[derive(Debug, Default)]
pub struct Lines {
    /// The current line so far (nothing once it is known to be skipped).
    pending: Vec<u8>,
    /// The current line is unwanted and longer than [`MAX_LINE_BYTES`]:
    /// drop bytes up to its end.
    skipping: bool,
    kept: Vec<u8>,
}

impl Lines {
    /// Take the next piece of the body.
    pub fn push(&mut self, mut data: &[u8]) -> Result<(), String> {
        while !data.is_empty() {
            let (part, rest, ended) = match data.iter().position(|&b| b == b'\n') {
                Some(i) => (&data[..i], &data[i + 1..], true),
                None => (data, &data[data.len()..], false),
            };
            data = rest;
            if !self.skipping {
                self.pending.extend_from_slice(part);
                if self.pending.len() > MAX_LINE_BYTES {
                    if wanted(&self.pending) {
                        return Err(format!(
                            "a {PREFIX} line is longer than {MAX_LINE_BYTES} bytes"
                        ));
                    }
                    self.pending.clear();
                    self.skipping = true;
                }
            }
            if ended {
                self.end_line();
            }
        }
        Ok(())
    }

    fn end_line(&mut self) {
        if !self.skipping && wanted(&self.pending) {
            self.kept.extend_from_slice(&self.pending);
            self.kept.push(b'\n');
        }
        self.pending.clear();
        self.skipping = false;
    }

    /// The body ended: the wanted lines, as text.
    pub fn finish(mut self) -> Result<String, String> {
        self.end_line();
        String::from_utf8(self.kept).map_err(|e| e.to_string())
    }

    /// Bytes held now: the kept lines and the partial one.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.kept.capacity() + self.pending.capacity()
    }
}
