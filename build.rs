//! Compiles the memory shim (src/trial/shim.cpp, shim_checkpoint.cpp,
//! shim_meta_rules.cpp, shim_psamask.cpp) against the libtorch that
//! torch-sys found, and gives the torch-linked binaries an rpath to it so
//! they run without LD_LIBRARY_PATH.

use std::path::PathBuf;

fn main() {
    for file in [
        "shim.cpp",
        "shim_checkpoint.cpp",
        "shim_meta_rules.cpp",
        "shim_psamask.cpp",
        "shim.h",
    ] {
        println!("cargo:rerun-if-changed=src/trial/{file}");
    }
    let lib = PathBuf::from(
        std::env::var("DEP_TCH_LIBTORCH_LIB")
            .expect("torch-sys exports DEP_TCH_LIBTORCH_LIB (set LIBTORCH_USE_PYTORCH=1)"),
    );
    let include = lib
        .parent()
        .expect("libtorch lib dir has a parent")
        .join("include");
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .std("c++17")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .warnings(false)
        .file("src/trial/shim.cpp")
        .file("src/trial/shim_checkpoint.cpp")
        .file("src/trial/shim_meta_rules.cpp")
        .file("src/trial/shim_psamask.cpp")
        .compile("segtune_shim");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // tch references nothing in libtorch_cuda, so --as-needed would drop it
    // and CUDA would silently be unavailable to trials.
    if lib.join("libtorch_cuda.so").exists() {
        println!(
            "cargo:rustc-link-arg-bin=segtune-torch=-Wl,--no-as-needed,-ltorch_cuda,--as-needed"
        );
    }
}
