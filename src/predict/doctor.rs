//! `segtune doctor`'s findings: this machine examined once — segtune's
//! build, the libtorch its worker loads and that libtorch's CUDA, whether
//! the worker starts and the CUDA devices it sees, the NVIDIA driver and the
//! CUDA it runs, each GPU with the preset it matches, the Pythons segtune
//! asks for `--torch`'s default and runs for `--python-worker` — with what
//! to do wherever something does not fit. `report::doctor` renders it.

use super::local_gpu::{self, LocalGpu};
use crate::worker::machine::{self, CudaFit, Driver, Libtorch};
use crate::worker::python_worker::{PythonWorker, MMSEG_PIP};
use crate::worker::Worker;
use serde::Serialize;

/// What segtune is: its version and how it was built.
#[derive(Debug, Clone, Serialize)]
pub struct Build {
    pub version: &'static str,
    pub profile: &'static str,
    pub target: &'static str,
    pub executable: Option<String>,
    /// "checkout" or "wheel".
    pub kind: &'static str,
    /// The libtorch it was built against (a checkout's; empty in a wheel).
    pub built_with: &'static str,
}

/// A GPU nvidia-smi lists.
#[derive(Debug, Clone, Serialize)]
pub struct GpuFound {
    pub index: usize,
    pub name: String,
    pub memory_mib: u64,
    pub compute_capability: Option<String>,
    pub preset: Option<&'static str>,
}

/// A Python segtune uses, and what it has.
#[derive(Debug, Clone, Serialize)]
pub struct PythonFound {
    /// What segtune uses it for.
    pub role: &'static str,
    pub python: String,
    /// Whether it answered at all.
    pub answered: bool,
    /// Distribution name and version (`None`: not installed).
    pub packages: Vec<(String, Option<String>)>,
}

impl PythonFound {
    pub fn version_of(&self, name: &str) -> Option<&str> {
        self.packages
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }
}

/// One finding that asks for something to be done (or says what segtune
/// does instead).
#[derive(Debug, Clone, Serialize)]
pub struct Advice {
    /// Whether segtune cannot do its job here without it (`doctor` exits 1).
    pub blocking: bool,
    pub text: String,
}

/// Everything `segtune doctor` found.
#[derive(Debug, Clone, Serialize)]
pub struct Doctor {
    pub segtune: Build,
    pub libtorch: Option<Libtorch>,
    /// Why no usable libtorch was found.
    pub libtorch_error: Option<String>,
    /// The CUDA devices the worker sees (it loaded libtorch and answered).
    pub worker_cuda_devices: Option<usize>,
    /// How the worker failed to start.
    pub worker_error: Option<String>,
    pub driver: Option<Driver>,
    pub cuda_fit: Option<CudaFit>,
    pub gpus: Vec<GpuFound>,
    pub pythons: Vec<PythonFound>,
    /// The release `--torch` defaults to, and where it comes from.
    pub predicts_for_torch: String,
    pub advice: Vec<Advice>,
}

impl Doctor {
    pub fn blocked(&self) -> bool {
        self.advice.iter().any(|a| a.blocking)
    }
}

/// Examines this machine (nvidia-smi, the worker once, the Pythons; a few
/// seconds at most).
pub fn examine() -> Doctor {
    let mut advice = Vec::new();
    let (libtorch, libtorch_error) = match machine::libtorch() {
        Ok(lib) => (Some(lib.clone()), None),
        Err(e) => {
            advice.push(Advice::blocking(e.to_string()));
            (None, Some(e.to_string()))
        }
    };
    let (worker_cuda_devices, worker_error) = start_worker(libtorch.is_some(), &mut advice);
    let driver = machine::driver();
    let gpus = gpus();
    let cuda_fit = driver_findings(libtorch.as_ref(), driver.as_ref(), &gpus, &mut advice);
    gpu_findings(&gpus, worker_cuda_devices, cuda_fit, &mut advice);
    let (pythons, predicts_for_torch) = pythons(&mut advice);
    Doctor {
        segtune: build(),
        libtorch,
        libtorch_error,
        worker_cuda_devices,
        worker_error,
        driver,
        cuda_fit,
        gpus,
        pythons,
        predicts_for_torch,
        advice,
    }
}

impl Advice {
    fn blocking(text: String) -> Advice {
        Advice {
            blocking: true,
            text,
        }
    }

    fn note(text: String) -> Advice {
        Advice {
            blocking: false,
            text,
        }
    }
}

fn build() -> Build {
    Build {
        version: env!("CARGO_PKG_VERSION"),
        profile: env!("SEGTUNE_BUILD_PROFILE"),
        target: env!("SEGTUNE_BUILD_TARGET"),
        executable: std::env::current_exe()
            .ok()
            .map(|p| p.display().to_string()),
        kind: machine::BUILD_KIND,
        built_with: machine::BUILD_LIBTORCH,
    }
}

