//! Prints the HeteroTrainingJob CRD YAML (`make crds` writes it to
//! `crds/heterotrainingjob.yaml`), or with `--reference` the API reference
//! generated from its schema (`docs/api-reference.md`).

fn main() {
    let reference = std::env::args().nth(1).as_deref() == Some("--reference");
    let rendered = if reference {
        heterotrain_crds::api_reference_markdown().map_err(|e| e.to_string())
    } else {
        heterotrain_crds::crd_yaml().map_err(|e| e.to_string())
    };
    match rendered {
        Ok(text) => print!("{text}"),
        Err(e) => {
            eprintln!("error: cannot render the CRD: {e}");
            std::process::exit(1);
        }
    }
}
