//! The Python worker: a [`TrialRequest`] answered by MMSeg itself, in the
//! user's own Python, for models segtune does not rebuild (a backbone from
//! `custom_imports`, a type from the user's package). `python_worker.py`
//! (embedded here, written to a temporary file per trial) imports the
//! user's MMSeg and modules, runs the real `model.train_step` on the CPU or
//! CUDA and prints one [`TrialReport`] (`worker: python`), measured as the
//! `segtune-torch` worker measures (the same counting-allocator semantics on
//! the CPU, the caching allocator's statistics on CUDA). Its exit codes are
//! the native worker's: 0 for `ok`, 1 for another status, 2 when the trial
//! cannot start (then it prints a `python_worker_error` instead: MMSeg
//! missing from that Python, a config that does not load, no such device).

use super::process::{run_child, LiveTempDir, WorkerDeath, EXIT_INPUT_ERROR};
use super::ModelSummary;
use crate::error::{Error, Result};
use crate::kinds::{RunMode, TorchVersion};
use crate::trial::TrialReport;
use crate::trial::{OpTrace, TrialRequest, TrialStatus};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The worker script.
pub const SCRIPT: &str = include_str!("python_worker.py");

/// What the Python worker needs besides torch (as `pip install` takes it).
pub const MMSEG_PIP: &str = "pip install mmengine==0.10.7 mmcv-lite==2.1.0 mmsegmentation==1.2.2";

/// How long building the model for `inspect --python-worker` may take
/// (MMSeg's imports and the model's initialisation on the CPU).
const INSPECT_DEADLINE: Duration = Duration::from_secs(600);

/// Time allowed beyond the trial's own: the interpreter's start, MMSeg's
/// imports and, the first time, the counting allocator's C++ build.
pub const START_ALLOWANCE: Duration = Duration::from_secs(300);

/// A Python interpreter that runs `python_worker.py`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonWorker {
    python: PathBuf,
}

/// Why the Python worker could not start a trial (its `python_worker_error`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
struct StartFailure {
    kind: StartFailureKind,
    message: String,
    /// The packages this Python cannot import (`missing_mmseg`).
    #[serde(default)]
    missing: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum StartFailureKind {
    /// torch, mmengine, mmcv or mmseg cannot be imported.
    MissingMmseg,
    /// The config does not load, or its model or optim_wrapper does not build.
    Config,
    /// No such CUDA device.
    Device,
    /// The host: the counting allocator's C++ build failed.
    Environment,
}

#[derive(Debug, serde::Deserialize)]
struct Refusal {
    python_worker_error: StartFailure,
}

impl PythonWorker {
    /// The worker on the interpreter at `python`.
    pub fn at(python: impl Into<PathBuf>) -> PythonWorker {
        PythonWorker {
            python: python.into(),
        }
    }

    /// `--python` if given; else the Python segtune asks for its torch
    /// release (`$SEGTUNE_PYTHON`, else `python3` or `python` with torch);
    /// else `$SEGTUNE_PYTHON`; else `python3`.
    pub fn locate(explicit: Option<&Path>) -> PythonWorker {
        if let Some(p) = explicit {
            return PythonWorker::at(p);
        }
        if let Some((_, python)) = super::machine::detect_python_torch() {
            return PythonWorker::at(python);
        }
        match std::env::var("SEGTUNE_PYTHON") {
            Ok(p) if !p.is_empty() => PythonWorker::at(p),
            _ => PythonWorker::at("python3"),
        }
    }

    pub fn python(&self) -> &Path {
        &self.python
    }

    /// The versions of the distributions the worker needs (torch,
    /// mmengine, mmcv or mmcv-lite, mmsegmentation; mmdet for MMSeg's
    /// MaskFormer heads) in this Python, by `importlib.metadata` (nothing
    /// imported); `None` where the interpreter does not answer.
    pub fn packages(&self) -> Option<Vec<(String, Option<String>)>> {
        let code = "import importlib.metadata as m\n\
            for d in ('torch', 'mmengine', 'mmcv', 'mmcv-lite', 'mmsegmentation', 'mmdet'):\n\
            \x20   try: print(d, m.version(d))\n\
            \x20   except Exception: print(d)";
        let text = super::machine::run_briefly(Command::new(&self.python).args(["-c", code]))?;
        Some(
            text.lines()
                .filter_map(|line| {
                    let mut parts = line.split_whitespace();
                    let name = parts.next()?.to_string();
                    Some((name, parts.next().map(str::to_string)))
                })
                .collect(),
        )
    }

