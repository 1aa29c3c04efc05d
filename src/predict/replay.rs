//! Replaying a CPU trace as the CUDA caching allocator would see the same
//! training run: the CPU-only data loading is left out, the device copies of
//! the batch that `cast_data` makes are added, and the cuBLAS workspace that
//! PyTorch takes from the caching allocator on the first matmul is added.

use super::allocator::{round_size, Allocator, AllocatorSettings, Stats};
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
    /// The most bytes the trace's own requests (rounded as the allocator
    /// rounds them), the batch copies and the workspace held at once in any
    /// step, whether the allocator could serve them or not: every allocator
    /// setting must hold at least this much, so beyond the capacity every
    /// replay of the same events runs out of memory.
    #[serde(skip)]
    pub least_demand: u64,
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
    replay_events(events, inputs, kernels, false).expect("a full replay has a result")
}

/// [`replay_kernels`] for a verdict only: `None` as soon as a request
/// cannot be served (the figures of a replay out of memory are not
/// wanted).
pub fn replay_kernels_unless_out_of_memory(
    events: &[TraceEvent],
    inputs: &ReplayInputs,
    kernels: Option<Kernels>,
) -> Option<ReplayResult> {
    replay_events(events, inputs, kernels, true)
}

fn replay_events(
    events: &[TraceEvent],
    inputs: &ReplayInputs,
    kernels: Option<Kernels>,
    stop_at_out_of_memory: bool,
) -> Option<ReplayResult> {
    let last_step = events
        .iter()
        .map(|e| phase_of(e.phase).0)
        .max()
        .unwrap_or(0);
    let mut replay = Replay {
        inputs,
        calls: kernels.map_or(&[], |k| k.calls),
        last_step,
        alloc: Allocator::new(inputs.capacity, inputs.settings),
        scratch: kernels.map(|k| KernelScratch::new(k.model, last_step)),
        next_call: 0,
        current_step: 0,
        injected_for_step: Vec::new(),
        next_injected: INJECTED,
        workspace_done: inputs.cublas_workspace == 0,
        out_of_memory: false,
        best: 0,
        first_step_peak: 0,
        skipped: Default::default(),
        peak: (Phase::Setup, 0, ScratchLive::default()),
        demand: 0,
        demand_peak: 0,
    };
    for (i, e) in events.iter().enumerate() {
        replay.event(i, e);
        if stop_at_out_of_memory && replay.out_of_memory {
            return None;
        }
    }
    let result = replay.finish();
    (!(stop_at_out_of_memory && result.out_of_memory)).then_some(result)
}

/// A replay under way: the allocator, the kernels' scratch, where the
/// calls and the steps are, and the peaks found so far.
struct Replay<'a> {
    inputs: &'a ReplayInputs,
    calls: &'a [KernelCall],
    last_step: usize,
    alloc: Allocator,
    scratch: Option<KernelScratch<'a>>,
    next_call: usize,
    current_step: usize,
    /// The batch copies of the step under way, freed when the next starts.
    injected_for_step: Vec<u64>,
    next_injected: u64,
    workspace_done: bool,
    out_of_memory: bool,
    /// The last step's highest allocated bytes so far.
    best: u64,
    first_step_peak: u64,
    /// Allocations of the data and preprocessing phases (host-side work
    /// the GPU does not see), whose frees are skipped too.
    skipped: rustc_hash::FxHashSet<u64>,
    /// The last step's peak: its phase, the events before it, the scratch
    /// live then.
    peak: (Phase, usize, ScratchLive),
    /// Bytes requested and not freed (rounded), served or not, and their
    /// peak ([`ReplayResult::least_demand`]).
    demand: i64,
    demand_peak: i64,
}

