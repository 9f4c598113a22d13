//! Helpers shared by the unit tests: YAML fixtures from
//! `operator/tests/fixtures`, and validated views of them.

use heterotrain_crds::HeteroTrainingJob;
use serde::de::DeserializeOwned;

use crate::validate::{self, Checked, ValidatedJob};

/// Parse the YAML fixture `name` (a path under `operator/tests/fixtures`).
pub fn load<T: DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The job in fixture `name`.
pub fn fixture(name: &str) -> HeteroTrainingJob {
    load(name)
}

/// `job` validated; panics when the fixture is not a valid job.
pub fn valid(job: &HeteroTrainingJob) -> ValidatedJob<'_> {
    match validate::check(job, Default::default()).expect("namespace and uid") {
        Checked::Valid(v) => v,
        Checked::Invalid { problems, .. } => panic!("invalid fixture: {problems:?}"),
    }
}
