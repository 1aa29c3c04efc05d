//! `segtune estimate` as a library call: the recipe's batch, crop and
//! precision (or the given ones), one or two traced steps (batches above 3
//! are extrapolated from 2 and 3), and the estimate for the GPU.

use super::allocator::AllocatorSettings;
use super::budget::Gpu;
use super::estimate::{
    self, cudnn_benchmark, cudnn_deterministic, recipe_batch_size, recipe_crop, Estimate,
    KernelSetup, TracedInput,
};
use super::extrapolate::{extrapolate, TRACED_BATCHES};
use super::speed::{Card, ScheduleTime, SpeedSetup, StepWork};
use super::step_trace::{default_deadline, trace_step, StepToTrace, TraceKind};
use crate::config::{self, Dict, Value};
use crate::error::{Error, Result};
use crate::kinds::torch_version::SWITCHES;
use crate::kinds::{Amp, RunMode, Switch, TorchVersion, TrainingSetup};
use crate::models::decode_heads::DECODE_HEAD_FACTS;
use crate::models::registry::facts_of;
use crate::worker::python_worker::PythonWorker;
use crate::worker::Worker;
use std::path::PathBuf;

/// What to predict.
#[derive(Debug, Clone)]
pub struct EstimateRequest {
    pub config: PathBuf,
    pub cfg_options: Vec<String>,
    pub gpu: Gpu,
    /// Default: the recipe's `train_dataloader.batch_size`.
    pub batch_size: Option<i64>,
    /// Default: the recipe's crop.
    pub crop: Option<(i64, i64)>,
    /// Default: the recipe's (`AmpOptimWrapper` means its dtype).
    pub amp: Option<Amp>,
    /// CPU threads of the traced step (default: every core).
    pub threads: Option<i32>,
    /// Classes per synthetic label map (see `TrialRequest::gt_segments`).
    pub gt_segments: Option<i64>,
    pub setup: TrainingSetup,
    /// Why `setup.torch` is the release predicted for (said in the notes).
    pub torch_source: String,
    pub trace: TraceKind,
    /// The caching allocator's settings (`PYTORCH_CUDA_ALLOC_CONF`).
    pub alloc_conf: AllocatorSettings,
    /// A training step, or an inference (test) step.
    pub mode: RunMode,
    /// `--cudnn-benchmark on|off` (default: the config's
    /// `env_cfg.cudnn_benchmark`).
    pub cudnn_benchmark: Option<bool>,
    /// `--trace-timeout`: each traced step's deadline (default: scaled from
    /// the step, see [`crate::predict::step_trace::trace_deadline`]).
    pub trace_timeout: Option<std::time::Duration>,
    /// Trace MMSeg's own step in this Python (the Python worker) instead of
    /// segtune's rebuild: for models segtune does not build. Its trace is
    /// every CPU allocation ([`TraceKind::CpuAllocator`], whatever `trace`
    /// says).
    pub python: Option<PythonWorker>,
}

/// The recipe's mixed precision: `AmpOptimWrapper`'s dtype, if it has one.
pub fn recipe_amp(cfg: &Dict) -> Option<Amp> {
    cfg.get("optim_wrapper")
        .filter(|o| o.get_path("type").and_then(Value::as_str) == Some("AmpOptimWrapper"))
        .map(|o| {
            if o.get_path("dtype").and_then(Value::as_str) == Some("bfloat16") {
                Amp::Bf16
            } else {
                Amp::Fp16
            }
        })
}

/// Predicts the GPU memory of the request's training step.
pub fn estimate_config(request: &EstimateRequest, worker: &Worker) -> Result<Estimate> {
    let cfg = config::resolve(&request.config, &request.cfg_options)?;
    let (batch, crop, amp) = step_setting(request, &cfg)?;
    let traced = trace_for_estimate(request, worker, batch, crop, amp)?;
    let kernels = KernelSetup {
        torch: request.setup.torch,
        amp,
        cudnn_benchmark: request
            .cudnn_benchmark
            .unwrap_or_else(|| cudnn_benchmark(&cfg)),
        cudnn_deterministic: cudnn_deterministic(&cfg),
    };
    let mut e = estimate::estimate(
        TracedInput {
            events: &traced.events,
            calls: &traced.calls,
            model_scopes: &traced.scopes,
            cpu_trace_peak_bytes: traced.cpu_peak,
        },
        &request.gpu,
        batch,
        crop,
        kernels,
        request.alloc_conf,
        &estimate::BatchLayout::of(&cfg).device_batch(batch, crop, request.mode),
    );
    add_notes(&mut e, request, &cfg, batch, &traced);
    // A family whose published runs held more than its trace, for reasons
    // not found: its range covers them (after the release's note).
    if let Some(backbone) = cfg
        .get("model")
        .and_then(|m| m.get_path("backbone.type"))
        .and_then(Value::as_str)
    {
        super::unexplained::widen(&mut e, backbone);
    }
    if let Some(work) = &traced.work {
        add_step_time(&mut e, request, &cfg, work, (batch, crop, amp));
    }
    Ok(e)
}

