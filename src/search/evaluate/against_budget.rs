//! One traced step replayed for a candidate against the budget: whether
//! it fits (the least it needs, with the allocator's defaults or
//! `expandable_segments:True`), the figures shown (the likeliest cuDNN
//! workspaces on this card), and its predicted images/s and step time.

use super::predicted::ReplayContext;
use crate::kinds::RunMode;
use crate::predict::allocator::AllocatorSettings;
use crate::predict::estimate::KernelSetup;
use crate::predict::kernels::cudnn::Figure;
use crate::predict::replay::{
    replay_kernels, replay_kernels_unless_out_of_memory, Kernels, ReplayInputs, ReplayResult,
};
use crate::predict::speed::{Card, SpeedSetup, StepTime, StepWork};
use crate::predict::Budget;
use crate::search::record::{CandidateStatus, Mode, TrialRecord};
use crate::search::space::{Amp, Candidate};
use crate::trial::kernel_calls::KernelCall;
use crate::trial::trace::TraceEvent;

/// Replays one step's events for `c` and compares with the budget; a
/// candidate that does not fit with the allocator's defaults is replayed
/// with `expandable_segments:True` (less fragmentation), and fits with that
/// setting if it fits then.
pub(super) fn replay_against_budget(
    budget: &Budget,
    c: &Candidate,
    traced: (&[TraceEvent], &[KernelCall]),
    speed: Speed,
    cx: ReplayContext,
) -> TrialRecord {
    let replay_with =
        |settings, verdict_only| replay_with(budget, c, traced, speed, settings, cx, verdict_only);
    let (record, beyond_capacity) = replay_with(AllocatorSettings::default(), false);
    if record.fits() || !cx.expandable_segments || beyond_capacity {
        return record;
    }
    let expandable = AllocatorSettings {
        expandable_segments: true,
        ..AllocatorSettings::default()
    };
    let (with_setting, _) = replay_with(expandable, true);
    if with_setting.fits() {
        TrialRecord {
            alloc_conf: Some(expandable.env_value()),
            ..with_setting
        }
    } else {
        record
    }
}

/// Replays one step's events for `c` under `settings` against the budget:
/// the least the step needs decides whether it fits (cuDNN falls back to
/// smaller workspaces where memory is short); the figures shown are the
/// likeliest (the workspaces cuDNN takes on this card), and where the card
/// forces slower convolutions the images/s says so. With `verdict_only`, a
/// step that does not fit has no figures. Also returns whether the step
/// needs more than the allocator's capacity under any setting
/// ([`ReplayResult::least_demand`]).
pub(super) fn replay_with(
    budget: &Budget,
    c: &Candidate,
    (events, calls): (&[TraceEvent], &[KernelCall]),
    speed: Speed,
    settings: AllocatorSettings,
    cx: ReplayContext,
    verdict_only: bool,
) -> (TrialRecord, bool) {
    let kernels = KernelSetup {
        amp: c.amp,
        ..cx.kernels
    };
    let with_calls = !calls.is_empty();
    let inputs = replay_inputs(budget, c, cx, kernels, with_calls, settings);
    let run = |figure: Figure, verdict_only: bool| -> Option<ReplayResult> {
        let model = kernels.model(
            &budget.compute_capability,
            budget.cublas_workspace_bytes,
            budget.conv_math(),
            figure,
        );
        let kernels = with_calls.then_some(Kernels {
            calls,
            model: &model,
        });
        if verdict_only {
            replay_kernels_unless_out_of_memory(events, &inputs, kernels)
        } else {
            Some(replay_kernels(events, &inputs, kernels))
        }
    };
    let out_of_memory = || {
        TrialRecord::failed(
            CandidateStatus::Oom,
            format!(
                "predicted out of memory: needs more than the usable {:.2} GiB",
                budget.usable_bytes as f64 / (1u64 << 30) as f64
            ),
            Mode::Predicted,
        )
    };
    let Some(least) = run(Figure::Least, verdict_only) else {
        return (out_of_memory(), false);
    };
    let device = least.peak_reserved + budget.cuda_context_bytes;
    let fits = !least.out_of_memory && device <= budget.usable_bytes;
    // Beyond the capacity every setting runs out of memory.
    let beyond_capacity = least.least_demand > budget.allocator_capacity();
    if verdict_only && !fits {
        return (out_of_memory(), beyond_capacity);
    }
    // Beyond the capacity the likeliest figures run out of memory too, and
    // the least are shown.
    let likely = if with_calls && !beyond_capacity {
        run(Figure::Likely, false).expect("a full replay has a result")
    } else {
        least
    };
    let shown = if likely.out_of_memory { least } else { likely };
    let flops = speed.flops;
    let (images_per_s, step_time) = predicted_speed(budget, c, cx, speed, &shown);
    let mut record = TrialRecord {
        status: CandidateStatus::Fits,
        reason: None,
        peak_allocated_bytes: Some(shown.peak_allocated),
        peak_reserved_bytes: Some(shown.peak_reserved),
        device_bytes: Some(device),
        images_per_s: Some(images_per_s),
        step_time,
        mode: Mode::Predicted,
        checkpoint_cost: (c.checkpoint && flops.0 > 0.0).then(|| flops.1 / (3.0 * flops.0)),
        predicted: None,
        alloc_conf: None,
        first_interval_allocated_bytes: None,
    };
    if !fits {
        record.status = CandidateStatus::Oom;
        record.reason = out_of_memory().reason;
    }
    (record, beyond_capacity)
}

