//! Replaying a CPU trace as the CUDA caching allocator would see the same
//! training run: the CPU-only data loading is left out, the device copies of
//! the batch that `cast_data` makes are added, and the cuBLAS workspace that
//! PyTorch takes from the caching allocator on the first matmul is added.

use super::allocator::{Allocator, AllocatorSettings, Stats};
use super::kernels::{KernelModel, KernelScratch, ScratchSummary};
use crate::trial::kernel_calls::KernelCall;
use crate::trial::trace::{phase_of, Phase, TraceEvent};

/// What to add to the CPU trace.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayInputs {
    /// Bytes of each batch tensor alive on the device for the whole step, in
    /// allocation order: the images and labels `cast_data` copies to the
    /// device, then the data preprocessor's outputs (the stacked, normalised
    /// images and the padded labels). The trace's own preprocessing events
    /// are left out: its per-image temporaries are short-lived and do not
    /// scale with the batch the way the rest of the step does.
    pub batch_copies: Vec<u64>,
    /// cuBLAS workspace taken on the first matmul and kept (0: none).
    pub cublas_workspace: u64,
    /// Device bytes the allocator may reserve (`None`: unlimited).
    pub capacity: Option<u64>,
    /// `PYTORCH_CUDA_ALLOC_CONF`'s settings.
    pub settings: AllocatorSettings,
}

/// The replay's result for the last step of the trace.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ReplayResult {
    /// `max_memory_allocated()` during the first step (with a benchmark's
    /// searches: what MMEngine's first log line shows).
    pub first_step_peak_allocated: u64,
    /// The kernels' scratch live at the last step's peak: cuDNN's
    /// workspace (or its benchmark search's), other kernels' transient
    /// scratch, cuBLAS's kept workspaces.
    pub cudnn_workspace_at_peak: u64,
    pub kernel_scratch_at_peak: u64,
    pub cublas_at_peak: u64,
    /// What the kernel calls did (none without kernel calls).
    pub kernels: Option<ScratchSummary>,
    /// `max_memory_allocated()` during the last step.
    pub peak_allocated: u64,
    /// `max_memory_reserved()` during the last step.
    pub peak_reserved: u64,
    /// The phase in which allocated memory peaked.
    pub peak_phase: Phase,
    /// Allocated bytes after the last step.
    pub allocated_after: u64,
    /// Whether some request could not be served within the capacity.
    pub out_of_memory: bool,
    pub num_alloc_retries: u64,
    /// How many of the trace's events had been replayed when allocated
    /// memory peaked in the last step (the last step's batch copies and the
    /// workspace are live then too).
    pub peak_after_events: usize,
}

const INJECTED: u64 = 1 << 62;

/// Replays `events`; peaks are those of the trace's last step.
pub fn replay(events: &[TraceEvent], inputs: &ReplayInputs) -> ReplayResult {
    replay_kernels(events, inputs, None)
}

/// What a GPU's kernels add at their calls: the calls recorded with the
/// trace and the model of what they allocate.
#[derive(Clone, Copy)]
pub struct Kernels<'a> {
    pub calls: &'a [KernelCall],
    pub model: &'a KernelModel,
}

/// Scratch live at an instant: (cuDNN, other kernels, cuBLAS) bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct ScratchLive {
    cudnn: u64,
    kernel: u64,
    cublas: u64,
}

