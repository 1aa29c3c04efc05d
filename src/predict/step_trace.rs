//! A training step traced on the CPU for a prediction: the `segtune-torch`
//! worker runs one warm-up and one measured step of the config, standing in
//! for CUDA (its autocast rules, GradScaler, foreach optimizers), and writes
//! every allocation and free to a temporary file read back here.

use super::trace_cache::Lookup;
use crate::error::{Error, Result};
use crate::kinds::{Amp, RunMode, TrainingSetup};
use crate::trial::kernel_calls::KernelCall;
use crate::trial::trace::{self, TraceEvent};
use crate::trial::{OpTrace, TrialRequest, TrialStatus};
use crate::worker::python_worker::{self, PythonWorker};
use crate::worker::Worker;
use std::path::Path;
use std::time::Duration;

/// The trace of one step and what the worker measured with it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TracedStep {
    /// Every CPU allocation and free from the model build on.
    pub events: Vec<TraceEvent>,
    /// The calls among them whose CUDA kernels take scratch memory or choose
    /// an algorithm (op-level traces only).
    pub kernel_calls: Vec<KernelCall>,
    /// The counting allocator's peak over the measured step.
    pub cpu_peak_bytes: i64,
    /// Forward FLOPs of the step.
    pub forward_flops: f64,
    /// FLOPs that gradient checkpointing recomputed in the backward.
    pub recompute_flops: f64,
    /// The model parts the events' scopes name, by id.
    pub model_scopes: Vec<String>,
    /// Every op of the step with its bytes (op-level traces of the native
    /// worker; empty otherwise): what the step-time model times.
    #[serde(default)]
    pub ops: Vec<crate::trial::op_work::OpWork>,
}

/// How a step is traced for a prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceKind {
    /// The storages each ATen op returns, with meta kernels: no compute and
    /// no host memory for tensors (the default).
    #[default]
    Meta,
    /// The same op-level trace with CPU kernels: for tests and comparison.
    Cpu,
    /// Every allocation of the CPU allocator, kernel scratch included (what
    /// segtune traced before op-level traces); batches above 3 are
    /// extrapolated from 2 and 3.
    CpuAllocator,
}

crate::named::named_enum!(TraceKind, "a trace kind", {
    Meta => "meta",
    Cpu => "cpu",
    CpuAllocator => "cpu-allocator",
});

impl TraceKind {
    fn op_trace(self) -> OpTrace {
        match self {
            TraceKind::Meta => OpTrace::Meta,
            TraceKind::Cpu => OpTrace::Cpu,
            TraceKind::CpuAllocator => OpTrace::Off,
        }
    }
}

/// What to trace: the config and the step's shape.
#[derive(Debug, Clone)]
pub struct StepToTrace<'a> {
    pub config: &'a Path,
    pub cfg_options: &'a [String],
    pub batch_size: i64,
    pub crop: (i64, i64),
    pub amp: Amp,
    /// CPU threads of the traced step.
    pub threads: i32,
    /// Classes per synthetic label map (see `TrialRequest::gt_segments`).
    pub gt_segments: Option<i64>,
    pub setup: TrainingSetup,
    pub kind: TraceKind,
    /// A training step, or an inference (test) step.
    pub mode: RunMode,
    /// How long the worker may take before it is stopped and the trace
    /// counts as timed out: `--trace-timeout` as given, else
    /// [`default_deadline`]. Used as it is, never extended.
    pub deadline: Duration,
    /// Trace MMSeg's own step in this Python instead (`kind` meta: its
    /// `TorchDispatchMode` on meta kernels; or cpu-allocator: its counting
    /// allocator).
    pub python: Option<&'a PythonWorker>,
}

