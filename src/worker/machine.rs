//! What this machine gives `segtune-torch`, found at run time and said in
//! words: the libtorch it loads (the `torch==2.11.0` that `SEGTUNE_TORCH_VENV`
//! names, else the one installed beside segtune, else that of the Python
//! beside segtune, else the one segtune was built with), that libtorch's
//! torch release and CUDA, the NVIDIA driver with the newest CUDA it runs,
//! and whether the two fit. Spawning a worker needs the libtorch
//! ([`libtorch`], [`worker_env`]); a CUDA trial needs a driver that runs its
//! CUDA ([`check_cuda_trial`]), else it stops with what to do instead of
//! libtorch's own error. `segtune doctor` shows all of it.

use crate::error::{Error, Result};
use crate::kinds::TorchVersion;
use serde::Serialize;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The torch release tch 0.24 is built for: segtune-torch loads no other.
pub const TORCH_RELEASE: &str = "2.11.0";

/// The libtorch segtune was built with (torch-sys's, through
/// `LIBTORCH_USE_PYTORCH`): a checkout's fallback; empty in a wheel, whose
/// binaries name no path of the machine that built them.
pub const BUILD_LIBTORCH: &str = env!("SEGTUNE_BUILD_LIBTORCH");

/// "checkout" (cargo build, cargo install) or "wheel" (scripts/build-wheel).
pub const BUILD_KIND: &str = env!("SEGTUNE_BUILD_KIND");

/// Whether segtune-torch was linked against a CUDA libtorch (it then needs
/// `libtorch_cuda.so` to start at all).
const BUILT_WITH_CUDA: bool = matches!(env!("SEGTUNE_BUILD_WITH_CUDA").as_bytes(), b"1");

/// How long nvidia-smi or a Python asked about torch may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the libtorch was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LibtorchSource {
    /// `SEGTUNE_TORCH_VENV` at run time.
    TorchVenv,
    /// `../lib/pythonX.Y/site-packages/torch` beside segtune's `bin/`: the
    /// wheel's `torch` dependency in the same venv (or `~/.local`).
    BesideSegtune,
    /// The `torch` that the Python in segtune's `bin/` imports (a venv
    /// with system site-packages, a `.pth`).
    PythonBesideSegtune,
    /// The libtorch segtune was built with (a checkout's build).
    Build,
}

impl fmt::Display for LibtorchSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LibtorchSource::TorchVenv => "SEGTUNE_TORCH_VENV",
            LibtorchSource::BesideSegtune => "the torch installed beside segtune",
            LibtorchSource::PythonBesideSegtune => "the torch of the Python beside segtune",
            LibtorchSource::Build => "the libtorch segtune was built with",
        })
    }
}

/// A CUDA release, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub fn parse(text: &str) -> Option<CudaVersion> {
        let mut parts = text.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
        Some(CudaVersion { major, minor })
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Serialize for CudaVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The libtorch segtune-torch loads.
#[derive(Debug, Clone, Serialize)]
pub struct Libtorch {
    /// The directory with `libtorch_cpu.so` (torch's `lib/`).
    pub lib_dir: PathBuf,
    pub source: LibtorchSource,
    /// torch's `__version__` ("2.11.0+cu130"), from its `version.py`.
    pub version: Option<String>,
    /// The CUDA it is built for (`torch.version.cuda`); `None` for a CPU
    /// build or where `version.py` is missing.
    pub cuda: Option<CudaVersion>,
}

impl Libtorch {
    /// The libtorch in `lib_dir`, if `libtorch_cpu.so` is there.
    fn at(lib_dir: PathBuf, source: LibtorchSource) -> Option<Libtorch> {
        if !lib_dir.join("libtorch_cpu.so").is_file() {
            return None;
        }
        let text = std::fs::read_to_string(lib_dir.join("../version.py")).unwrap_or_default();
        let assigned = |name: &str| {
            text.lines().find_map(|line| {
                let rest = line.strip_prefix(name)?;
                let rest = rest.trim_start();
                if !(rest.starts_with('=') || rest.starts_with(':')) {
                    return None;
                }
                let value = rest.rsplit('=').next()?.trim();
                value
                    .strip_prefix('\'')
                    .and_then(|v| v.strip_suffix('\''))
                    .map(str::to_string)
            })
        };
        Some(Libtorch {
            version: assigned("__version__"),
            cuda: assigned("cuda").as_deref().and_then(CudaVersion::parse),
            lib_dir,
            source,
        })
    }

