//! A real Prometheus server (Debian's package) for tests and the demo:
//! scrapes the simulated pods through file-based service discovery, which
//! the node simulator keeps in sync, with the same target labels the Helm
//! chart's PodMonitor produces (`namespace`, `pod`, `job_name`, `rank`, `group`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::keeper::{spawn_tied, stop_child};
use crate::paths::find_binary;
use crate::ports::free_ports;

/// A running Prometheus.
pub struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
    tls: bool,
}

/// The rule file Prometheus evaluates under `dir` ([`Prometheus::load_rules`]).
pub fn rules_file(dir: &Path) -> PathBuf {
    dir.join("rules.yaml")
}

/// The file-SD target file Prometheus reads under `dir`.
pub fn targets_file(dir: &Path) -> PathBuf {
    dir.join("targets.json")
}

impl Prometheus {
    /// Start Prometheus with its data, config and targets under `dir`,
    /// scraping every `interval`.
    pub fn start(dir: &Path, interval: Duration) -> Result<Prometheus> {
        Prometheus::start_with(dir, interval, None)
    }

    /// [`Prometheus::start`] serving https with the PEM certificate and key
    /// `tls` (its `--web.config.file`); [`Prometheus::url`] is then https.
    pub fn start_with(
        dir: &Path,
        interval: Duration,
        tls: Option<(&Path, &Path)>,
    ) -> Result<Prometheus> {
        let bin = find_binary("prometheus")
            .ok_or_else(|| anyhow!("prometheus not found; run `make setup`"))?;
        std::fs::create_dir_all(dir.join("data"))?;
        let targets = targets_file(dir);
        if !targets.exists() {
            std::fs::write(&targets, "[]")?;
        }
        if !rules_file(dir).exists() {
            std::fs::write(rules_file(dir), "groups: []\n")?;
        }
        let secs = interval.as_secs().max(1);
        let config = format!(
            "global:\n  scrape_interval: {secs}s\n  scrape_timeout: {secs}s\n  evaluation_interval: {secs}s\n\
rule_files: ['{}']\n\
scrape_configs:\n  - job_name: heterotrain-trainers\n    file_sd_configs:\n      - files: ['{}']\n        refresh_interval: 1s\n",
            rules_file(dir).display(),
            targets.display()
        );
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let port = free_ports(1)?[0];
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--storage.tsdb.retention.time=1d")
        .arg("--web.enable-lifecycle")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
        if let Some((cert, key)) = tls {
            let web = dir.join("web.yml");
            std::fs::write(
                &web,
                format!(
                    "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
                    cert.display(),
                    key.display()
                ),
            )?;
            cmd.arg(format!("--web.config.file={}", web.display()));
        }
        let child = spawn_tied(cmd).context("starting prometheus")?;
        let p = Prometheus {
            child,
            port,
            dir: dir.to_path_buf(),
            tls: tls.is_some(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // An https server answers plain HTTP with a 400 naming HTTPS.
            match http_get(port, "/-/ready") {
                Ok((200, _)) if !p.tls => return Ok(p),
                Ok((400, body)) if p.tls && body.contains("HTTPS") => return Ok(p),
                _ => {}
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
                bail!("prometheus not ready after 30s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `http://127.0.0.1:<port>` (`https://` when started with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Directory holding config, data and targets.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Run an instant query; returns the `data.result` array.
    pub fn query(&self, expr: &str) -> Result<Vec<serde_json::Value>> {
        let path = format!("/api/v1/query?query={}", url_encode(expr));
        let (code, body) = http_get(self.port, &path)?;
        let v: serde_json::Value = serde_json::from_str(&body)
            .with_context(|| format!("prometheus answered {code}: {body}"))?;
        if v["status"] != "success" {
            bail!("query {expr:?} failed: {body}");
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Evaluate the rule groups `yaml` from now on (written to
    /// [`rules_file`], then a reload); returns once the server lists
    /// every group.
    pub fn load_rules(&self, yaml: &str) -> Result<()> {
        let groups: serde_yaml::Value = serde_yaml::from_str(yaml).context("rules are YAML")?;
        let want = groups["groups"].as_sequence().map_or(0, Vec::len);
        std::fs::write(rules_file(&self.dir), yaml)?;
        let (code, body) = http_request(self.port, "POST", "/-/reload")?;
        if code != 200 {
            bail!("reload answered {code}: {body}");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, body) = http_request(self.port, "GET", "/api/v1/rules")?;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if v["data"]["groups"].as_array().map_or(0, Vec::len) >= want {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("prometheus did not load {want} rule groups: {body}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stop the server.
    pub fn stop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(5));
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// RFC 3986's unreserved characters: what a query-string value keeps as is.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encode a query-string value.
pub fn url_encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

/// Minimal HTTP/1.1 GET to 127.0.0.1:`port` (plain text, `Connection: close`).
pub fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    http_request(port, "GET", path)
}

/// A bodiless HTTP/1.1 `method` request to 127.0.0.1:`port`.
fn http_request(port: u16, method: &str, path: &str) -> Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let at = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("bad HTTP response"))?;
    let head = String::from_utf8_lossy(&buf[..at]);
    let body = &buf[at + 4..];
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("bad status line"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        String::from_utf8_lossy(&dechunk(body)).into_owned()
    } else {
        String::from_utf8_lossy(body).into_owned()
    };
    Ok((code, body))
}

/// The body of a chunked transfer, as bytes (a chunk may end inside a
/// multi-byte character: decode only the whole body).
fn dechunk(mut s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = s.windows(2).position(|w| w == b"\r\n") {
        let Some(n) = std::str::from_utf8(&s[..eol])
            .ok()
            .and_then(|len| usize::from_str_radix(len.trim(), 16).ok())
        else {
            break;
        };
        let rest = &s[eol + 2..];
        if n == 0 || rest.len() < n {
            break;
        }
        out.extend_from_slice(&rest[..n]);
        s = rest[n..].strip_prefix(b"\r\n").unwrap_or(&rest[n..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::dechunk;

    #[test]
    fn a_chunk_may_end_inside_a_character() {
        // "é" is 0xC3 0xA9: split across two chunks.
        let body = b"2\r\na\xC3\r\n2\r\n\xA9b\r\n0\r\n\r\n";
        assert_eq!(String::from_utf8(dechunk(body)).unwrap(), "a\u{e9}b");
        assert_eq!(dechunk(b"zz\r\nabc"), b"");
    }
}
