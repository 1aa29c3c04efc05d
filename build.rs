//! Compiles the memory shim (src/trial/shim.cpp, shim_checkpoint.cpp,
//! shim_meta_rules.cpp, shim_psamask.cpp, shim_kernel_calls.cpp,
//! shim_autocast.cpp; their C
//! interface in segtune_ffi.h) against the libtorch that torch-sys found,
//! warning-free under -Wall -Wextra, and gives the torch-linked binaries an rpath to it so
//! they run without LD_LIBRARY_PATH.

use std::path::PathBuf;

fn main() {
    for file in [
        "shim.cpp",
        "shim_checkpoint.cpp",
        "shim_meta_rules.cpp",
        "shim_psamask.cpp",
        "shim_kernel_calls.cpp",
        "shim_autocast.cpp",
        "shim.h",
        "segtune_ffi.h",
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
    // libtorch's headers are system headers (-isystem): their own warnings
    // are libtorch's; the shim's must stay at none under -Wall -Wextra.
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .std("c++17")
        .flag("-isystem")
        .flag(include.to_str().expect("libtorch's include dir is UTF-8"))
        .flag("-isystem")
        .flag(
            include
                .join("torch/csrc/api/include")
                .to_str()
                .expect("libtorch's include dir is UTF-8"),
        )
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag("-Wall")
        .flag("-Wextra")
        // Every exported function is declared in segtune_ffi.h first.
        .flag("-Wmissing-declarations")
        // In optimised builds GCC 12 reports a zero-size destination for
        // the atomic refcount load of c10::intrusive_ptr once libtorch's
        // c10::List::push_back is inlined into shim.cpp: a false positive
        // located in libstdc++'s <atomic> and libtorch's headers, reported
        // after inlining, which -isystem does not reach. Nothing else is
        // silenced.
        .flag_if_supported("-Wno-stringop-overflow")
        .file("src/trial/shim.cpp")
        .file("src/trial/shim_checkpoint.cpp")
        .file("src/trial/shim_meta_rules.cpp")
        .file("src/trial/shim_psamask.cpp")
        .file("src/trial/shim_kernel_calls.cpp")
        .file("src/trial/shim_autocast.cpp")
        .compile("segtune_shim");
    cudnn_tables();
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // tch references nothing in libtorch_cuda, so --as-needed would drop it
    // and CUDA would silently be unavailable to trials.
    if lib.join("libtorch_cuda.so").exists() {
        println!(
            "cargo:rustc-link-arg-bin=segtune-torch=-Wl,--no-as-needed,-ltorch_cuda,--as-needed"
        );
    }
}

/// The measured cuDNN workspace tables (`tests/fixtures/cudnn_workspace_*.csv`,
/// written by scripts/gpu-validate.sh on a real GPU), compiled in as
/// `TABLES: &[(name, text)]` for `predict::kernels::workspace_table`.
fn cudnn_tables() {
    let dir = PathBuf::from("tests/fixtures");
    println!("cargo:rerun-if-changed=tests/fixtures");
    let mut tables: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter_map(|p| {
                    let name = p.file_name()?.to_str()?.to_string();
                    let stem = name
                        .strip_prefix("cudnn_workspace_")?
                        .strip_suffix(".csv")?;
                    Some((stem.to_string(), p.clone()))
                })
                .collect()
        })
        .unwrap_or_default();
    tables.sort();
    let mut code = String::from("/// The compiled-in tables: (`sm<XY>_<cudnn>`, CSV text).\npub const TABLES: &[(&str, &str)] = &[\n");
    for (name, path) in &tables {
        let abs = std::fs::canonicalize(path).expect("table path");
        code.push_str(&format!(
            "    ({name:?}, include_str!({:?})),\n",
            abs.display().to_string()
        ));
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("cudnn_tables.rs");
    std::fs::write(out, code).expect("write cudnn_tables.rs");
}
