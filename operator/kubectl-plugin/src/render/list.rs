//! `list` / `get`: the jobs as a table like `kubectl get htj` (the CRD's
//! printer columns), wider with `-o wide`, or as JSON or YAML.

use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::table::Table;

/// How `list` and `get` print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// The printer columns of `kubectl get htj`.
    Table,
    /// The table and the restarts, disruptions, balance and last decision.
    Wide,
    /// The objects as the API server returns them (a `List` for `list`).
    Json,
    /// The same as YAML.
    Yaml,
}

/// `value` as `out` (JSON or YAML) text, ending in a newline.
pub fn serialized<T: serde::Serialize>(value: &T, out: Output) -> String {
    let text = match out {
        Output::Yaml => serde_yaml::to_string(value).map_err(|e| e.to_string()),
        _ => serde_json::to_string_pretty(value)
            .map(|t| format!("{t}\n"))
            .map_err(|e| e.to_string()),
    };
    text.unwrap_or_else(|e| format!("error: cannot serialise: {e}\n"))
}

/// `jobs` as `out` at `now`; `namespaces`: a NAMESPACE column first.
pub fn jobs(jobs: &[HeteroTrainingJob], out: Output, namespaces: bool, now: Timestamp) -> String {
    if matches!(out, Output::Json | Output::Yaml) {
        let items: Vec<serde_json::Value> = jobs
            .iter()
            .map(|j| serde_json::to_value(j).unwrap_or_default())
            .collect();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        return serialized(&list, out);
    }
    let mut header = vec![
        "NAME",
        "STATUS",
        "RANKS",
        "POLICY",
        "SAMPLES/S",
        "PLAN",
        "STEP",
        "PROGRESS",
        "ETA",
        "AGE",
    ];
    if out == Output::Wide {
        header.extend(["RESTARTS", "DISRUPTIONS", "BALANCE", "LAST DECISION"]);
    }
    if namespaces {
        header.insert(0, "NAMESPACE");
    }
    let mut t = Table::new(&header);
    for j in jobs {
        let st = j.status.clone().unwrap_or_default();
        let progress = st.progress.clone().unwrap_or_default();
        let mut cells = vec![
            j.name_any(),
            st.phase.clone().unwrap_or_default(),
            st.ranks.to_string(),
            j.spec.load_balancing.policy.as_str().to_string(),
            st.cluster_samples_per_second
                .map(|s| format!("{s:.1}"))
                .unwrap_or_default(),
            st.plan_generation.to_string(),
            st.step.to_string(),
            progress.percent_text.clone(),
            progress.eta.clone().unwrap_or_default(),
            super::age(j.metadata.creation_timestamp.as_ref().map(|t| t.0), now),
        ];
        if out == Output::Wide {
            cells.extend([
                st.restarts.to_string(),
                st.disruptions.to_string(),
                st.balance
                    .as_ref()
                    .map(|b| format!("{} ({:.1}%)", b.class, b.cv_percent))
                    .unwrap_or_default(),
                st.last_rebalance
                    .as_ref()
                    .map(|r| r.reason.clone())
                    .unwrap_or_default(),
            ]);
        }
        if namespaces {
            cells.insert(0, j.namespace().unwrap_or_default());
        }
        t.row(cells);
    }
    if t.is_empty() {
        return "No HeteroTrainingJobs found.\n".into();
    }
    t.render()
}