    /// The release without its local part ("2.11.0").
    pub fn release(&self) -> Option<&str> {
        self.version
            .as_deref()
            .map(|v| v.split('+').next().unwrap_or(v))
    }

    /// How it is named in messages: "torch 2.11.0+cu130 at DIR".
    pub fn described(&self) -> String {
        format!(
            "torch {} at {}",
            self.version.as_deref().unwrap_or("(release unknown)"),
            self.lib_dir.display()
        )
    }

    /// Why segtune-torch cannot load it, if it cannot.
    fn unusable(&self) -> Option<String> {
        if let Some(release) = self.release().filter(|r| *r != TORCH_RELEASE) {
            return Some(format!(
                "{} ({}) is torch {release}; segtune-torch is built for torch {TORCH_RELEASE} (tch 0.24), \
                 and another release's libtorch does not load with it",
                self.lib_dir.display(),
                self.source
            ));
        }
        if BUILT_WITH_CUDA && !self.lib_dir.join("libtorch_cuda.so").is_file() {
            return Some(format!(
                "{} ({}) is a CPU-only torch; segtune-torch is linked against a CUDA build and needs its libtorch_cuda.so",
                self.lib_dir.display(),
                self.source
            ));
        }
        None
    }
}

/// The libtorch this segtune's worker loads (found once per process), or
/// an environment error saying where it looked and what to install.
pub fn libtorch() -> Result<&'static Libtorch> {
    static FOUND: OnceLock<std::result::Result<Libtorch, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let exe = std::env::current_exe().ok();
            let venv = std::env::var_os("SEGTUNE_TORCH_VENV")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from);
            let build = (!BUILD_LIBTORCH.is_empty()).then(|| Path::new(BUILD_LIBTORCH));
            find_libtorch(exe.as_deref(), venv.as_deref(), build)
        })
        .as_ref()
        .map_err(|why| Error::environment(why.clone()))
}

/// The libtorch for an executable at `exe`: `torch_venv`'s (and nothing
/// else when it is given), else torch beside `exe`'s `bin/`, else the torch
/// of the Python there, else `build` (a checkout's).
pub fn find_libtorch(
    exe: Option<&Path>,
    torch_venv: Option<&Path>,
    build: Option<&Path>,
) -> std::result::Result<Libtorch, String> {
    let help = format!(
        "install torch=={TORCH_RELEASE} beside segtune (`pip install torch=={TORCH_RELEASE}` in the environment \
         segtune is installed in; `pip install segtune` brings it), or point SEGTUNE_TORCH_VENV at a venv that has it"
    );
    let checked = |lib: Libtorch| match lib.unusable() {
        Some(why) => Err(format!("{why}\n  = help: {help}")),
        None => Ok(lib),
    };
    if let Some(venv) = torch_venv {
        let found = site_packages_torch(venv)
            .or_else(|| python_torch(&venv.join("bin/python")))
            .and_then(|lib| Libtorch::at(lib, LibtorchSource::TorchVenv));
        return match found {
            Some(lib) => checked(lib),
            None => Err(format!(
                "SEGTUNE_TORCH_VENV is {}, and no torch with its libtorch is there \
                 (looked in lib/python3.*/site-packages/torch/lib and asked its bin/python)\n  = help: \
                 `{}/bin/pip install torch=={TORCH_RELEASE}`, or unset SEGTUNE_TORCH_VENV",
                venv.display(),
                venv.display()
            )),
        };
    }
    let bin = exe.and_then(Path::parent);
    let mut looked = Vec::new();
    if let Some(bin) = bin {
        let prefix = bin.parent().unwrap_or(bin);
        looked.push(format!(
            "{}/lib/python3.*/site-packages/torch/lib",
            prefix.display()
        ));
        if let Some(lib) = site_packages_torch(prefix)
            .and_then(|lib| Libtorch::at(lib, LibtorchSource::BesideSegtune))
        {
            return checked(lib);
        }
        for name in ["python3", "python"] {
            let python = bin.join(name);
            if !python.is_file() {
                continue;
            }
            looked.push(format!("the torch {} imports", python.display()));
            if let Some(lib) = python_torch(&python)
                .and_then(|lib| Libtorch::at(lib, LibtorchSource::PythonBesideSegtune))
            {
                return checked(lib);
            }
            break;
        }
    }
    if let Some(build) = build {
        looked.push(format!("{} (segtune's build)", build.display()));
        if let Some(lib) = Libtorch::at(build.to_path_buf(), LibtorchSource::Build) {
            return checked(lib);
        }
    }
    Err(format!(
        "segtune-torch (the libtorch worker) needs the libtorch of torch=={TORCH_RELEASE}, and none was found; looked in:\n{}\n  = help: {help}",
        looked
            .iter()
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    ))
}

