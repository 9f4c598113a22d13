//! The Grafana dashboard in the chart: its structure (variables, panels the
//! issue asks for, quality bands, metric names that exist), its PromQL
//! parsed by `promtool check rules`, and — with real trainers and a real
//! Prometheus — every panel returning data.

mod support;

use std::collections::BTreeSet;

use heterotrain_crds::metrics as m;
use support::*;

/// Trainer metrics (crds/src/metrics.rs) as the dashboard may query them.
fn trainer_metrics() -> BTreeSet<String> {
    let mut s: BTreeSet<String> = [
        m::PHASE_SECONDS_TOTAL,
        m::SAMPLES_TOTAL,
        m::STEPS_TOTAL,
        m::COMPUTE_SECONDS_TOTAL,
        m::COMPUTE_SECONDS_PER_SAMPLE,
        m::LAST_STEP_COMPUTE_SECONDS,
        m::COMPUTE_SPREAD_SECONDS,
        m::LOCAL_BATCH_SIZE,
        m::PLAN_GENERATION,
        m::PLAN_REJECTED_TOTAL,
        m::STEP,
        m::EPOCH,
        m::LOSS,
        m::EVAL_ACCURACY_RATIO,
        m::EVAL_LOSS,
        m::FINISHED,
        m::PROFILE_MATMUL_FLOPS,
        m::PROFILE_MEMORY_BANDWIDTH,
        m::PROFILE_STEP_SECONDS,
        m::PROFILE_FIXED_SECONDS,
        m::PROFILE_PER_SAMPLE_SECONDS,
        m::PROFILE_MAX_BATCH_SIZE,
        heterotrain_crds::bottleneck::METRIC,
        m::PROFILE_ALLREDUCE_LATENCY_SECONDS,
        m::PROFILE_ALLREDUCE_BANDWIDTH,
        m::PROFILE_DATA_READ_BANDWIDTH,
        m::PROFILE_LINK_BANDWIDTH,
        m::GRADIENT_BYTES,
        m::CPU_QUOTA_CORES,
        m::CPU_QUOTA_USED_RATIO,
        m::GPU_PCIE_LINK_GENERATION,
        m::GPU_PCIE_LINK_WIDTH,
        m::GPU_PCIE_MAX_LINK_GENERATION,
        m::GPU_PCIE_MAX_LINK_WIDTH,
        m::DEVICE_INFO,
        m::GPU_UTILIZATION_RATIO,
        m::GPU_MEMORY_USED_BYTES,
        m::GPU_MEMORY_TOTAL_BYTES,
        m::GPU_TEMPERATURE_CELSIUS,
        m::GPU_POWER_WATTS,
        m::GPU_SM_CLOCK_HERTZ,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for suffix in ["_sum", "_count", "_bucket"] {
        s.insert(format!("{}{suffix}", m::STEP_SECONDS));
    }
    s
}

fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("heterotrain_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn dashboard_has_the_variables_and_panels_users_need() {
    let d = dashboard();
    assert!(
        d["schemaVersion"].as_u64().unwrap_or(0) >= 39,
        "a current schemaVersion"
    );
    assert_eq!(d["uid"], "heterotrain");
    let vars = d["templating"]["list"].as_array().expect("variables");
    let var = |n: &str| {
        vars.iter()
            .find(|v| v["name"] == n)
            .unwrap_or_else(|| panic!("no ${n}"))
    };
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    for (name, label) in [("namespace", "namespace"), ("job", "job_name")] {
        let q = var(name)["query"]["query"]
            .as_str()
            .expect("query variable");
        let (_, l) = label_values_query(q).expect("label_values(...)");
        assert_eq!(l, label);
    }
    let titles: Vec<String> = support::dashboard_panels(&d)
        .into_iter()
        .map(|p| p.title.to_lowercase())
        .collect();
    for want in [
        "cluster throughput",
        "samples/s per rank",
        "local batch size per rank",
        "step time breakdown by phase",
        "all-reduce wait",
        "balance (cv",
        "gpu utilisation",
        "gpu memory",
        "gpu temperature",
        "gpu power",
        "loss",
        "accuracy",
        "plan generation",
        "rebalances",
        "hardware comparison",
        "compute spread per rank",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(want)),
            "no panel for {want:?}: {titles:?}"
        );
    }
    // Every panel queries the chosen data source; panels fit the 24-column grid.
    let mut walk = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        walk.push(p);
    }
    let ids: BTreeSet<u64> = walk.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), walk.len(), "unique panel ids");
    for p in walk.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let g = &p["gridPos"];
        assert!(
            g["x"].as_u64().unwrap() + g["w"].as_u64().unwrap() <= 24,
            "{}",
            p["title"]
        );
    }
    let find = |t: &str| {
        walk.iter()
            .find(|p| p["title"].as_str().unwrap_or("").to_lowercase().contains(t))
            .unwrap()
    };
    // Plan changes are visible as steps; the phase breakdown is stacked.
    assert_eq!(
        find("local batch size")["fieldConfig"]["defaults"]["custom"]["lineInterpolation"],
        "stepAfter"
    );
    assert_eq!(
        find("breakdown")["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"],
        "normal"
    );
    // The balance quality bands: Excellent < 5 %, Good < 10 %, Fair < 20 %, Poor.
    let steps: Vec<Option<f64>> = find("balance (cv")["fieldConfig"]["defaults"]["thresholds"]
        ["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["value"].as_f64())
        .collect();
    assert_eq!(steps, [None, Some(5.0), Some(10.0), Some(20.0)]);
}

