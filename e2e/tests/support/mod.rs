//! Helpers shared by the chart tests: run the real `helm` binary on
//! `charts/heterotrain`, parse what it renders, find objects in it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use serde_yaml::Value;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// `charts/heterotrain`.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts").join("heterotrain")
}

/// The helm binary `make setup` installs.
pub fn helm() -> PathBuf {
    heterotrain_e2e::paths::find_binary("helm")
        .expect("helm not found in $HETEROTRAIN_CACHE/bin or PATH; run `make setup`")
}

/// Run helm with `args`; `Ok(stdout)` on success, `Err(stdout + stderr)` otherwise.
pub fn run_helm(args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm())
        .args(args)
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("heterotrain-helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("heterotrain-helm-config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("heterotrain-helm-data"),
        )
        .output()
        .expect("running helm");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "helm {args:?} failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Release name and namespace the template tests render with.
pub const RELEASE: &str = "ht";
pub const NAMESPACE: &str = "heterotrain-system";

/// `helm template ht charts/heterotrain -n heterotrain-system <extra>`, parsed.
pub fn template(extra: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        RELEASE,
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        NAMESPACE,
    ];
    args.extend_from_slice(extra);
    let text = run_helm(&args).unwrap_or_else(|e| panic!("{e}"));
    parse_docs(&text)
}

/// Every non-empty YAML document of a multi-document stream.
pub fn parse_docs(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize;

/// `kind` of a rendered object.
pub fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

/// `metadata.name` of a rendered object.
pub fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or("")
}

/// `metadata.namespace` of a rendered object.
pub fn namespace(v: &Value) -> &str {
    v["metadata"]["namespace"].as_str().unwrap_or("")
}

/// All objects of `kind`.
pub fn all<'a>(docs: &'a [Value], k: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind(d) == k).collect()
}

/// The only object of `kind` (panics unless there is exactly one).
pub fn one<'a>(docs: &'a [Value], k: &str) -> &'a Value {
    let found = all(docs, k);
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {k}, got {}",
        found.len()
    );
    found[0]
}

/// Convert a rendered object into a typed Kubernetes object.
pub fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    serde_yaml::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{} {} does not parse: {e}", kind(v), name(v)))
}

/// The chart's appVersion.
pub fn app_version() -> String {
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    chart["appVersion"]
        .as_str()
        .expect("appVersion is a string")
        .to_string()
}

/// Value sets the tests render and lint the chart with.
pub fn value_sets() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("defaults", vec![]),
        (
            "prometheus-operator",
            vec![
                "--api-versions",
                "monitoring.coreos.com/v1",
                "--set",
                "monitoring.additionalLabels.release=kube-prometheus-stack",
            ],
        ),
        (
            "several namespaces + network policy",
            vec![
                "--set",
                "watchNamespaces={team-a,team-b}",
                "--set",
                "networkPolicy.enabled=true",
                "--api-versions",
                "monitoring.coreos.com/v1",
            ],
        ),
        (
            "prometheus source, pinned images, no extras",
            vec![
                "--set",
                "operator.metricsSource=prometheus",
                "--set",
                "operator.prometheusUrl=http://prometheus.monitoring:9090",
                "--set",
                "operator.metricsFromNamespaces={monitoring,observability}",
                "--set",
                "operator.allowedPrometheusUrls={https://thanos.monitoring:10902}",
                "--set",
                "operator.allowedImages={ghcr.io/heterotrain/}",
                "--set",
                "operator.allowedSecrets={s3-creds,wandb}",
                "--set",
                "operator.allowCustomCommands=false",
                "--set",
                "operator.prometheusAuth.secretName=prometheus-client",
                "--set",
                "operator.prometheusAuth.tokenKey=token",
                "--set",
                "operator.image.tag=9.9.9",
                "--set",
                "trainer.image.tag=9.9.9",
                "--set",
                "grafana.dashboards.enabled=false",
                "--set",
                "metrics.service.enabled=false",
                "--set",
                "operator.profileCache=false",
                "--set",
                "operator.replicas=2",
            ],
        ),
        (
            "one namespace, no profile cache",
            vec![
                "--set",
                "watchNamespaces={ml}",
                "--set",
                "operator.profileCache=false",
            ],
        ),
        ("every namespace", vec!["--set", "watchAllNamespaces=true"]),
    ]
}