/// The request's step as the step-time model times it, and what it is run
/// with (for fitting the model's efficiencies: `tests/speed_logs.rs`).
pub fn step_work(
    request: &EstimateRequest,
    worker: &Worker,
) -> Result<Option<(StepWork, SpeedSetup)>> {
    let cfg = config::resolve(&request.config, &request.cfg_options)?;
    let (batch, crop, amp) = step_setting(request, &cfg)?;
    let traced = trace_for_estimate(request, worker, batch, crop, amp)?;
    Ok(traced
        .work
        .map(|w| (w, speed_setup(request, &cfg, (batch, crop, amp)))))
}

fn speed_setup(
    request: &EstimateRequest,
    cfg: &Dict,
    (batch, crop, amp): (i64, (i64, i64), Amp),
) -> SpeedSetup {
    let accumulation = if request.mode == RunMode::Train {
        config::train_loop::accumulation(cfg)
    } else {
        1
    };
    SpeedSetup::of_step(
        request.mode,
        amp,
        request.setup.gpus,
        accumulation,
        batch,
        crop,
    )
}

/// The step's time on the request's card, and the recipe's schedule at it.
fn add_step_time(
    e: &mut Estimate,
    request: &EstimateRequest,
    cfg: &Dict,
    work: &StepWork,
    (batch, crop, amp): (i64, (i64, i64), Amp),
) {
    let train = request.mode == RunMode::Train;
    let setup = speed_setup(request, cfg, (batch, crop, amp));
    let t = work.time(&Card::of_gpu(&request.gpu), &setup);
    e.speed.predicted_step_seconds = Some(t.step_s);
    e.speed.predicted_step_seconds_low = Some(t.low_s);
    e.speed.predicted_step_seconds_high = Some(t.high_s);
    e.speed.predicted_images_per_s = Some(t.images_per_s(batch));
    e.speed.predicted_step_time = Some(t);
    if train {
        e.speed.predicted_schedule =
            config::train_loop::max_iters(cfg).map(|iters| ScheduleTime::of(iters, &t));
    }
}

/// The step to predict: the batch, crop and precision given or the
/// recipe's, after refusing (before any worker runs, as the model's error)
/// a model segtune cannot build, and an allocator setting the release lacks.
fn step_setting(request: &EstimateRequest, cfg: &config::Dict) -> Result<(i64, (i64, i64), Amp)> {
    let amp = request.amp.or(recipe_amp(cfg)).unwrap_or(Amp::Off);
    let model_error = |source| Error::Model {
        source,
        config: request.config.clone(),
    };
    // The Python worker builds the model with MMSeg itself.
    if request.python.is_none() {
        crate::models::check_supported(cfg).map_err(model_error)?;
    }
    if request.python.is_some() && request.mode == RunMode::Infer {
        return Err(Error::Input(
            "the Python worker traces training steps only (not --mode infer)".into(),
        ));
    }
    if request.python.is_some() && amp != Amp::Off {
        return Err(Error::Input(format!(
            "the Python worker traces MMSeg's step on the CPU, whose autocast is not CUDA's: \
             it predicts fp32 only (--amp off), not {amp}; `segtune trial --python-worker \
             --device cuda --amp {amp}` measures it on a GPU"
        )));
    }
    if request.mode == RunMode::Infer {
        if let Some(model) = cfg.get("model").and_then(Value::as_dict) {
            crate::models::segmentors::inference::check_inference(model).map_err(model_error)?;
        }
    }
    let batch = request
        .batch_size
        .or_else(|| recipe_batch_size(cfg))
        .ok_or_else(|| {
            Error::Input("the config has no train_dataloader.batch_size; pass --batch-size".into())
        })?;
    let crop = request
        .crop
        .or_else(|| recipe_crop(cfg))
        .ok_or_else(|| Error::Input("the config has no crop size; pass --crop HxW".into()))?;
    let torch = request.setup.torch;
    if request.alloc_conf.expandable_segments && !torch.has(Switch::ExpandableSegments) {
        return Err(Error::Input(format!(
            "--alloc-conf expandable_segments:True: PyTorch {torch} has no such setting ({} from {}, {})",
            Switch::ExpandableSegments.spec().name,
            Switch::ExpandableSegments.spec().from,
            Switch::ExpandableSegments.spec().source
        )));
    }
    Ok((batch, crop, amp))
}

