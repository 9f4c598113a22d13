//! Prints the HeteroTrainingJob CRD YAML (`make crds` writes it to
//! `crds/heterotrainingjob.yaml`).

fn main() {
    match heterotrain_crds::crd_yaml() {
        Ok(yaml) => print!("{yaml}"),
        Err(e) => {
            eprintln!("error: cannot render the CRD: {e}");
            std::process::exit(1);
        }
    }
}
