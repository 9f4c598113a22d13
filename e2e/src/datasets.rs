//! The real datasets `make setup` builds into `$HETEROTRAIN_CACHE/data/`
//! (`trainer-image/scripts/make_datasets.py`), and how jobs on the local
//! control plane read them: each is offered as a PersistentVolumeClaim of
//! the same name, filled with a copy of the files, which the node simulator
//! mounts at the job's `dataset.path` (default `/data`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::Client;

/// scikit-learn's digits as MNIST IDX files (for `mlp`).
pub const DIGITS_MNIST: &str = "digits-mnist";
/// The same digits as CIFAR-10 binaries, 3×32×32 (for the conv nets).
pub const DIGITS_CIFAR10: &str = "digits-cifar10";
/// Byte-level tokens of Python's standard library (for `gpt`).
pub const PYSTDLIB_BYTES: &str = "pystdlib-bytes";
/// Every dataset `make setup` builds.
pub const ALL: [&str; 3] = [DIGITS_MNIST, DIGITS_CIFAR10, PYSTDLIB_BYTES];

/// `$HETEROTRAIN_CACHE/data`.
pub fn data_root() -> PathBuf {
    crate::cache_dir().join("data")
}

/// The cached dataset `name` (one of [`ALL`]), checked to be complete.
pub fn dir(name: &str) -> Result<PathBuf> {
    dir_in(&data_root(), name)
}

fn dir_in(root: &Path, name: &str) -> Result<PathBuf> {
    if !ALL.contains(&name) {
        bail!("no cached dataset {name:?} (there are {})", ALL.join(", "));
    }
    let d = root.join(name);
    if !d.join(".complete").is_file() {
        bail!(
            "dataset {name} is missing from {} — run `make setup`, which builds it from data on this machine",
            root.display()
        );
    }
    Ok(d)
}

/// The trainer's dataset format (`spec.dataset.name`) and the cached
/// dataset (also the claim's name) for `model`: the digits as MNIST IDX for
/// `mlp`, as CIFAR-10 binaries for the conv nets, Python-source bytes for `gpt`.
pub fn for_model(model: &str) -> Result<(&'static str, &'static str)> {
    Ok(match model {
        "mlp" => ("mnist", DIGITS_MNIST),
        "simple_cnn" | "resnet18" | "resnet50" => ("cifar10", DIGITS_CIFAR10),
        "gpt" => ("tokens", PYSTDLIB_BYTES),
        other => bail!("no cached dataset for model {other:?}"),
    })
}

/// Copy the regular files of `src` into `dst` (created if missing),
/// replacing files of the same name. Returns the number of files.
pub fn copy_files(src: &Path, dst: &Path) -> Result<usize> {
    std::fs::create_dir_all(dst).with_context(|| format!("creating {}", dst.display()))?;
    let mut n = 0;
    for e in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let e = e?;
        if e.file_type()?.is_file() {
            let to = dst.join(e.file_name());
            std::fs::copy(e.path(), &to)
                .with_context(|| format!("copying {} to {}", e.path().display(), to.display()))?;
            n += 1;
        }
    }
    Ok(n)
}

/// Offer the cached dataset `name` to jobs in `ns` as the claim `name`:
/// create the claim (bound to a volume of the node simulator under
/// `state_dir`) unless it exists, and copy the files into it.
pub async fn provide_claim(client: &Client, state_dir: &Path, ns: &str, name: &str) -> Result<()> {
    let src = dir(name)?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    if pvcs.get_opt(name).await?.is_none() {
        crate::volumes::create_claim(client, state_dir, ns, name)
            .await
            .with_context(|| format!("creating claim {ns}/{name}"))?;
    }
    let dst = crate::nodesim::mounts::claim_dir(state_dir, ns, name);
    copy_files(&src, &dst)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_map_to_readable_formats() {
        assert_eq!(for_model("mlp").unwrap(), ("mnist", DIGITS_MNIST));
        assert_eq!(for_model("resnet18").unwrap(), ("cifar10", DIGITS_CIFAR10));
        assert_eq!(for_model("gpt").unwrap(), ("tokens", PYSTDLIB_BYTES));
        assert!(for_model("vit").is_err());
    }

    #[test]
    fn a_dataset_counts_only_when_complete_and_copies_its_files() {
        let root = std::env::temp_dir().join(format!("ht-datasets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let d = root.join(DIGITS_MNIST);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("train-images-idx3-ubyte"), b"abc").unwrap();
        let e = dir_in(&root, DIGITS_MNIST).unwrap_err().to_string();
        assert!(e.contains("make setup"), "{e}");
        assert!(dir_in(&root, "imagenet").is_err());
        std::fs::write(d.join(".complete"), b"v1\n").unwrap();
        assert_eq!(dir_in(&root, DIGITS_MNIST).unwrap(), d);
        let dst = root.join("claim");
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::write(dst.join("train-images-idx3-ubyte"), b"old").unwrap();
        // Regular files only (the subdirectory is not copied), replacing old ones.
        assert_eq!(copy_files(&d, &dst).unwrap(), 2);
        assert_eq!(
            std::fs::read(dst.join("train-images-idx3-ubyte")).unwrap(),
            b"abc"
        );
        assert!(!dst.join("sub").exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