/// `PREFIX/lib/python3.*/site-packages/torch/lib`, the first that holds
/// libtorch.
fn site_packages_torch(prefix: &Path) -> Option<PathBuf> {
    let mut libs: Vec<PathBuf> = std::fs::read_dir(prefix.join("lib"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages/torch/lib"))
        .filter(|lib| lib.join("libtorch_cpu.so").is_file())
        .collect();
    libs.sort();
    libs.pop()
}

/// The `torch/lib` of the torch `python` would import (found by
/// `importlib.util.find_spec`: torch itself is not imported).
fn python_torch(python: &Path) -> Option<PathBuf> {
    let code = "import importlib.util as u\ns = u.find_spec('torch')\nprint(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')";
    let out = run_briefly(Command::new(python).args(["-c", code]))?;
    let dir = out.trim();
    (!dir.is_empty()).then(|| PathBuf::from(dir).join("lib"))
}

/// Gives a worker's command the library path of the libtorch found at run
/// time (RUNPATH gives way to `LD_LIBRARY_PATH`); the build's own needs none.
pub fn worker_env(command: &mut Command) {
    let Ok(lib) = libtorch() else {
        return;
    };
    if lib.source == LibtorchSource::Build {
        return;
    }
    let mut path = lib.lib_dir.clone().into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    command.env("LD_LIBRARY_PATH", path);
}

/// The NVIDIA driver, as nvidia-smi reports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Driver {
    /// "550.54.14".
    pub version: String,
    /// The newest CUDA it runs ("CUDA Version" in nvidia-smi's header).
    pub cuda: Option<CudaVersion>,
}

/// The driver (nvidia-smi asked once per process), or `None` where
/// nvidia-smi is missing, fails or takes over 10 s.
pub fn driver() -> Option<Driver> {
    static FOUND: OnceLock<Option<Driver>> = OnceLock::new();
    FOUND
        .get_or_init(|| nvidia_smi(&[]).and_then(|text| parse_driver(&text)))
        .clone()
}

/// The driver and its CUDA from nvidia-smi's header ("Driver Version:
/// 550.54.14   CUDA Version: 12.4").
pub fn parse_driver(text: &str) -> Option<Driver> {
    let after = |key: &str| {
        let at = text.find(key)? + key.len();
        let value: String = text[at..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        (!value.is_empty()).then_some(value)
    };
    Some(Driver {
        version: after("Driver Version:")?,
        cuda: after("CUDA Version:")
            .as_deref()
            .and_then(CudaVersion::parse),
    })
}

/// nvidia-smi's stdout for `args`, where it exits 0 within the probe's
/// time limit.
pub fn nvidia_smi(args: &[&str]) -> Option<String> {
    run_briefly(Command::new("nvidia-smi").args(args))
}

/// What `command` prints, if it exits 0 within [`PROBE_TIMEOUT`] (a
/// program that hangs must not hang segtune).
pub fn run_briefly(command: &mut Command) -> Option<String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(10))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let text = reader.join().ok()?.ok()?;
    status.success().then_some(text)
}

/// Whether a driver that runs CUDA up to `driver` runs a libtorch built for
/// `torch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CudaFit {
    Runs,
    /// An older minor release of the same major: CUDA's minor-version
    /// compatibility runs it (without PTX compiled for the newer minor).
    MinorCompatible,
    DriverTooOld,
}

pub fn cuda_fit(torch: CudaVersion, driver: CudaVersion) -> CudaFit {
    if driver >= torch {
        CudaFit::Runs
    } else if driver.major == torch.major {
        CudaFit::MinorCompatible
    } else {
        CudaFit::DriverTooOld
    }
}

/// The oldest Linux driver of each CUDA major (NVIDIA's CUDA release
/// notes, table 3: minor-version compatibility).
const OLDEST_DRIVER: &[(u32, &str)] = &[(13, "580.65.06"), (12, "525.60.13"), (11, "450.80.02")];

/// The CUDA builds PyTorch publishes wheels of, newest first (the index
/// `https://download.pytorch.org/whl/cuXYZ`).
const TORCH_CUDA_BUILDS: &[(u32, u32)] = &[(13, 0), (12, 9), (12, 8), (12, 6), (12, 4), (11, 8)];