/// What a replay of `c` starts from: the batch's device copies, cuBLAS's
/// workspace where the trace has no calls to place it, the capacity.
fn replay_inputs(
    budget: &Budget,
    c: &Candidate,
    cx: ReplayContext,
    kernels: KernelSetup,
    with_calls: bool,
    settings: AllocatorSettings,
) -> ReplayInputs {
    ReplayInputs {
        batch_copies: cx.layout.tensors(c.batch_size, c.crop, cx.mode),
        cublas_workspace: if with_calls {
            0
        } else {
            kernels.cublas_workspace(budget.cublas_workspace_bytes)
        },
        capacity: Some(budget.allocator_capacity()),
        settings,
    }
}

/// The candidate's images/s and step time on the budget's card: kernel by
/// kernel where the trace has every op's work, a roofline of the whole
/// step where it has not (the Python worker's); slower by the share of
/// convolutions the replay `shown` squeezed out of their workspaces.
fn predicted_speed(
    budget: &Budget,
    c: &Candidate,
    cx: ReplayContext,
    speed: Speed,
    shown: &ReplayResult,
) -> (f64, Option<StepTime>) {
    let Speed { flops, bytes, work } = speed;
    let passes = if cx.mode == RunMode::Infer { 1.0 } else { 3.0 };
    let slowdown = shown
        .kernels
        .map_or(1.0, |k| k.step_slowdown(passes * flops.0 + flops.1));
    match work {
        Some(w) => {
            let t = w
                .time(&Card::of_budget(budget), &speed_setup(c, cx))
                .scaled(slowdown);
            (t.images_per_s(c.batch_size), Some(t))
        }
        None => (
            roofline_images_per_s(budget, c, flops, bytes, cx.mode) / slowdown,
            None,
        ),
    }
}

/// Step time from FLOPs and bytes against the GPU's peak rates (an
/// estimate for ranking only: 40% of peak FLOPs, 60% of bandwidth):
/// the forward, a backward of twice its FLOPs, and the forward that
/// gradient checkpointing runs again in the backward.
fn roofline_images_per_s(
    budget: &Budget,
    c: &Candidate,
    flops: (f64, f64),
    bytes: f64,
    mode: RunMode,
) -> f64 {
    let (flops, recompute) = flops;
    // An inference step is the forward alone.
    let passes = if mode == RunMode::Infer { 1.0 } else { 3.0 };
    let tflops = match c.amp {
        Amp::Off => budget.fp32_tflops,
        Amp::Fp16 => budget.fp16_tflops,
        Amp::Bf16 => budget.bf16_tflops,
    };
    let compute = (passes * flops + recompute) / (tflops.max(0.1) * 1e12 * 0.4);
    let memory = 2.0 * bytes / (budget.bandwidth_gbs.max(1.0) * 1e9 * 0.6);
    c.batch_size as f64 / (compute + memory)
}

/// What a candidate's step time is predicted from: its FLOPs and bytes (a
/// roofline) and, where the trace has them, its kernels.
#[derive(Clone, Copy)]
pub(super) struct Speed<'a> {
    pub flops: (f64, f64),
    pub bytes: f64,
    pub work: Option<&'a StepWork>,
}

/// The candidate's step as the step-time model needs it.
fn speed_setup(c: &Candidate, cx: ReplayContext) -> SpeedSetup {
    let accumulation = if cx.mode == RunMode::Train {
        c.accumulation
    } else {
        1
    };
    SpeedSetup::of_step(cx.mode, c.amp, cx.gpus, accumulation, c.batch_size, c.crop)
}