#[test]
fn dashboard_queries_use_real_metrics_and_the_job_variables() {
    let d = dashboard();
    let known = trainer_metrics();
    for p in support::dashboard_panels(&d) {
        assert!(!p.exprs.is_empty(), "{}: no queries", p.title);
        let mut uses_gpu = false;
        let mut uses_eval = false;
        for e in &p.exprs {
            // Every series is a trainer's, narrowed to the chosen job (the
            // operator's counters carry no job label).
            for name in metric_names(e) {
                assert!(
                    known.contains(&name),
                    "{}: unknown metric {name} in {e}",
                    p.title
                );
                uses_gpu |= name.starts_with("heterotrain_gpu_");
                uses_eval |= name.starts_with("heterotrain_eval_");
                // Every trainer series is narrowed to the chosen job.
                let sel = &e[e.find(&name).unwrap() + name.len()..];
                assert!(
                    sel.starts_with("{namespace=\"$namespace\",job_name=\"$job\""),
                    "{}: {name} is not filtered by $namespace/$job in {e}",
                    p.title
                );
            }
        }
        match p.requires.as_deref() {
            None => assert!(
                !uses_gpu && !uses_eval,
                "{}: mark it heterotrainRequires",
                p.title
            ),
            Some("gpu") => assert!(uses_gpu, "{}", p.title),
            Some("evaluation") => assert!(uses_eval, "{}", p.title),
            Some(other) => panic!("{}: unknown heterotrainRequires {other:?}", p.title),
        }
    }
}

#[test]
fn dashboard_promql_parses() {
    // promtool parses every expression as a recording rule.
    let d = dashboard();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut n = 0;
    for p in support::dashboard_panels(&d) {
        for e in &p.exprs {
            let e = substitute(e, "ns", "job", "1m");
            rules.push_str(&format!(
                "      - record: heterotrain:dashboard_{n}\n        expr: {}\n",
                serde_json::to_string(&e).unwrap()
            ));
            n += 1;
        }
    }
    for ann in d["annotations"]["list"].as_array().unwrap() {
        if let Some(e) = ann["expr"].as_str() {
            rules.push_str(&format!(
                "      - record: heterotrain:annotation_{n}\n        expr: {}\n",
                serde_json::to_string(&substitute(e, "ns", "job", "1m")).unwrap()
            ));
            n += 1;
        }
    }
    let dir = std::env::temp_dir().join(format!("heterotrain-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.yml");
    std::fs::write(&file, &rules).unwrap();
    let promtool =
        heterotrain_e2e::paths::find_binary("promtool").expect("promtool; run `make setup`");
    let out = std::process::Command::new(promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "promtool check rules:\n{}{}\n{rules}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