    /// The script written to a directory of its own (removed when the
    /// directory is dropped) and its command for `request` (the
    /// `--request` text).
    fn command(&self, request: &str) -> Result<(LiveTempDir, Command)> {
        let dir = LiveTempDir::new()
            .map_err(|e| Error::io("cannot create a directory for the Python worker", e))?;
        let script = dir.path().join("segtune_python_worker.py");
        std::fs::write(&script, SCRIPT)
            .map_err(|e| Error::io(format!("cannot write {}", script.display()), e))?;
        let mut command = Command::new(&self.python);
        command.arg(&script).arg("--request").arg(request);
        Ok((dir, command))
    }

    /// Runs one trial. `Err` for a request the Python worker cannot run, a
    /// Python without MMSeg (`Error::Environment`: which Python, what to
    /// install), a config it cannot load and an interpreter that cannot
    /// start; everything else is the report's status.
    pub fn trial(&self, request: &TrialRequest, timeout: Option<Duration>) -> Result<TrialReport> {
        let (_dir, mut command) = self.command(&request.to_python_request()?)?;
        if let Some(n) = request.threads {
            command.env("OMP_NUM_THREADS", n.to_string());
        }
        let run = run_child(command, &self.python, timeout)?;
        if run.timed_out {
            let secs = timeout.map_or(0, |t| t.as_secs());
            return Ok(with_python_marks(TrialReport::unanswered(
                request,
                TrialStatus::Timeout,
                format!("the Python worker gave no result within {secs} s; it was stopped"),
            )));
        }
        let code = run.status.and_then(|s| s.code());
        if code == Some(EXIT_INPUT_ERROR) {
            if let Some(refusal) = last_json_line::<Refusal>(&run.stdout) {
                return Err(self.start_error(refusal.python_worker_error));
            }
        }
        match last_json_line::<TrialReport>(&run.stdout) {
            Some(report) => Ok(report),
            None if last_json_line::<serde_json::Value>(&run.stdout).is_some() => {
                let why = String::from_utf8_lossy(&run.stdout)
                    .lines()
                    .rev()
                    .find_map(|l| {
                        serde_json::from_str::<serde_json::Value>(l.trim()).ok()?;
                        serde_json::from_str::<TrialReport>(l.trim()).err()
                    })
                    .map_or_else(String::new, |e| e.to_string());
                Ok(with_python_marks(TrialReport::unanswered(
                    request,
                    TrialStatus::Error,
                    format!(
                        "the Python worker ({}) answered with a report segtune cannot read: {why}",
                        self.python.display()
                    ),
                )))
            }
            None => {
                let death = WorkerDeath::of(run.status, &run.stderr);
                Ok(with_python_marks(TrialReport::unanswered(
                    request,
                    death.cause.status(),
                    format!("the Python worker ({}): {death}", self.python.display()),
                )))
            }
        }
    }

    /// `segtune inspect --python-worker`: the model MMSeg itself builds
    /// (the config's `custom_imports` imported), its types and parameters.
    pub fn inspect(&self, config: &Path, cfg_options: &[String]) -> Result<ModelSummary> {
        let request = TrialRequest {
            cfg_options: cfg_options.to_vec(),
            ..TrialRequest::new(config)
        };
        let (_dir, command) = self.command(&python_request(&request, true))?;
        let run = run_child(command, &self.python, Some(INSPECT_DEADLINE))?;
        if run.timed_out {
            return Err(Error::environment(format!(
                "the Python worker ({}) did not build the model within {} s; it was stopped",
                self.python.display(),
                INSPECT_DEADLINE.as_secs()
            )));
        }
        if let Some(refusal) = last_json_line::<Refusal>(&run.stdout) {
            return Err(self.start_error(refusal.python_worker_error));
        }
        last_json_line::<ModelSummary>(&run.stdout).ok_or_else(|| {
            Error::environment(format!(
                "the Python worker ({}) gave no inspection: {}",
                self.python.display(),
                WorkerDeath::of(run.status, &run.stderr)
            ))
        })
    }

