//! `segtune doctor` on this machine and with test doubles for nvidia-smi
//! (a driver too old for the libtorch's CUDA 13, and a new one), and the
//! same driver check stopping CUDA trials and `search --device auto` with
//! doctor's words instead of libtorch's "no device".

mod common;

use assert_cmd::Command;
use std::ffi::OsString;
use std::path::Path;

/// A directory with an `nvidia-smi` that prints `header` for a bare call
/// and `csv` for `--query-gpu=...`.
fn fake_nvidia_smi(dir: &Path, driver: &str, cuda: &str, csv: &str) {
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in\n  --query-gpu=*) echo '{csv}' ;;\n  *) echo '+-----------------------------------------------------------------------------------------+'\n     echo '| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |' ;;\nesac\n"
    );
    let path = dir.join("nvidia-smi");
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `segtune ARGS` with the fake nvidia-smi in `dir` first on the PATH.
fn with_fake_driver(dir: &Path, args: Vec<OsString>) -> std::process::Output {
    let path = std::env::var("PATH").unwrap_or_default();
    Command::cargo_bin("segtune")
        .unwrap()
        .args(args)
        .env("PATH", format!("{}:{path}", dir.display()))
        .output()
        .unwrap()
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(Into::into).collect()
}

/// `COMMAND <the README example> ARGS`.
fn on_example(command: &str, args: &[&str]) -> Vec<OsString> {
    let mut all = vec![OsString::from(command), common::readme_example().into()];
    all.extend(os(args));
    all
}

const LAPTOP_3050TI: &str = "NVIDIA GeForce RTX 3050 Ti Laptop GPU, 4096, 8.6";

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

#[test]
fn doctor_on_this_machine_names_libtorch_the_worker_and_the_driver() {
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("doctor")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with(&format!("segtune {} (checkout", env!("CARGO_PKG_VERSION"))),
        "{said}"
    );
    assert!(said.contains("libtorch: torch 2.11.0"), "{said}");
    assert!(
        said.contains("segtune-torch starts; libtorch sees"),
        "{said}"
    );
    assert!(said.contains("predictions are for PyTorch"), "{said}");
    if !on_path("nvidia-smi") {
        assert!(
            said.contains("NVIDIA driver: none found (nvidia-smi)"),
            "{said}"
        );
        assert!(said.contains("every figure is a prediction"), "{said}");
        assert_eq!(out.status.code(), Some(0), "{said}");
    }
    let json = Command::cargo_bin("segtune")
        .unwrap()
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let found: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let expected = if std::env::var_os("SEGTUNE_TORCH_VENV").is_some_and(|v| !v.is_empty()) {
        "torch_venv"
    } else {
        "build"
    };
    assert_eq!(found["libtorch"]["source"], expected, "{found}");
    assert!(
        found["libtorch"]["version"]
            .as_str()
            .unwrap()
            .starts_with("2.11.0"),
        "{found}"
    );
}

#[test]
fn an_old_driver_is_named_by_doctor_and_stops_cuda_trials_with_what_to_do() {
    let fake = tempfile::tempdir().unwrap();
    fake_nvidia_smi(fake.path(), "550.54.14", "12.4", LAPTOP_3050TI);

    let out = with_fake_driver(fake.path(), os(&["doctor"]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("NVIDIA driver: 550.54.14, runs CUDA up to 12.4"),
        "{said}"
    );
    assert!(
        said.contains("GPU 0: NVIDIA GeForce RTX 3050 Ti Laptop GPU, 4096 MiB, compute capability 8.6, preset rtx3050ti-laptop"),
        "{said}"
    );
    assert!(
        said.contains("action needed: the NVIDIA driver 550.54.14 runs CUDA up to 12.4"),
        "{said}"
    );
    assert!(said.contains("is built for CUDA 13.0"), "{said}");
    assert!(said.contains("580.65.06 or later"), "{said}");
    assert!(
        said.contains(
            "pip install torch==2.11.0 --index-url https://download.pytorch.org/whl/cu124"
        ),
        "{said}"
    );
    assert!(said.contains("export SEGTUNE_TORCH_VENV="), "{said}");

    let json = with_fake_driver(fake.path(), os(&["doctor", "--json"]));
    let found: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(found["cuda_fit"], "driver_too_old", "{found}");
    assert_eq!(found["driver"]["cuda"], "12.4", "{found}");
    assert_eq!(found["gpus"][0]["preset"], "rtx3050ti-laptop", "{found}");

    let trial = on_example(
        "trial",
        &[
            "--device",
            "cuda:0",
            "--batch-size",
            "2",
            "--crop",
            "512x512",
        ],
    );
    let out = with_fake_driver(fake.path(), trial);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the NVIDIA driver 550.54.14 runs CUDA up to 12.4"),
        "{err}"
    );
    assert!(!err.contains("libtorch sees 0 CUDA device"), "{err}");

    let out_dir = tempfile::tempdir().unwrap();
    let mut search = on_example("search", &["--quiet", "--out"]);
    search.push(out_dir.path().into());
    let out = with_fake_driver(fake.path(), search);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--device cpu predicts without the GPU"),
        "{err}"
    );
    assert!(!out_dir.path().join("search.json").exists());
}

#[test]
fn a_driver_new_enough_is_no_obstacle_and_an_unseen_gpu_is_said() {
    let fake = tempfile::tempdir().unwrap();
    fake_nvidia_smi(fake.path(), "580.82.07", "13.0", LAPTOP_3050TI);
    let out = with_fake_driver(fake.path(), os(&["doctor"]));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        !said.contains("runs CUDA up to 13.0, and the libtorch"),
        "{said}"
    );
    // This machine's libtorch sees no GPU where the double lists one.
    if said.contains("libtorch sees 0 CUDA device(s)") {
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(
            said.contains("nvidia-smi lists 1 GPU(s) but libtorch sees none"),
            "{said}"
        );
    }

    let out_dir = tempfile::tempdir().unwrap();
    let mut search = on_example("search", &["--quiet", "--json", "--out"]);
    search.push(out_dir.path().into());
    let out = with_fake_driver(fake.path(), search);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