impl Replay<'_> {
    /// Event `i`: the kernel calls that ran before it, a new step's batch
    /// copies, then the event's own allocation or free.
    fn event(&mut self, i: usize, e: &TraceEvent) {
        let (step, phase) = phase_of(e.phase);
        self.calls_before(i);
        if phase == Phase::Data || phase == Phase::Preprocess {
            if e.bytes > 0 {
                self.skipped.insert(e.id);
            }
            return;
        }
        if step != self.current_step && phase != Phase::Setup {
            self.start_step(step, phase, i);
        }
        if e.bytes > 0 {
            self.demand(e.bytes as u64, true);
            self.out_of_memory |= self.alloc.malloc(e.id, e.bytes as u64).is_err();
            let allocated = self.alloc.stats().allocated;
            if step == 1 && self.current_step == 1 {
                self.first_step_peak = self.first_step_peak.max(allocated);
            }
            if self.current_step == self.last_step
                && step == self.last_step
                && allocated > self.best
            {
                self.best = allocated;
                self.peak = (phase, i + 1, ScratchLive::default());
            }
        } else if !self.skipped.contains(&e.id) {
            self.demand(e.bytes.unsigned_abs(), false);
            self.alloc.free(e.id);
        }
    }

    /// Counts a request of `bytes` (or its free) in the demand. A free of
    /// an allocation made before the trace lowers it too: it stays a lower
    /// bound.
    fn demand(&mut self, bytes: u64, allocated: bool) {
        let rounded = round_size(bytes) as i64;
        if allocated {
            self.demand += rounded;
            self.demand_peak = self.demand_peak.max(self.demand);
        } else {
            self.demand -= rounded;
        }
    }

    /// The kernel calls recorded before event `i`, each allocating its
    /// scratch (and perhaps a peak of the last step) at its place.
    fn calls_before(&mut self, i: usize) {
        while self.next_call < self.calls.len() && self.calls[self.next_call].at <= i {
            let call = &self.calls[self.next_call];
            self.next_call += 1;
            let Some(s) = self.scratch.as_mut() else {
                break;
            };
            let call_step = phase_of(call.phase).0;
            let measuring = call_step == self.last_step && self.current_step == self.last_step;
            let in_first = call_step == 1;
            let (first_step_peak, best, peak) =
                (&mut self.first_step_peak, &mut self.best, &mut self.peak);
            let mut track = |a: &Allocator, live: &[(&'static str, u64)]| {
                let allocated = a.stats().allocated;
                if in_first {
                    *first_step_peak = (*first_step_peak).max(allocated);
                }
                if measuring && allocated > *best {
                    *best = allocated;
                    let mut l = ScratchLive::default();
                    for (what, bytes) in live {
                        if what.starts_with("cuDNN") {
                            l.cudnn += bytes;
                        } else {
                            l.kernel += bytes;
                        }
                    }
                    *peak = (phase_of(call.phase).1, i, l);
                }
            };
            if s.at_call(call, &mut self.alloc, &mut track).is_err() {
                self.out_of_memory = true;
            }
        }
    }

    /// A new step starts at event `i`: the last step's batch copies freed,
    /// this one's copied (and cuBLAS's workspace before the first step that
    /// has none placed by a call).
    fn start_step(&mut self, step: usize, phase: Phase, i: usize) {
        if !self.injected_for_step.is_empty() {
            for &bytes in &self.inputs.batch_copies {
                self.demand(bytes, false);
            }
        }
        for id in self.injected_for_step.drain(..) {
            self.alloc.free(id);
        }
        self.current_step = step;
        if step == self.last_step {
            self.alloc.reset_peaks();
            self.best = self.alloc.stats().allocated;
            self.peak = (phase, i, ScratchLive::default());
        }
        for &bytes in &self.inputs.batch_copies {
            self.demand(bytes, true);
            self.out_of_memory |= self.alloc.malloc(self.next_injected, bytes).is_err();
            self.injected_for_step.push(self.next_injected);
            self.next_injected += 1;
        }
        if !self.workspace_done {
            self.demand(self.inputs.cublas_workspace, true);
            self.out_of_memory |= self
                .alloc
                .malloc(self.next_injected, self.inputs.cublas_workspace)
                .is_err();
            self.next_injected += 1;
            self.workspace_done = true;
        }
        let allocated = self.alloc.stats().allocated;
        if step == 1 {
            self.first_step_peak = self.first_step_peak.max(allocated);
        }
        if step == self.last_step && allocated > self.best {
            self.best = allocated;
            self.peak = (phase, i, ScratchLive::default());
        }
    }

    /// The figures once every event is replayed.
    fn finish(mut self) -> ReplayResult {
        for id in std::mem::take(&mut self.injected_for_step) {
            self.alloc.free(id);
        }
        let (peak_phase, peak_after_events, mut live) = self.peak;
        live.cublas = self
            .scratch
            .as_ref()
            .map_or(0, |s| s.persistent().iter().map(|p| p.1).sum::<u64>());
        let s: Stats = self.alloc.stats();
        ReplayResult {
            peak_allocated: s.allocated_peak,
            peak_reserved: s.reserved_peak,
            peak_phase,
            allocated_after: s.allocated,
            out_of_memory: self.out_of_memory,
            num_alloc_retries: s.num_alloc_retries,
            peak_after_events,
            first_step_peak_allocated: self.first_step_peak,
            cudnn_workspace_at_peak: live.cudnn,
            kernel_scratch_at_peak: live.kernel,
            cublas_at_peak: live.cublas,
            kernels: self.scratch.map(|s| s.summary()),
            least_demand: self.demand_peak.max(0) as u64,
        }
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