/// How long a traced step may take before its worker is stopped: a stopped
/// or wedged worker must not hang an estimate or a search. Meta traces do
/// no arithmetic (a second for SegFormer-B0, tens of seconds for the largest
/// Mask2Former on two cores); CPU traces compute the step. Both grow with the
/// pixels of the batch, so each has a floor for the worker's start and the
/// model's build plus a share per megapixel of batch x crop, ten times or
/// more what the slowest model took here (`--trace-timeout` overrides it).
pub fn trace_deadline(kind: TraceKind, batch_size: i64, crop: (i64, i64)) -> Duration {
    let megapixels = (batch_size.max(1) as f64) * (crop.0.max(1) * crop.1.max(1)) as f64 / 1e6;
    let (floor_s, per_megapixel_s) = match kind {
        TraceKind::Meta => (300.0, 120.0),
        TraceKind::Cpu | TraceKind::CpuAllocator => (1800.0, 1800.0),
    };
    Duration::from_secs_f64((floor_s + per_megapixel_s * megapixels).min(7.0 * 86_400.0))
}

/// segtune's own deadline for a traced step when `--trace-timeout` does not
/// give one: [`trace_deadline`], and for the Python worker (`python`) the
/// interpreter's start besides ([`python_worker::START_ALLOWANCE`]). A
/// deadline the user gave gets no allowance: it is the deadline.
pub fn default_deadline(
    kind: TraceKind,
    batch_size: i64,
    crop: (i64, i64),
    python: bool,
) -> Duration {
    let deadline = trace_deadline(kind, batch_size, crop);
    if python {
        deadline + python_worker::START_ALLOWANCE
    } else {
        deadline
    }
}

/// The warm-up steps before a traced training step: one; with gradient
/// accumulation (`n` micro-steps per optimizer step), `2n - 1`, so that the
/// traced step is the last micro-step of a cycle that follows a first
/// optimizer step: the optimizer state exists, and the cycle's gradients
/// are held through its forward (the cycle's largest micro-step). Tracing
/// step 2 of a 2-step cycle instead leaves the state out (BEiT-large's
/// recipe: 3.3 GiB of AdamW moments).
pub fn warmup_steps_for(accumulation: i64) -> usize {
    (2 * accumulation.max(1) - 1) as usize
}

/// The gradient accumulation of a config's optim wrapper
/// (`accumulative_counts`, 1 when absent or when the config does not
/// resolve: the worker then says why).
pub fn config_accumulation(config: &Path, cfg_options: &[String]) -> i64 {
    crate::config::resolve(config, cfg_options)
        .ok()
        .map_or(1, |cfg| crate::config::train_loop::accumulation(&cfg))
}

/// [`trace_step`], answered from `cache` when it holds the step (and the
/// new trace stored there when not, over any entry that did not verify).
pub fn trace_step_cached(
    worker: &Worker,
    step: &StepToTrace,
    cache: Option<&super::trace_cache::TraceCache>,
) -> Result<TracedStep> {
    let Some(cache) = cache else {
        return trace_step(worker, step);
    };
    let key = cache.key(worker, step);
    if let Some(key) = key.as_deref() {
        // A trace of the key wins over a `.failed` marker beside it; an
        // entry that is not this key's (copied over, edited) is a miss.
        match cache.lookup(key) {
            Lookup::Trace(found) => return Ok(found),
            Lookup::Failed(reason) => return Err(Error::Trial(reason)),
            Lookup::Miss => {}
        }
    }
    let traced = trace_step(worker, step);
    match (&key, &traced) {
        (Some(key), Ok(step)) => cache.put(key, step),
        // A step that cannot run (a batch of one under BatchNorm, a crop
        // the model refuses) fails alike every time: another GPU's search
        // takes the verdict. What the host cut short is traced again.
        (Some(key), Err(Error::Trial(message))) => cache.put_failure(key, message),
        _ => {}
    }
    traced
}