/// Plain HTTP/1.1 GET of `path` on `addr` (`ip:port`); the body on 200.
pub fn http_get(addr: &str, path: &str) -> Result<String, String> {
    http_get_with(addr, path, "")
}

/// [`http_get`] with extra header lines (each ending in `\r\n`).
pub fn http_get_with(addr: &str, path: &str, headers: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").ok_or("bad HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!("GET {addr}{path}: {head}"));
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((len, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(len.trim(), 16).map_err(|e| e.to_string())?;
            if n == 0 || tail.len() < n {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        return Ok(out);
    }
    Ok(body.to_string())
}

/// `promtool check metrics` on an exposition; panics with its findings.
pub fn promtool_check_metrics(exposition: &str) {
    use std::io::Write;
    let promtool = heterotrain_e2e::paths::find_binary("promtool")
        .expect("promtool not found; run `make setup`");
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("writing to promtool");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- exposition ---\n{exposition}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The chart's Grafana dashboard.
pub fn dashboard() -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("dashboards/heterotrain.json"))
            .expect("dashboards/heterotrain.json"),
    )
    .expect("dashboard is JSON")
}

/// One panel's queries.
pub struct PanelQueries {
    pub title: String,
    /// `heterotrainRequires`: "gpu" / "evaluation" for panels a CPU-only
    /// short run cannot fill.
    pub requires: Option<String>,
    pub exprs: Vec<String>,
}

/// Every non-row panel (nested rows included) with its PromQL.
pub fn dashboard_panels(d: &serde_json::Value) -> Vec<PanelQueries> {
    fn walk(ps: &serde_json::Value, out: &mut Vec<PanelQueries>) {
        for p in ps.as_array().into_iter().flatten() {
            if p["type"] == "row" {
                walk(&p["panels"], out);
                continue;
            }
            out.push(PanelQueries {
                title: p["title"].as_str().unwrap_or("").to_string(),
                requires: p["heterotrainRequires"].as_str().map(str::to_string),
                exprs: p["targets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t["expr"].as_str().map(str::to_string))
                    .collect(),
            });
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

/// Grafana's variables replaced the way Grafana would for one job.
pub fn substitute(expr: &str, namespace: &str, job: &str, rate_interval: &str) -> String {
    expr.replace("$__rate_interval", rate_interval)
        .replace("${namespace}", namespace)
        .replace("$namespace", namespace)
        .replace("${job}", job)
        .replace("$job", job)
}

/// A Grafana `label_values(expr, label)` variable query as PromQL
/// (`group by (label) (expr)`), with the label it yields.
pub fn label_values_query(q: &str) -> Option<(String, String)> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (expr, label) = inner.rsplit_once(',')?;
    let label = label.trim().to_string();
    Some((format!("group by ({label}) ({})", expr.trim()), label))
}

#[allow(unused_imports)]
pub use cluster::*;

/// Helpers for tests against the local control plane.
pub mod cluster;

/// The rest of a short test job's spec after its `workers` (indented as a
/// `spec` field): a small mlp on synthetic images for 20 steps, static
/// split, no profile, no checkpoints.
pub const SHORT_RUN: &str = r#"  model: {name: mlp, hidden: 32, layers: 1}
  dataset: {name: synthetic_image, syntheticSamples: 1024}
  training: {globalBatchSize: 32, maxSteps: 20, learningRate: "0.01"}
  loadBalancing: {policy: static}
  profiling: {enabled: false}
  checkpoint: {everySteps: 0}
"#;

/// RFC 7386 merge patch of `patch` into `base`, enough for building the
/// invalid jobs of `operator/tests/fixtures/invalid.yaml`.
pub fn merge(base: &mut serde_json::Value, patch: &serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else {
                    merge(b.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}