/// The step's trace: its events, kernel calls, the CPU trace's peak
/// (`None` when extrapolated) and the model's scope names.
struct EstimateTrace {
    events: Vec<crate::trial::trace::TraceEvent>,
    calls: Vec<crate::trial::kernel_calls::KernelCall>,
    cpu_peak: Option<i64>,
    scopes: Vec<String>,
    /// The kind traced (the request's, or the Python worker's fallback).
    kind: TraceKind,
    /// Why the Python worker's meta trace failed, when it fell back.
    meta_failure: Option<String>,
    /// The step's kernels, for its time (none without every op's work).
    work: Option<StepWork>,
}

/// Traces the step at `batch`; a CPU-allocator trace of a batch above 3 is
/// extrapolated from two small ones (op-level traces cost little: any
/// batch is traced as it is).
fn trace_for_estimate(
    request: &EstimateRequest,
    worker: &Worker,
    batch: i64,
    crop: (i64, i64),
    amp: Amp,
) -> Result<EstimateTrace> {
    match trace_as(request, worker, batch, crop, amp, request.trace) {
        // Values that decide shapes (mask heads' matching, a custom op)
        // are unknown on meta kernels: the Python worker then runs MMSeg's
        // step on the CPU, and the estimate says so.
        Err(Error::Trial(why)) if request.python.is_some() && request.trace == TraceKind::Meta => {
            let mut traced = trace_as(request, worker, batch, crop, amp, TraceKind::CpuAllocator)?;
            traced.meta_failure = Some(why);
            Ok(traced)
        }
        traced => traced,
    }
}

/// [`trace_for_estimate`] with one trace kind.
fn trace_as(
    request: &EstimateRequest,
    worker: &Worker,
    batch: i64,
    crop: (i64, i64),
    amp: Amp,
    kind: TraceKind,
) -> Result<EstimateTrace> {
    let threads = request.threads.unwrap_or_else(crate::trial::host_cores);
    let trace = |batch_size| {
        trace_step(
            worker,
            &StepToTrace {
                config: &request.config,
                cfg_options: &request.cfg_options,
                batch_size,
                crop,
                amp,
                threads,
                gt_segments: request.gt_segments,
                setup: request.setup,
                kind,
                mode: request.mode,
                deadline: request.trace_timeout.unwrap_or_else(|| {
                    default_deadline(kind, batch_size, crop, request.python.is_some())
                }),
                python: request.python.as_ref(),
            },
        )
    };
    if batch <= 3 || kind != TraceKind::CpuAllocator {
        let step = trace(batch)?;
        return Ok(EstimateTrace {
            work: StepWork::from_trace(&step, amp),
            events: step.events,
            calls: step.kernel_calls,
            cpu_peak: Some(step.cpu_peak_bytes),
            scopes: step.model_scopes,
            kind,
            meta_failure: None,
        });
    }
    let (ba, bb) = TRACED_BATCHES;
    let one = trace(ba)?;
    let two = trace(bb)?;
    let work = match (
        StepWork::from_trace(&one, amp),
        StepWork::from_trace(&two, amp),
    ) {
        (Some(a), Some(b)) => StepWork::lerp((ba, &a), (bb, &b), batch),
        _ => None,
    };
    Ok(EstimateTrace {
        work,
        events: extrapolate(&one.events, &two.events, batch).map_err(Error::Trial)?,
        calls: Vec::new(),
        cpu_peak: None,
        scopes: Vec::new(),
        kind,
        meta_failure: None,
    })
}