/// The worker started once (where a libtorch was found): the CUDA devices
/// it sees, or how it failed to start.
fn start_worker(found: bool, advice: &mut Vec<Advice>) -> (Option<usize>, Option<String>) {
    if !found {
        return (None, None);
    }
    let started = Worker::locate()
        .map_err(|e| e.to_string())
        .and_then(|worker| worker.probe_devices());
    match started {
        Ok(n) => (Some(n), None),
        Err(why) => {
            advice.push(Advice::blocking(format!(
                "segtune-torch (the libtorch worker) did not start: {why}"
            )));
            (None, Some(why))
        }
    }
}

fn gpus() -> Vec<GpuFound> {
    local_gpu::list()
        .into_iter()
        .enumerate()
        .map(|(index, g): (usize, LocalGpu)| GpuFound {
            index,
            name: g.name,
            memory_mib: g.memory_mib,
            compute_capability: g.compute_capability,
            preset: g.preset,
        })
        .collect()
}

/// Whether the driver runs the libtorch's CUDA, with what to do where not
/// (blocking where nvidia-smi lists a GPU), or that no driver answered.
fn driver_findings(
    libtorch: Option<&Libtorch>,
    driver: Option<&Driver>,
    gpus: &[GpuFound],
    advice: &mut Vec<Advice>,
) -> Option<CudaFit> {
    let Some(driver) = driver else {
        if gpus.is_empty() {
            advice.push(Advice::note(
                "no NVIDIA driver answered (nvidia-smi): every figure is a prediction for the \
                 card you name (--preset or --vram); real trials need a GPU"
                    .into(),
            ));
        }
        return None;
    };
    let lib = libtorch?;
    let cuda_fit = lib
        .cuda
        .zip(driver.cuda)
        .map(|(torch, runs)| machine::cuda_fit(torch, runs));
    if let Some(why) = machine::driver_too_old(lib, driver) {
        advice.push(Advice {
            blocking: !gpus.is_empty(),
            text: why,
        });
    } else if let (Some(CudaFit::MinorCompatible), Some(torch), Some(runs)) =
        (cuda_fit, lib.cuda, driver.cuda)
    {
        advice.push(Advice::note(format!(
            "the driver runs CUDA up to {runs}, older than libtorch's {torch}: CUDA's minor-version \
             compatibility runs it (kernels are not compiled from PTX for the newer release)"
        )));
    }
    cuda_fit
}

/// GPUs libtorch does not see, and GPUs no preset names.
fn gpu_findings(
    gpus: &[GpuFound],
    worker_cuda_devices: Option<usize>,
    cuda_fit: Option<CudaFit>,
    advice: &mut Vec<Advice>,
) {
    if worker_cuda_devices == Some(0) && !gpus.is_empty() && cuda_fit != Some(CudaFit::DriverTooOld)
    {
        advice.push(Advice::blocking(format!(
            "nvidia-smi lists {} GPU(s) but libtorch sees none: check CUDA_VISIBLE_DEVICES{} and that this user may open /dev/nvidia*",
            gpus.len(),
            std::env::var("CUDA_VISIBLE_DEVICES")
                .map(|v| format!(" (now {v:?})"))
                .unwrap_or_default()
        )));
    }
    for gpu in gpus.iter().filter(|g| g.preset.is_none()) {
        advice.push(Advice::note(format!(
            "no preset names GPU {} ({}): segtune takes it as --vram {}M with the rates of the table's card of compute capability {}",
            gpu.index,
            gpu.name,
            gpu.memory_mib,
            gpu.compute_capability.as_deref().unwrap_or("8.6 (the default)")
        )));
    }
}

/// The Python asked for `--torch`'s default and the one `--python-worker`
/// runs (often the same).
fn pythons(advice: &mut Vec<Advice>) -> (Vec<PythonFound>, String) {
    let torch = crate::worker::machine::detect_python_torch();
    let predicts_for = match &torch {
        Some((v, python)) => format!("{v} (the torch of {python})"),
        None => format!(
            "{} (the release segtune links: no python3 with torch found; $SEGTUNE_PYTHON names another)",
            crate::kinds::TorchVersion::NEWEST
        ),
    };
    let worker = PythonWorker::locate(None);
    let python = worker.python().display().to_string();
    let packages = worker.packages();
    let found = PythonFound {
        role: "--torch's default and --python-worker",
        python: python.clone(),
        answered: packages.is_some(),
        packages: packages.unwrap_or_default(),
    };
    if !found.answered {
        advice.push(Advice::note(format!(
            "{python} did not answer: --python-worker needs a Python with MMSeg (--python PATH)"
        )));
    } else if found.version_of("mmsegmentation").is_none() || found.version_of("torch").is_none() {
        advice.push(Advice::note(format!(
            "{python} has no {}: only --python-worker needs it (for model types segtune does not build): `{python} -m {MMSEG_PIP}`",
            if found.version_of("torch").is_none() { "torch or MMSeg" } else { "MMSeg" }
        )));
    }
    (vec![found], predicts_for)
}