/// Traces the warm-up steps and a measured training step on the CPU in the
/// worker.
pub fn trace_step(worker: &Worker, step: &StepToTrace) -> Result<TracedStep> {
    let dir =
        crate::worker::LiveTempDir::new().map_err(|e| Error::io("no temporary directory", e))?;
    let trace_path = dir.path().join("step.trace");
    let warmup_steps = match step.mode {
        RunMode::Train => warmup_steps_for(config_accumulation(step.config, step.cfg_options)),
        RunMode::Infer => 1,
    };
    let request = TrialRequest {
        cfg_options: step.cfg_options.to_vec(),
        batch_size: step.batch_size,
        crop: step.crop,
        amp: step.amp,
        warmup_steps,
        measured_steps: 1,
        ignore_fraction: 0.0,
        gt_segments: step.gt_segments,
        threads: Some(step.threads),
        trace_out: Some(trace_path.clone()),
        setup: step.setup,
        as_cuda: true,
        op_trace: step.kind.op_trace(),
        mode: step.mode,
        ..TrialRequest::new(step.config)
    };
    let report = match step.python {
        Some(python) => {
            if step.kind == TraceKind::Cpu {
                return Err(Error::Input(
                    "the Python worker traces on meta kernels (--trace meta) or every CPU \
                     allocation (--trace cpu-allocator), not op outputs on CPU kernels \
                     (--trace cpu)"
                        .into(),
                ));
            }
            python.trial(&request, Some(step.deadline))?
        }
        None => worker.trial(&request, Some(step.deadline))?,
    };
    if report.status != TrialStatus::Ok {
        let message = format!(
            "the traced {} step failed ({}): {}",
            if step.kind == TraceKind::Meta {
                "meta"
            } else {
                "CPU"
            },
            report.status.name(),
            report.message.unwrap_or_default()
        );
        // A trace that the host cut short (its RAM, a kill, a hang) says
        // nothing about the step: no verdict, tried again.
        return Err(if report.status.is_environment() {
            Error::Unanswered {
                status: report.status,
                message,
            }
        } else {
            Error::Trial(message)
        });
    }
    let text = std::fs::read_to_string(&trace_path)
        .map_err(|e| Error::io("no trace from the worker", e))?;
    Ok(TracedStep {
        events: trace::from_text(&text).map_err(|e| Error::Trial(e.to_string()))?,
        kernel_calls: trace::calls_from_text(&text).map_err(|e| Error::Trial(e.to_string()))?,
        cpu_peak_bytes: report.peak_bytes.unwrap_or(0),
        forward_flops: report.forward_flops,
        recompute_flops: report.recompute_flops,
        model_scopes: report.model_scopes,
        ops: trace::work_from_text(&text).map_err(|e| Error::Trial(e.to_string()))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start allowance is segtune's, for its own default deadline with
    /// the Python worker; a deadline the user gave is used as it is.
    #[test]
    fn the_start_allowance_extends_only_segtunes_own_deadline() {
        let native = default_deadline(TraceKind::Meta, 2, (512, 512), false);
        assert_eq!(native, trace_deadline(TraceKind::Meta, 2, (512, 512)));
        let python = default_deadline(TraceKind::Meta, 2, (512, 512), true);
        assert_eq!(python, native + python_worker::START_ALLOWANCE);
    }

    #[test]
    fn a_python_trace_stops_at_the_deadline_the_user_gave() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python");
        std::fs::write(&python, "#!/bin/sh\nexec sleep 3600\n").unwrap();
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
        let python = PythonWorker::at(&python);
        let step = StepToTrace {
            config: Path::new("cfg.py"),
            cfg_options: &[],
            batch_size: 2,
            crop: (64, 64),
            amp: Amp::Off,
            threads: 1,
            gt_segments: None,
            setup: TrainingSetup::default(),
            kind: TraceKind::Meta,
            mode: RunMode::Train,
            deadline: Duration::from_secs(1),
            python: Some(&python),
        };
        let started = std::time::Instant::now();
        let err = trace_step(&Worker::at("/nonexistent"), &step).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(11));
        assert!(
            matches!(&err, Error::Unanswered { status: TrialStatus::Timeout, message } if message.contains("within 1 s")),
            "{err:?}"
        );
    }
}
