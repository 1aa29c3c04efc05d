//! The evaluator of a search's predictions: how each candidate's step is
//! traced (its config, knobs and accumulation, the trace's threads and
//! deadline), the trace cache and the aligned-pair extrapolation wired in,
//! and how many traces run side by side.

use super::{Evaluator, Peek, PredictedEvaluator, StepKey, Tracer};
use crate::kinds::{RunMode, Switch, TrainingSetup};
use crate::predict::estimate::{BatchLayout, KernelSetup};
use crate::predict::step_trace::trace_deadline;
use crate::predict::{trace_step_cached, Budget, StepToTrace, TraceKind};
use crate::search::run::SearchRequest;
use crate::search::space;
use crate::worker::Worker;
use std::path::PathBuf;
use std::time::Duration;

/// The evaluator of predictions: CPU traces (op-level on meta by default)
/// replayed through the caching allocator model, of training steps or, for
/// an inference search, of test steps.
pub fn predictor(
    request: &SearchRequest,
    worker: &Worker,
    budget: &Budget,
    setup: TrainingSetup,
    layout: BatchLayout,
    side_by_side: usize,
) -> Box<dyn Evaluator> {
    let steps = CandidateSteps {
        config: request.config.clone(),
        options: request.cfg_options.clone(),
        threads: request
            .run
            .threads
            .unwrap_or_else(|| default_trace_threads(&request.run.placement, side_by_side)),
        gt_segments: request.run.gt_segments,
        setup,
        kind: request.run.trace,
        mode: request.mode,
        timeout: request.run.trace_timeout,
        python: request.run.python.clone(),
    };
    let mode = request.mode;
    let traced = (
        steps.clone(),
        worker.clone(),
        request.run.trace_cache.clone(),
    );
    let tracer: Tracer = Box::new(move |key: StepKey| {
        let (steps, worker, cache) = &traced;
        let traced = steps.with(key, |step| {
            trace_step_cached(worker, step, cache.as_deref())
        });
        match traced {
            // Values that decide shapes (mask heads' matching, a custom
            // op) are unknown on meta kernels: MMSeg's step then runs on
            // the CPU, every allocation counted (as `estimate` does).
            Err(crate::error::Error::Trial(_))
                if steps.python.is_some() && steps.kind == TraceKind::Meta =>
            {
                let on_cpu = CandidateSteps {
                    kind: TraceKind::CpuAllocator,
                    ..steps.clone()
                };
                on_cpu.with(key, |step| {
                    trace_step_cached(worker, step, cache.as_deref())
                })
            }
            traced => traced,
        }
    });
    // Steps another search traced (an atlas's other GPUs): what the
    // prediction from an aligned pair may use without tracing.
    let peek: Option<Peek> = request.run.trace_cache.clone().map(|cache| {
        let worker = worker.clone();
        Box::new(move |key: StepKey| steps.with(key, |step| cache.peek(&cache.key(&worker, step)?)))
            as Peek
    });
    // The flags MMEngine sets from the config decide cuDNN's workspaces.
    let cfg = crate::config::resolve(&request.config, &request.cfg_options).ok();
    let flag = |f: fn(&crate::config::Dict) -> bool| cfg.as_ref().is_some_and(f);
    let kernels = KernelSetup {
        torch: setup.torch,
        amp: space::Amp::Off,
        cudnn_benchmark: request
            .run
            .cudnn_benchmark
            .unwrap_or_else(|| flag(crate::trial::cudnn_flags::cudnn_benchmark)),
        cudnn_deterministic: flag(crate::trial::cudnn_flags::cudnn_deterministic),
    };
    let evaluator = PredictedEvaluator::new(
        budget.clone(),
        tracer,
        request.run.trace != TraceKind::CpuAllocator,
        layout,
    )
    .with_kernels(kernels)
    .with_gpus(setup.gpus);
    // Op-level traces of training steps: a candidate that accumulates is
    // predicted from the pair of batch 2 and 4 where the two align and
    // were traced already.
    let evaluator = if mode == RunMode::Train {
        evaluator.extrapolating_aligned_pairs(peek)
    } else {
        evaluator
    };
    let evaluator = if setup.torch.has(Switch::ExpandableSegments) {
        evaluator
    } else {
        evaluator.without_expandable_segments()
    };
    Box::new(match mode {
        RunMode::Train => evaluator,
        RunMode::Infer => evaluator.for_inference(),
    })
}

/// How a search's candidates' steps are traced: the config and the
/// settings every trace shares.
#[derive(Clone)]
struct CandidateSteps {
    config: PathBuf,
    options: Vec<String>,
    threads: i32,
    gt_segments: Option<i64>,
    setup: TrainingSetup,
    kind: TraceKind,
    mode: RunMode,
    timeout: Option<Duration>,
    /// `--python-worker`: MMSeg's own step traced in this Python.
    python: Option<crate::worker::python_worker::PythonWorker>,
}

impl CandidateSteps {
    /// `f` on the step of a candidate: its batch, crop, precision, model
    /// knobs, and whether it accumulates gradients.
    fn with<R>(&self, key: StepKey, f: impl FnOnce(&StepToTrace) -> R) -> R {
        let mut cfg_options = space::options_with_knobs(&self.options, key.knobs);
        if self.mode == RunMode::Train {
            // The candidate's accumulation, not the recipe's: 2 stands for
            // any above 1 (see `Tracer`).
            cfg_options.push(format!(
                "optim_wrapper.accumulative_counts={}",
                if key.accumulates { 2 } else { 1 }
            ));
        }
        f(&StepToTrace {
            config: &self.config,
            cfg_options: &cfg_options,
            batch_size: key.batch,
            crop: key.crop,
            amp: key.amp,
            threads: self.threads,
            gt_segments: self.gt_segments,
            setup: self.setup,
            kind: self.kind,
            mode: self.mode,
            deadline: self
                .timeout
                .unwrap_or_else(|| trace_deadline(self.kind, key.batch, key.crop)),
            python: self.python.as_ref(),
        })
    }
}

/// CPU threads of one traced step: on Slurm the job's CPUs
/// (`--cpus-per-trial`, else 1); here half the cores, shared by the
/// `side_by_side` traces that run at once.
fn default_trace_threads(placement: &crate::search::Placement, side_by_side: usize) -> i32 {
    if let Some(slurm) = &placement.slurm {
        return slurm.cpus_per_trial.map_or(1, |c| c.min(4096) as i32);
    }
    (crate::trial::host_cores() / 2 / side_by_side.max(1) as i32).max(1)
}

/// Traces run at once here: the slots `--devices` or `--max-parallel`
/// give; where neither is given, one per core (at most 4) for meta traces,
/// which take a core each and little memory. The strategy fills them with
/// its independent groups (each precision's binary search), so the winner
/// and the candidates tried are those of one trace at a time.
pub(crate) fn trace_slots(request: &SearchRequest, slots: usize) -> usize {
    let placement = &request.run.placement;
    if placement.slurm.is_some()
        || placement.devices.is_some()
        || request.run.trace != TraceKind::Meta
    {
        return slots;
    }
    let here = placement
        .local_traces
        .unwrap_or_else(|| crate::trial::host_cores().clamp(1, 4) as usize);
    slots.max(here.max(1))
}
