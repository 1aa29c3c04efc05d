//! Compiles the memory shim (src/shim/shim.cpp, shim_checkpoint.cpp,
//! shim_meta_rules.cpp, shim_psamask.cpp, shim_kernel_calls.cpp,
//! shim_autocast.cpp; their C
//! interface in segtune_ffi.h) against the libtorch that torch-sys found,
//! warning-free under -Wall -Wextra, and gives the binaries a RUNPATH to
//! it (a wheel's, to the torch installed beside them) so they run without
//! LD_LIBRARY_PATH.

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
        println!("cargo:rerun-if-changed=src/shim/{file}");
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
        .file("src/shim/shim.cpp")
        .file("src/shim/shim_checkpoint.cpp")
        .file("src/shim/shim_meta_rules.cpp")
        .file("src/shim/shim_psamask.cpp")
        .file("src/shim/shim_kernel_calls.cpp")
        .file("src/shim/shim_autocast.cpp")
        .compile("segtune_shim");
    cudnn_tables();
    // A checkout's (or `cargo install`'s) binaries find the build's
    // libtorch by their RUNPATH. A wheel's (SEGTUNE_WHEEL=1, set by
    // scripts/build-wheel) name none of this machine's paths: their RUNPATH
    // is the torch beside the bin/ they are installed in
    // (lib/python3.X/site-packages/torch/lib of a venv or ~/.local), and
    // segtune finds torch at run time for its worker too (trial::machine),
    // through LD_LIBRARY_PATH, which RUNPATH gives way to.
    println!("cargo:rerun-if-env-changed=SEGTUNE_WHEEL");
    let wheel = std::env::var("SEGTUNE_WHEEL").is_ok_and(|v| v == "1");
    if wheel {
        for minor in 8..=14 {
            println!(
                "cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/../lib/python3.{minor}/site-packages/torch/lib"
            );
        }
        println!("cargo:rustc-env=SEGTUNE_BUILD_LIBTORCH=");
    } else {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
        println!("cargo:rustc-env=SEGTUNE_BUILD_LIBTORCH={}", lib.display());
    }
    println!(
        "cargo:rustc-env=SEGTUNE_BUILD_KIND={}",
        if wheel { "wheel" } else { "checkout" }
    );
    build_identity();
    // tch references nothing in libtorch_cuda, so --as-needed would drop it
    // and CUDA would silently be unavailable to trials.
    let with_cuda = lib.join("libtorch_cuda.so").exists();
    println!(
        "cargo:rustc-env=SEGTUNE_BUILD_WITH_CUDA={}",
        u8::from(with_cuda)
    );
    if with_cuda {
        println!(
            "cargo:rustc-link-arg-bin=segtune-torch=-Wl,--no-as-needed,-ltorch_cuda,--as-needed"
        );
    }
}

/// `SEGTUNE_BUILD_PROFILE` and `SEGTUNE_BUILD_TARGET` for `segtune doctor`.
fn build_identity() {
    for (name, var) in [
        ("SEGTUNE_BUILD_PROFILE", "PROFILE"),
        ("SEGTUNE_BUILD_TARGET", "TARGET"),
    ] {
        println!(
            "cargo:rustc-env={name}={}",
            std::env::var(var).unwrap_or_default()
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