/// The notes that say where the figures come from: the trace, DDP, the
/// PyTorch release, Mask2Former's segments, an extrapolated batch.
fn add_notes(
    e: &mut Estimate,
    request: &EstimateRequest,
    cfg: &config::Dict,
    batch: i64,
    traced: &EstimateTrace,
) {
    let extrapolated = traced.cpu_peak.is_none();
    let python = request
        .python
        .as_ref()
        .map(|p| p.python().display().to_string());
    e.notes[0] = match (traced.kind, python) {
        (TraceKind::CpuAllocator, Some(python)) => format!(
            "activations, gradients and optimizer state come from a trace of every CPU allocation of MMSeg's own training step, run by the Python worker ({python}), CPU kernels' scratch included, replayed through a model of PyTorch's CUDA caching allocator; no kernel calls are recorded, so cuDNN's workspaces and CUDA kernels' scratch are not modelled"
        ),
        (_, Some(python)) => format!(
            "activations, gradients and optimizer state come from an op-level trace of MMSeg's own training step on meta kernels, run by the Python worker ({python}: a TorchDispatchMode records the storages every ATen op returns), replayed through a model of PyTorch's CUDA caching allocator"
        ),
        (TraceKind::Meta, None) => "activations, gradients and optimizer state come from an op-level trace of the same step on meta kernels (the storages every ATen op returns, no compute), replayed through a model of PyTorch's CUDA caching allocator".into(),
        (TraceKind::Cpu, None) => "activations, gradients and optimizer state come from an op-level trace of the same step on CPU kernels (the storages every ATen op returns), replayed through a model of PyTorch's CUDA caching allocator".into(),
        (TraceKind::CpuAllocator, None) => "activations, gradients and optimizer state come from a trace of every CPU allocation of the same step (CPU kernels' scratch included), replayed through a model of PyTorch's CUDA caching allocator".into(),
    };
    if request.python.is_none() {
        e.notes.extend(config::custom_imports_note(cfg));
    }
    if request.setup.gpus > 1 {
        e.notes.push(format!(
            "per GPU of {} training data-parallel: includes DDP's gradient buckets (one more copy of the trainable parameters)",
            request.setup.gpus
        ));
    }
    e.notes.push(
        torch_note(request.setup.torch, &request.torch_source)
            + crate::kinds::mmcv_version::mmcv_note(request.setup.mmcv).as_str(),
    );
    let head = cfg
        .get("model")
        .and_then(|m| m.get_path("decode_head.type"))
        .and_then(Value::as_str);
    if head.is_some_and(|t| facts_of(DECODE_HEAD_FACTS, t).mask_classification) {
        e.notes.push(format!(
            "Mask2Former: one ground-truth segment per class present in an image; the synthetic labels hold {} (--gt-segments N|all), and mmcv's CUDA deformable attention is modelled (what it keeps for backward)",
            request
                .gt_segments
                .map_or("every class".to_string(), |n| format!("{n} classes"))
        ));
    }
    if let Some(why) = &traced.meta_failure {
        e.notes.push(format!(
            "the Python worker's meta trace could not run the step ({why}): values that decide shapes are unknown on meta kernels, so it traced every CPU allocation of the step instead"
        ));
    }
    if extrapolated {
        e.notes.push(format!("batch {batch} was extrapolated from traces at batch 2 and 3 (every step tensor is affine in the batch)"));
    }
}

/// "predicted for PyTorch X (why), with: the switches where X differs from
/// the newest release".
pub fn torch_note(torch: TorchVersion, source: &str) -> String {
    let newest = TorchVersion::NEWEST;
    let on: Vec<&str> = SWITCHES
        .iter()
        .filter(|s| torch.has(s.switch) && !newest.has(s.switch))
        .map(|s| s.what)
        .collect();
    let off: Vec<&str> = SWITCHES
        .iter()
        .filter(|s| !torch.has(s.switch) && newest.has(s.switch))
        .map(|s| s.name)
        .collect();
    let mut note = if source.is_empty() {
        format!("predicted for PyTorch {torch}")
    } else {
        format!("predicted for PyTorch {torch} ({source})")
    };
    if !on.is_empty() {
        note.push_str(&format!("; unlike {newest}: {}", on.join("; ")));
    }
    if !off.is_empty() {
        note.push_str(&format!("; not yet in {torch}: {}", off.join(", ")));
    }
    note
}
