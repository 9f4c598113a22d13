//! Fails when `crds/heterotrainingjob.yaml` or `docs/api-reference.md` is
//! not what the Rust types generate.

#[test]
fn committed_crd_matches_generated() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/heterotrainingjob.yaml");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = heterotrain_crds::crd_yaml().expect("render CRD");
    assert!(
        committed == generated,
        "crds/heterotrainingjob.yaml is stale: run `make crds` and commit the result"
    );
}

#[test]
fn committed_api_reference_matches_generated() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api-reference.md");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = heterotrain_crds::api_reference_markdown().expect("render reference");
    assert!(
        committed == generated,
        "docs/api-reference.md is stale: run `make crds` and commit the result"
    );
}

#[test]
fn crd_has_expected_names_and_columns() {
    let yaml = heterotrain_crds::crd_yaml().unwrap();
    for needle in [
        "group: heterotrain.dev",
        "- htj",
        "kind: HeteroTrainingJob",
        "name: v1alpha1",
        "jsonPath: .status.planGeneration",
        "subresources:",
    ] {
        assert!(yaml.contains(needle), "CRD lacks `{needle}`");
    }
}