    fn start_error(&self, failure: StartFailure) -> Error {
        match failure.kind {
            StartFailureKind::MissingMmseg => Error::environment(missing_mmseg_message(
                &self.python,
                &failure.missing,
                &failure.message,
            )),
            StartFailureKind::Config | StartFailureKind::Device => Error::Input(failure.message),
            StartFailureKind::Environment => Error::environment(failure.message),
        }
    }
}

/// What to tell a user whose Python lacks MMSeg: which Python, what it
/// cannot import, the pip line.
fn missing_mmseg_message(python: &Path, missing: &[String], detail: &str) -> String {
    let what = if missing.is_empty() {
        format!("cannot import MMSegmentation ({detail})")
    } else {
        format!("cannot import {}", missing.join(", "))
    };
    format!(
        "the Python worker runs MMSeg (MMSegmentation) itself, but {} {what}; install it there \
         with `{} -m {MMSEG_PIP}` (for MMSeg's CUDA ops, mmcv==2.1.0 instead of mmcv-lite), or \
         name another interpreter with --python",
        python.display(),
        python.display()
    )
}

/// The last line of `stdout` that parses as a `T` (MMSeg or a user's
/// module may print lines of their own before the worker's answer).
fn last_json_line<T: serde::de::DeserializeOwned>(stdout: &[u8]) -> Option<T> {
    String::from_utf8_lossy(stdout)
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line.trim()).ok())
}

/// `request` as the script reads it.
fn python_request(request: &TrialRequest, inspect: bool) -> String {
    let record_ops = if request.op_trace == OpTrace::Meta {
        crate::trial::kernel_calls::RECORDED_OPS
    } else {
        &[]
    };
    serde_json::to_string(&PythonRequest {
        trial: request,
        inspect,
        record_ops,
    })
    .expect("a request serialises")
}

/// A report the Python worker never wrote, marked as its.
fn with_python_marks(mut report: TrialReport) -> TrialReport {
    report.worker = crate::trial::WorkerKind::Python;
    report
}

/// What the Python worker reads (`--request`): the [`TrialRequest`] as every
/// worker reads it, and what only the script needs beside it.
#[derive(serde::Serialize)]
struct PythonRequest<'a> {
    #[serde(flatten)]
    trial: &'a TrialRequest,
    /// Build the model only, and answer a `ModelSummary`.
    inspect: bool,
    /// The ops whose calls an op-level trace records with their arguments
    /// (the native worker's list).
    record_ops: &'a [&'a str],
}

impl TrialRequest {
    /// The Python worker's `--request` text for this request, or the
    /// settings it cannot honour, by name.
    pub fn to_python_request(&self) -> Result<String> {
        let refused = self.python_refusals();
        if !refused.is_empty() {
            return Err(Error::Input(format!(
                "the Python worker runs MMSeg's own training step on one device with the torch \
                 installed in that Python; it cannot take {}",
                refused.join(", ")
            )));
        }
        Ok(python_request(self, false))
    }

    /// The request's settings that only the native worker implements.
    fn python_refusals(&self) -> Vec<&'static str> {
        let mut refused = Vec::new();
        let mut refuse = |set: bool, what: &'static str| {
            if set {
                refused.push(what);
            }
        };
        refuse(self.mode != RunMode::Train, "--mode infer");
        refuse(self.setup.gpus != 1, "--gpus (DDP's buckets)");
        refuse(self.setup.torch != TorchVersion::NEWEST, "--torch/--stack");
        refuse(
            self.setup.mmcv != crate::kinds::MmcvVersion::NEWEST,
            "--mmcv (the Python worker runs the mmcv it imports)",
        );
        refuse(
            self.as_cuda && self.amp != crate::kinds::Amp::Off,
            "--as-cuda with --amp (CUDA's autocast rules on the CPU)",
        );
        refuse(
            self.as_cuda && self.device != crate::kinds::DeviceChoice::Cpu,
            "--as-cuda on a GPU",
        );
        refuse(
            self.op_trace == OpTrace::Cpu,
            "--op-trace cpu (its op-level traces run on meta kernels)",
        );
        refuse(
            self.op_trace == OpTrace::Meta && self.device != crate::kinds::DeviceChoice::Cpu,
            "--op-trace meta on a GPU",
        );
        refuse(
            self.trace_out.is_some() && self.device != crate::kinds::DeviceChoice::Cpu,
            "--trace-out on a GPU (the trace is the CPU allocator's)",
        );
        refuse(self.cpu_cap_bytes.is_some(), "--cpu-cap");
        refuse(self.vram_budget_bytes.is_some(), "--vram");
        refuse(self.cudnn_benchmark.is_some(), "--cudnn-benchmark");
        // mmengine's autocast asserts bf16 on the CPU (mmengine/runner/amp.py).
        refuse(
            self.amp == crate::kinds::Amp::Fp16 && self.device == crate::kinds::DeviceChoice::Cpu,
            "--amp fp16 on the CPU (MMEngine's CPU autocast takes bf16 only)",
        );
        refused
    }
}

#[cfg(test)]
#[path = "python_worker_tests.rs"]
mod tests;