/// What to do where `driver` cannot run `lib`'s CUDA, in words and
/// commands; `None` where it can (or either is unknown).
pub fn driver_too_old(lib: &Libtorch, driver: &Driver) -> Option<String> {
    let (torch, runs) = (lib.cuda?, driver.cuda?);
    if cuda_fit(torch, runs) != CudaFit::DriverTooOld {
        return None;
    }
    let update = OLDEST_DRIVER
        .iter()
        .find(|(major, _)| *major == torch.major)
        .map_or(String::new(), |(_, v)| format!(" ({v} or later)"));
    let mut text = format!(
        "the NVIDIA driver {} runs CUDA up to {runs}, and the libtorch segtune-torch loads ({}, {}) is built for CUDA {torch}: \
         it cannot use this machine's GPU\n  = help: update the NVIDIA driver to one for CUDA {torch}{update}, \
         or give segtune a torch {TORCH_RELEASE} built for a CUDA this driver runs",
        driver.version,
        lib.described(),
        lib.source
    );
    if let Some((major, minor)) = TORCH_CUDA_BUILDS
        .iter()
        .copied()
        .find(|&(major, minor)| CudaVersion { major, minor } <= runs)
    {
        let tag = format!("cu{major}{minor}");
        let venv = format!("~/.cache/segtune/torch-{TORCH_RELEASE}-{tag}");
        text.push_str(&format!(
            ":\n        python3 -m venv {venv}\n        {venv}/bin/pip install torch=={TORCH_RELEASE} --index-url https://download.pytorch.org/whl/{tag}\n        export SEGTUNE_TORCH_VENV={venv}\n      (the same release, built for CUDA {major}.{minor}; if PyTorch publishes no {tag} build of {TORCH_RELEASE}, take the newest cuXY its index lists that is not above {runs})"
        ));
    }
    text.push_str("\n  = note: --device cpu predicts without the GPU");
    Some(text)
}

/// Stops a CUDA trial before it starts where this machine's driver cannot
/// run the libtorch's CUDA (libtorch would only say it sees no device).
pub fn check_cuda_trial() -> Result<()> {
    let lib = libtorch()?;
    match driver().and_then(|d| driver_too_old(lib, &d)) {
        Some(why) => Err(Error::environment(why)),
        None => Ok(()),
    }
}

/// The PyTorch of the user's Python environment: `$SEGTUNE_PYTHON`, else
/// `python3` (or `python`) on the PATH, asked for torch's distribution
/// version through `importlib.metadata` (torch itself is not imported).
/// Asked once per process (a search asks it early on a thread of its own,
/// an atlas for each of its searches): the first call runs the probe, any
/// other waits for its answer.
pub fn detect_python_torch() -> Option<(TorchVersion, String)> {
    static ANSWER: std::sync::OnceLock<Option<(TorchVersion, String)>> = std::sync::OnceLock::new();
    ANSWER.get_or_init(probe_python_torch).clone()
}

/// Starts [`detect_python_torch`] on a thread, so that the interpreters'
/// starts (~0.3 s each) overlap other work.
pub fn prefetch_python_torch() {
    std::thread::spawn(detect_python_torch);
}

fn probe_python_torch() -> Option<(TorchVersion, String)> {
    let candidates: Vec<String> = match std::env::var("SEGTUNE_PYTHON") {
        Ok(p) if !p.is_empty() => vec![p],
        _ => vec!["python3".into(), "python".into()],
    };
    for python in candidates {
        let Some(text) = torch_version_of(&python) else {
            continue;
        };
        if let Some(v) = TorchVersion::from_python(&text) {
            let v = v.clamp(TorchVersion::OLDEST, TorchVersion::NEWEST);
            return Some((v, python));
        }
    }
    None
}

