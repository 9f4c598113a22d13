//! Build script: compiles the C++ c10d shim (csrc/*.cpp) against the
//! same libtorch that tch links, and embeds an rpath to `<libtorch>/lib` so
//! the trainer runs without LD_LIBRARY_PATH.

use std::path::PathBuf;
use std::process::Command;

fn libtorch_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("LIBTORCH") {
        return PathBuf::from(dir);
    }
    let venv = std::env::var("HOME")
        .map(|h| format!("{h}/.cache/heterotrain/venv/bin/python"))
        .unwrap_or_default();
    let python = std::env::var("HETEROTRAIN_PYTHON").unwrap_or_else(|_| {
        if std::path::Path::new(&venv).exists() {
            venv
        } else {
            "python3".into()
        }
    });
    let out = Command::new(&python)
        .args([
            "-c",
            "import torch,os;print(os.path.dirname(torch.__file__))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("LIBTORCH is not set and `{python}` could not run: {e}"));
    assert!(
        out.status.success(),
        "LIBTORCH is not set and `{python}` has no torch; set LIBTORCH to the torch dir"
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=HETEROTRAIN_PYTHON");
    println!("cargo:rerun-if-env-changed=HETEROTRAIN_CXX11_ABI");
    println!("cargo:rerun-if-env-changed=GLOO_INCLUDE_DIR");
    let torch = libtorch_dir();
    let inc = torch.join("include");
    let lib = torch.join("lib");
    let abi = std::env::var("HETEROTRAIN_CXX11_ABI").unwrap_or_else(|_| "1".into());
    let gloo_inc = std::env::var("GLOO_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".into());
    let nccl = std::env::var("CARGO_FEATURE_NCCL").is_ok();

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .files([
            "csrc/c10d_shim.cpp",
            "csrc/autograd_shim.cpp",
            "csrc/reducer_shim.cpp",
            "csrc/update_kernel.cpp",
        ])
        .include(&inc)
        .include(inc.join("torch/csrc/api/include"))
        .include(&gloo_inc)
        .flag("-std=c++17")
        .flag("-ffp-contract=off")
        .flag("-Wno-unused-parameter")
        .flag("-Wno-deprecated-declarations")
        .define("USE_C10D_GLOO", None)
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .warnings(false);
    if nccl {
        let site = torch.parent().map(PathBuf::from).unwrap_or_default();
        build
            .define("USE_C10D_NCCL", None)
            .define("USE_CUDA", None)
            .define("HT_USE_NCCL", None)
            .include(site.join("nvidia/nccl/include"))
            .include(site.join("nvidia/cu13/include"))
            .include(site.join("nvidia/cuda_runtime/include"));
    }
    build.compile("c10d_shim");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    // libtorch_cuda registers the CUDA backend from static initialisers; the
    // linker's --as-needed would drop it (and libtorch), leaving a binary
    // that sees no GPU. Keep them whenever this libtorch has them.
    println!("cargo:rustc-link-arg=-Wl,--push-state,--no-as-needed");
    for keep in ["torch", "torch_cuda", "c10_cuda"] {
        if lib.join(format!("lib{keep}.so")).exists() {
            println!("cargo:rustc-link-arg=-l{keep}");
        }
    }
    println!("cargo:rustc-link-arg=-Wl,--pop-state");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
