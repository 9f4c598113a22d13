//! Prometheus over https and with a bearer token: a real Prometheus serving
//! TLS with a certificate of a local CA (trusted only through
//! `--prometheus-ca-file`), and a local server that answers only requests
//! carrying the token (Prometheus itself does not check bearer tokens;
//! proxies in front of it, such as kube-rbac-proxy, do).

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{PrometheusAuth, Scraper};
use crate::error::Error;

const EMPTY_VECTOR: &str = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;

fn tmp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ht-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[tokio::test]
async fn https_prometheus_is_trusted_through_the_ca_file_only() {
    let dir = tmp_dir("prom-tls");
    let pki = dir.join("pki");
    heterotrain_e2e::pki::ensure_pki(&pki).expect("the local PKI");
    let prom = heterotrain_e2e::prometheus::Prometheus::start_with(
        &dir.join("prom"),
        Duration::from_secs(1),
        Some((&pki.join("server.crt"), &pki.join("server.key"))),
    )
    .expect("prometheus (make setup)");
    let url = prom.url();
    assert!(url.starts_with("https://"), "{url}");
    let timeout = Duration::from_secs(10);

    let trusting = Scraper::with_prometheus_auth(
        timeout,
        &PrometheusAuth {
            ca_file: Some(pki.join("ca.crt")),
            bearer_token_file: None,
        },
    )
    .expect("client with the CA");
    let ranks = trusting
        .query_prometheus(&url, "ns", "job", 2)
        .await
        .expect("the query over https");
    assert_eq!(ranks.len(), 2);

    // Without the CA the server's certificate is not trusted, and the
    // error says so.
    let plain = Scraper::new(timeout).expect("client");
    match plain.query_prometheus(&url, "ns", "job", 2).await {
        Err(Error::Scrape { message, .. }) => {
            assert!(message.to_lowercase().contains("certificate"), "{message}")
        }
        other => panic!("expected a certificate error, got {other:?}"),
    }

    // A CA file that is not PEM stops the client from being built.
    let bogus = dir.join("bogus.crt");
    std::fs::write(&bogus, "not a certificate").expect("write");
    let err = Scraper::with_prometheus_auth(
        timeout,
        &PrometheusAuth {
            ca_file: Some(bogus),
            bearer_token_file: None,
        },
    )
    .err()
    .expect("refused");
    assert!(err.to_string().contains("--prometheus-ca-file"), "{err}");
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Answers every request: 200 with an empty vector when it carries
/// `Authorization: Bearer <want>`, 401 otherwise; records the headers seen.
async fn token_server(want: &'static str) -> (u16, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let l = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&got).to_lowercase();
                let _ = tx.send(head.clone());
                let ok = head.contains(&format!("authorization: bearer {want}\r\n"));
                let (status, body) = if ok {
                    ("200 OK", EMPTY_VECTOR)
                } else {
                    ("401 Unauthorized", "")
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    (port, rx)
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write token");
}

#[tokio::test]
async fn bearer_token_goes_to_prometheus_only_and_is_reread() {
    let dir = tmp_dir("prom-token");
    let token = dir.join("token");
    write(&token, "first-token\n");
    let timeout = Duration::from_secs(5);
    let (port, mut seen) = token_server("first-token").await;
    let url = format!("http://127.0.0.1:{port}");
    let auth = PrometheusAuth {
        ca_file: None,
        bearer_token_file: Some(token.clone()),
    };
    let scraper = Scraper::with_prometheus_auth(timeout, &auth).expect("client");
    scraper
        .query_prometheus(&url, "ns", "job", 1)
        .await
        .expect("accepted with the token");
    // Without a token: refused.
    let anonymous = Scraper::new(timeout).expect("client");
    match anonymous.query_prometheus(&url, "ns", "job", 1).await {
        Err(Error::Scrape { message, .. }) => assert!(message.contains("401"), "{message}"),
        other => panic!("expected 401, got {other:?}"),
    }
    // A rotated token is read at the next query (the server still wants
    // the first one, so the query is refused — with the new token sent).
    write(&token, "second-token\n");
    assert!(scraper
        .query_prometheus(&url, "ns", "job", 1)
        .await
        .is_err());
    // Pod scrapes never carry the token.
    let _ = scraper.scrape_pod("127.0.0.1", port).await;
    let heads: Vec<String> = std::iter::from_fn(|| seen.try_recv().ok()).collect();
    assert_eq!(heads.len(), 4, "{heads:?}");
    assert!(heads[0].contains("bearer first-token"));
    assert!(!heads[1].contains("authorization"));
    assert!(heads[2].contains("bearer second-token"));
    assert!(heads[3].starts_with("get /metrics") && !heads[3].contains("authorization"));
    // An unreadable or empty token file is refused when the client is
    // built, without its content in the message.
    write(&token, "\n");
    let err = Scraper::with_prometheus_auth(timeout, &auth)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("empty"), "{err}");
    // A token file of two lines: refused, naming the file, not the token.
    write(&token, "secret-one\nsecret-two\n");
    let err = Scraper::with_prometheus_auth(timeout, &auth)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("more than one line") && err.contains(&token.display().to_string()),
        "{err}"
    );
    assert!(!err.contains("secret"), "{err}");
    let missing = PrometheusAuth {
        ca_file: None,
        bearer_token_file: Some(dir.join("missing")),
    };
    assert!(Scraper::with_prometheus_auth(timeout, &missing).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
