//! The wheel as users install it: `scripts/build-wheel` builds it, pip
//! installs it into fresh venvs, and the installed `segtune` runs with no
//! build variables (no `LIBTORCH_USE_PYTORCH`, no `LD_LIBRARY_PATH`):
//! - beside a pip-installed torch (the torch venv's files linked into the
//!   new venv's site-packages, as `pip install torch==2.11.0` lays them
//!   out): the README example's table is the checkout binary's;
//! - with torch elsewhere on the Python's path (a `.pth`): segtune asks
//!   that Python where torch is and its worker runs;
//! - with no torch: `--version` and `resolve` work (libtorch is not
//!   loaded), and `doctor` says what to install, exit 1.
//!
//! Needs `SEGTUNE_TORCH_PYTHON` (scripts/test sets it); builds the release
//! binaries once (minutes on a fresh checkout).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The wheel `scripts/build-wheel` writes (built once for the file's tests).
fn wheel() -> &'static Path {
    static WHEEL: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &WHEEL
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let out = Command::new(root.join("scripts/build-wheel"))
                .arg(dir.path())
                .output()
                .expect("scripts/build-wheel runs");
            assert!(
                out.status.success(),
                "scripts/build-wheel failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                name.starts_with(&format!(
                    "segtune-{}-py3-none-manylinux_2_",
                    env!("CARGO_PKG_VERSION")
                )) && name.ends_with("_x86_64.whl"),
                "{name}"
            );
            (dir, path)
        })
        .1
}

/// The torch venv's site-packages (where its torch is).
fn torch_site_packages(python: &Path) -> PathBuf {
    let out = Command::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap();
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A fresh venv made by the torch venv's interpreter; `torch` says how its
/// torch is there; the wheel installed with pip, offline (its torch==2.11.0
/// requirement met by what is there already, or skipped with `--no-deps`).
fn venv_with_wheel(dir: &Path, python: &Path, torch: Torch) -> PathBuf {
    let venv = dir.join("venv");
    run_ok(Command::new(python).args(["-m", "venv"]).arg(&venv));
    let site = torch_site_packages(&venv.join("bin/python"));
    let torch_site = torch_site_packages(python);
    match torch {
        Torch::Installed => {
            for entry in std::fs::read_dir(&torch_site).unwrap() {
                let entry = entry.unwrap();
                let name = entry.file_name().to_string_lossy().into_owned();
                let venv_own = name == "__pycache__"
                    || name == "_distutils_hack"
                    || name == "distutils-precedence.pth"
                    || name.starts_with("pip")
                    || name.starts_with("setuptools");
                if !venv_own && !site.join(&name).exists() {
                    std::os::unix::fs::symlink(entry.path(), site.join(&name)).unwrap();
                }
            }
        }
        Torch::OnPythonPath => {
            std::fs::write(
                site.join("elsewhere-torch.pth"),
                format!("{}\n", torch_site.display()),
            )
            .unwrap();
        }
        Torch::None => {}
    }
    let mut pip = Command::new(venv.join("bin/pip"));
    pip.args(["install", "--quiet", "--no-index", "--no-cache-dir"]);
    if matches!(torch, Torch::None) {
        pip.arg("--no-deps");
    }
    run_ok(pip.arg(wheel()));
    venv
}

#[derive(Clone, Copy)]
enum Torch {
    Installed,
    OnPythonPath,
    None,
}

/// `program args` with only HOME and a PATH of the system's directories:
/// none of the build's variables.
fn bare(program: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .env("PATH", "/usr/local/bin:/usr/bin:/bin");
    command
}

fn run_ok(command: &mut Command) -> Output {
    let out = command.output().expect("runs");
    assert!(
        out.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The README example's search by `segtune` into `dir`, its stdout with
/// `dir` written as `OUT`.
fn readme_search(segtune: &mut Command, dir: &Path) -> String {
    let out = run_ok(
        segtune
            .arg("search")
            .arg(common::readme_example())
            .arg("--out")
            .arg(dir.join("out"))
            .arg("--trace-cache")
            .arg(dir.join("traces")),
    );
    String::from_utf8_lossy(&out.stdout).replace(&dir.display().to_string(), "OUT")
}

/// The installed `segtune doctor` names where it found libtorch (`source`)
/// and starts the worker.
fn doctor_finds(venv: &Path, source: &str) {
    let doctor = run_ok(bare(&venv.join("bin/segtune")).arg("doctor"));
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(said.contains(source), "{said}");
    assert!(said.contains("segtune-torch starts"), "{said}");
}

#[test]
fn the_installed_wheel_gives_the_checkouts_table_for_the_readme_example() {
    let Some(python) = common::require_python(
        "the_installed_wheel_gives_the_checkouts_table",
        "SEGTUNE_TORCH_PYTHON",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let venv = venv_with_wheel(dir.path(), &python, Torch::Installed);
    doctor_finds(&venv, "(the torch installed beside segtune)");

    let installed = tempfile::tempdir().unwrap();
    let checkout = tempfile::tempdir().unwrap();
    let from_wheel = readme_search(&mut bare(&venv.join("bin/segtune")), installed.path());
    let from_checkout = readme_search(
        &mut bare(Path::new(env!("CARGO_BIN_EXE_segtune"))),
        checkout.path(),
    );
    assert!(from_wheel.contains(" rank | batch"), "{from_wheel}");
    assert_eq!(from_wheel, from_checkout);
}

#[test]
fn torch_on_the_pythons_path_is_found_by_asking_that_python() {
    let Some(python) =
        common::require_python("torch_on_the_pythons_path_is_found", "SEGTUNE_TORCH_PYTHON")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let venv = venv_with_wheel(dir.path(), &python, Torch::OnPythonPath);
    doctor_finds(&venv, "(the torch of the Python beside segtune)");
    let estimate = run_ok(
        bare(&venv.join("bin/segtune"))
            .arg("estimate")
            .arg(common::readme_example())
            .args(["--preset", "rtx3050ti", "--batch-size", "2", "--json"]),
    );
    let json: serde_json::Value = serde_json::from_slice(&estimate.stdout).unwrap();
    assert!(
        json["predicted_peak_reserved_bytes"].as_i64().unwrap_or(0) > 0,
        "{json}"
    );
}

#[test]
fn without_torch_start_up_works_and_doctor_says_what_to_install() {
    let Some(python) = common::require_python(
        "without_torch_doctor_says_what_to_install",
        "SEGTUNE_TORCH_PYTHON",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let venv = venv_with_wheel(dir.path(), &python, Torch::None);
    let segtune = venv.join("bin/segtune");
    let version = run_ok(bare(&segtune).arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("segtune {}", env!("CARGO_PKG_VERSION"))
    );
    let resolved = run_ok(
        bare(&segtune)
            .arg("resolve")
            .arg(common::readme_example())
            .args(["--format", "json"]),
    );
    assert!(String::from_utf8_lossy(&resolved.stdout).contains("\"crop_size\""));

    let doctor = bare(&segtune).arg("doctor").output().unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert_eq!(doctor.status.code(), Some(1), "{said}");
    assert!(said.contains("action needed: segtune-torch (the libtorch worker) needs the libtorch of torch==2.11.0, and none was found"), "{said}");
    assert!(said.contains("pip install torch==2.11.0"), "{said}");
    let estimate = bare(&segtune)
        .arg("estimate")
        .arg(common::readme_example())
        .args(["--preset", "rtx3050ti"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&estimate.stderr);
    assert_eq!(estimate.status.code(), Some(2), "{err}");
    assert!(err.contains("none was found"), "{err}");
}