/// [`replay`] with the kernels' allocations at their calls.
pub fn replay_kernels(
    events: &[TraceEvent],
    inputs: &ReplayInputs,
    kernels: Option<Kernels>,
) -> ReplayResult {
    let last_step = events
        .iter()
        .map(|e| phase_of(e.phase).0)
        .max()
        .unwrap_or(0);
    let mut alloc = Allocator::new(inputs.capacity, inputs.settings);
    let mut scratch = kernels.map(|k| KernelScratch::new(k.model, last_step));
    let calls: &[KernelCall] = kernels.map_or(&[], |k| k.calls);
    let mut next_call = 0usize;
    let mut current_step = 0usize;
    let mut injected_for_step: Vec<u64> = Vec::new();
    let mut next_injected = INJECTED;
    let mut workspace_done = inputs.cublas_workspace == 0;
    let mut out_of_memory = false;
    let mut best = 0u64;
    let mut first_step_peak = 0u64;
    let mut skipped: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut peak = (Phase::Setup, 0usize, ScratchLive::default());
    let persistent_cublas = |scratch: &Option<KernelScratch>| {
        scratch
            .as_ref()
            .map_or(0, |s| s.persistent().iter().map(|p| p.1).sum::<u64>())
    };
    for (i, e) in events.iter().enumerate() {
        let (step, phase) = phase_of(e.phase);
        // The kernel calls that ran before this event.
        while next_call < calls.len() && calls[next_call].at <= i {
            let call = &calls[next_call];
            next_call += 1;
            let Some(s) = scratch.as_mut() else { break };
            let call_step = phase_of(call.phase).0;
            let measuring = call_step == last_step && current_step == last_step;
            let in_first = call_step == 1;
            let mut track = |a: &Allocator, live: &[(&'static str, u64)]| {
                let allocated = a.stats().allocated;
                if in_first {
                    first_step_peak = first_step_peak.max(allocated);
                }
                if measuring && allocated > best {
                    best = allocated;
                    let mut l = ScratchLive::default();
                    for (what, bytes) in live {
                        if what.starts_with("cuDNN") {
                            l.cudnn += bytes;
                        } else {
                            l.kernel += bytes;
                        }
                    }
                    peak = (phase_of(call.phase).1, i, l);
                }
            };
            if s.at_call(call, &mut alloc, &mut track).is_err() {
                out_of_memory = true;
            }
        }
        if phase == Phase::Data || phase == Phase::Preprocess {
            if e.bytes > 0 {
                skipped.insert(e.id);
            }
            continue;
        }
        if step != current_step && phase != Phase::Setup {
            // A new step starts: free the last step's batch copies, copy this one's.
            for id in injected_for_step.drain(..) {
                alloc.free(id);
            }
            current_step = step;
            if step == last_step {
                alloc.reset_peaks();
                best = alloc.stats().allocated;
                peak = (phase, i, ScratchLive::default());
            }
            for bytes in &inputs.batch_copies {
                out_of_memory |= alloc.malloc(next_injected, *bytes).is_err();
                injected_for_step.push(next_injected);
                next_injected += 1;
            }
            if !workspace_done {
                out_of_memory |= alloc
                    .malloc(next_injected, inputs.cublas_workspace)
                    .is_err();
                next_injected += 1;
                workspace_done = true;
            }
            if step == 1 {
                first_step_peak = first_step_peak.max(alloc.stats().allocated);
            }
            if step == last_step && alloc.stats().allocated > best {
                best = alloc.stats().allocated;
                peak = (phase, i, ScratchLive::default());
            }
        }
        if e.bytes > 0 {
            out_of_memory |= alloc.malloc(e.id, e.bytes as u64).is_err();
            let allocated = alloc.stats().allocated;
            if step == 1 && current_step == 1 {
                first_step_peak = first_step_peak.max(allocated);
            }
            if current_step == last_step && step == last_step && allocated > best {
                best = allocated;
                peak = (phase, i + 1, ScratchLive::default());
            }
        } else if !skipped.contains(&e.id) {
            alloc.free(e.id);
        }
    }
    for id in injected_for_step {
        alloc.free(id);
    }
    let (peak_phase, peak_after_events, mut live) = peak;
    live.cublas = persistent_cublas(&scratch);
    let s: Stats = alloc.stats();
    ReplayResult {
        peak_allocated: s.allocated_peak,
        peak_reserved: s.reserved_peak,
        peak_phase,
        allocated_after: s.allocated,
        out_of_memory,
        num_alloc_retries: s.num_alloc_retries,
        peak_after_events,
        first_step_peak_allocated: first_step_peak,
        cudnn_workspace_at_peak: live.cudnn,
        kernel_scratch_at_peak: live.kernel,
        cublas_at_peak: live.cublas,
        kernels: scratch.map(|s| s.summary()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trial::trace::phase_code;

    fn ev(id: u64, bytes: i64, step: usize, phase: Phase) -> TraceEvent {
        TraceEvent {
            id,
            bytes,
            phase: phase_code(step, phase),
            scope: 0,
        }
    }

    #[test]
    fn data_loading_is_left_out_and_batch_copies_added() {
        const MIB: i64 = 1 << 20;
        let events = vec![
            ev(0, 4 * MIB, 0, Phase::Setup),    // a parameter
            ev(1, 30 * MIB, 1, Phase::Data),    // the CPU batch: not on the GPU
            ev(2, 16 * MIB, 1, Phase::Forward), // an activation
            ev(2, -16 * MIB, 1, Phase::Backward),
            ev(1, -30 * MIB, 1, Phase::Setup),
            ev(3, 30 * MIB, 2, Phase::Data),
            ev(4, 16 * MIB, 2, Phase::Forward),
            ev(4, -16 * MIB, 2, Phase::Backward),
        ];
        let inputs = ReplayInputs {
            batch_copies: vec![12 << 20],
            cublas_workspace: 8 << 20,
            capacity: None,
            settings: Default::default(),
        };
        // (the batch tensor stands for the device copies and the preprocessor's outputs)
        let r = replay(&events, &inputs);
        // step 2: parameter 4 MiB (in a 20 MiB segment) + workspace 8 MiB + batch 12 MiB + activation 16 MiB
        assert_eq!(r.peak_allocated, (4 + 8 + 12 + 16) << 20);
        assert_eq!(r.peak_phase, Phase::Forward);
        assert!(!r.out_of_memory);
        // After the step: the parameter and the workspace remain.
        assert_eq!(r.allocated_after, (4 + 8) << 20);
    }
}