/// What `python` prints for torch's version, if it answers in time (an
/// interpreter that hangs must not hang segtune).
fn torch_version_of(python: &str) -> Option<String> {
    run_briefly(Command::new(python).args([
        "-c",
        "import importlib.metadata as m; print(m.version('torch'))",
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_torch(root: &Path, version: &str, cuda: Option<&str>) -> PathBuf {
        let lib = root.join("lib/python3.12/site-packages/torch/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libtorch_cpu.so"), "").unwrap();
        std::fs::write(lib.join("libtorch_cuda.so"), "").unwrap();
        let cuda = cuda.map_or("None".to_string(), |c| format!("'{c}'"));
        std::fs::write(
            lib.join("../version.py"),
            format!("__version__ = '{version}'\ndebug = False\ncuda: Optional[str] = {cuda}\n"),
        )
        .unwrap();
        lib
    }

    #[test]
    fn the_torch_beside_segtune_comes_before_the_build() {
        let venv = tempfile::tempdir().unwrap();
        let lib = fake_torch(venv.path(), "2.11.0+cu126", Some("12.6"));
        let exe = venv.path().join("bin/segtune");
        let found = find_libtorch(Some(&exe), None, Some(Path::new("/nonexistent"))).unwrap();
        assert_eq!(found.source, LibtorchSource::BesideSegtune);
        assert_eq!(
            found.lib_dir.canonicalize().unwrap(),
            lib.canonicalize().unwrap()
        );
        assert_eq!(found.version.as_deref(), Some("2.11.0+cu126"));
        assert_eq!(
            found.cuda,
            Some(CudaVersion {
                major: 12,
                minor: 6
            })
        );
    }

    #[test]
    fn another_torch_release_or_none_is_refused_with_what_to_install() {
        let venv = tempfile::tempdir().unwrap();
        fake_torch(venv.path(), "2.5.1+cu124", Some("12.4"));
        let exe = venv.path().join("bin/segtune");
        let why = find_libtorch(Some(&exe), None, Some(Path::new("/nonexistent"))).unwrap_err();
        assert!(
            why.contains("is torch 2.5.1") && why.contains("built for torch 2.11.0"),
            "{why}"
        );
        assert!(why.contains("pip install torch==2.11.0"), "{why}");

        let empty = tempfile::tempdir().unwrap();
        let why = find_libtorch(
            Some(&empty.path().join("bin/segtune")),
            None,
            Some(Path::new("/nonexistent")),
        )
        .unwrap_err();
        assert!(
            why.contains("none was found") && why.contains("/nonexistent (segtune's build)"),
            "{why}"
        );
    }

    #[test]
    fn segtune_torch_venv_is_the_only_place_looked_when_given() {
        let beside = tempfile::tempdir().unwrap();
        fake_torch(beside.path(), "2.11.0+cu130", Some("13.0"));
        let named = tempfile::tempdir().unwrap();
        let why = find_libtorch(
            Some(&beside.path().join("bin/segtune")),
            Some(named.path()),
            Some(Path::new("/nonexistent")),
        )
        .unwrap_err();
        assert!(
            why.contains("SEGTUNE_TORCH_VENV is") && why.contains("unset SEGTUNE_TORCH_VENV"),
            "{why}"
        );
        fake_torch(named.path(), "2.11.0+cu126", Some("12.6"));
        let found =
            find_libtorch(None, Some(named.path()), Some(Path::new("/nonexistent"))).unwrap();
        assert_eq!(found.source, LibtorchSource::TorchVenv);
    }

    #[test]
    fn nvidia_smis_header_gives_the_driver_and_its_cuda() {
        let header = "+-----------------------------------------------------------------------------------------+\n\
            | NVIDIA-SMI 550.54.14              Driver Version: 550.54.14      CUDA Version: 12.4     |\n";
        assert_eq!(
            parse_driver(header),
            Some(Driver {
                version: "550.54.14".into(),
                cuda: Some(CudaVersion {
                    major: 12,
                    minor: 4
                })
            })
        );
        assert_eq!(parse_driver("No devices were found"), None);
    }

    #[test]
    fn an_old_driver_is_named_with_the_torch_build_it_runs() {
        let cu = |major, minor| CudaVersion { major, minor };
        assert_eq!(cuda_fit(cu(13, 0), cu(13, 1)), CudaFit::Runs);
        assert_eq!(cuda_fit(cu(12, 8), cu(12, 4)), CudaFit::MinorCompatible);
        assert_eq!(cuda_fit(cu(13, 0), cu(12, 4)), CudaFit::DriverTooOld);
        let lib = Libtorch {
            lib_dir: "/venv/torch/lib".into(),
            source: LibtorchSource::BesideSegtune,
            version: Some("2.11.0+cu130".into()),
            cuda: Some(cu(13, 0)),
        };
        let old = Driver {
            version: "550.54.14".into(),
            cuda: Some(cu(12, 4)),
        };
        let why = driver_too_old(&lib, &old).unwrap();
        assert!(
            why.contains("driver 550.54.14 runs CUDA up to 12.4"),
            "{why}"
        );
        assert!(
            why.contains("built for CUDA 13.0") && why.contains("580.65.06 or later"),
            "{why}"
        );
        assert!(
            why.contains("--index-url https://download.pytorch.org/whl/cu124"),
            "{why}"
        );
        assert!(why.contains("export SEGTUNE_TORCH_VENV="), "{why}");
        let new = Driver {
            version: "580.82.07".into(),
            cuda: Some(cu(13, 0)),
        };
        assert_eq!(driver_too_old(&lib, &new), None);
    }
}
