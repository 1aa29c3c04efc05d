//! Candidates predicted from traced steps, each replayed through the
//! caching allocator model against the budget. With op-level traces (meta,
//! the default) every candidate is traced as it is; with the CPU allocator
//! trace, two traced steps per crop and precision (batch 2 and 3) and any
//! larger batch extrapolated from them, a smaller one traced itself (batch
//! 1 can fail where 2 trains: BatchNorm after global pooling).

use super::against_budget::{replay_against_budget, Speed};
use super::{Evaluator, PairKey, StepKey};
use crate::error::Result;
use crate::kinds::RunMode;
use crate::models::layers::norm::ONE_VALUE_PER_CHANNEL;
use crate::predict::estimate::{BatchLayout, KernelSetup};
use crate::predict::extrapolate::{extrapolate, extrapolate_aligned, ALIGNED_PAIR, TRACED_BATCHES};
use crate::predict::speed::StepWork;
use crate::predict::{Budget, TracedStep};
use crate::search::record::{CandidateStatus, Mode, TrialRecord};
use crate::search::space::{Amp, Candidate, ModelKnobs};
use crate::trial::kernel_calls::KernelCall;
use crate::trial::trace::{phase_of, Phase, TraceEvent};
use std::borrow::Cow;
use std::collections::HashMap;

/// Traces one step (a [`StepKey`]). A candidate that accumulates is traced
/// at the last micro-step of a cycle (its gradients held through the
/// forward, the optimizer state there): any accumulation above 1 keeps the
/// same tensors.
pub type Tracer = Box<dyn FnMut(StepKey) -> Result<TracedStep> + Send>;

/// A step as [`Tracer`] would trace it, if it was traced already (the
/// trace cache): `None` costs nothing.
pub type Peek = Box<dyn Fn(StepKey) -> Option<TracedStep> + Send>;

/// Traces of one (crop, precision) at batch 2 and 3, and what they imply.
struct TracePair {
    one: Vec<TraceEvent>,
    two: Vec<TraceEvent>,
    /// The two steps' kernels, for the step time (none without op work).
    work: (Option<StepWork>, Option<StepWork>),
    flops: (f64, f64),
    recompute_flops: (f64, f64),
    step_bytes: (f64, f64),
}

/// Bytes the last traced step allocated (outside the data loader).
fn step_bytes(events: &[TraceEvent]) -> f64 {
    let last = events
        .iter()
        .map(|e| phase_of(e.phase).0)
        .max()
        .unwrap_or(0);
    events
        .iter()
        .filter(|e| {
            e.bytes > 0 && phase_of(e.phase).0 == last && phase_of(e.phase).1 != Phase::Data
        })
        .map(|e| e.bytes as f64)
        .sum()
}

fn lerp(pair: (f64, f64), batch: i64) -> f64 {
    lerp_between(TRACED_BATCHES, pair, batch)
}

/// The value at `batch` of one affine in the batch, from its values at the
/// two batch sizes `at`.
fn lerp_between(at: (i64, i64), values: (f64, f64), batch: i64) -> f64 {
    let (ba, bb) = at;
    values.0 + (values.1 - values.0) * (batch - ba) as f64 / (bb - ba) as f64
}

/// Why a step could not be traced, as the candidate's status: the step's
/// own failure (`error`, kept for every candidate that needs the trace) or
/// no verdict (`timeout`, `crash`, `environment`: the host's RAM, a kill, a
/// missed deadline; retried, never cached).
#[derive(Debug, Clone)]
struct TraceFailure {
    reason: String,
    status: CandidateStatus,
}

impl From<crate::error::Error> for TraceFailure {
    fn from(e: crate::error::Error) -> TraceFailure {
        use crate::error::Error;
        let status = match &e {
            Error::Unanswered { status, .. } => CandidateStatus::unanswered(*status),
            Error::Environment { .. } => CandidateStatus::Environment,
            _ => CandidateStatus::Error,
        };
        TraceFailure {
            reason: e.to_string(),
            status,
        }
    }
}

impl TraceFailure {
    fn record(&self) -> TrialRecord {
        TrialRecord::failed(self.status, self.reason.clone(), Mode::Predicted)
    }

    /// Whether a later candidate may reuse this failure.
    fn is_verdict(&self) -> bool {
        self.status.is_verdict()
    }
}

/// Predicts candidates from CPU traces (two per crop and precision).
pub struct PredictedEvaluator {
    budget: Budget,
    tracer: Tracer,
    pairs: HashMap<PairKey, std::result::Result<TracePair, TraceFailure>>,
    /// Steps traced at a batch below [`TRACED_BATCHES`].
    small: HashMap<StepKey, std::result::Result<SmallTrace, TraceFailure>>,
    traces_run: usize,
    /// Every candidate traced as it is (op-level traces take a second), not
    /// extrapolated from a pair.
    direct: bool,
    /// Training or inference steps.
    mode: RunMode,
    /// How the batch arrives on the device.
    layout: BatchLayout,
    /// Whether the predicted PyTorch has `expandable_segments` to offer
    /// where the default allocator does not fit.
    expandable_segments: bool,
    /// The PyTorch release and cuDNN flags the GPU's kernels follow (the
    /// candidate's precision set per replay).
    kernels: KernelSetup,
    /// With direct (op-level) traces: a candidate that accumulates, at a
    /// batch above [`ALIGNED_PAIR`], is predicted from the steps traced
    /// there where the two align item for item
    /// ([`crate::predict::extrapolate::extrapolate_aligned`]).
    extrapolate_aligned: bool,
    /// The pairs that did not align (traced at each batch instead).
    unaligned: std::collections::HashSet<PairKey>,
    /// Steps traced before this search (its pair members may be there).
    peek: Option<Peek>,
    /// GPUs of data-parallel training.
    gpus: i64,
}

/// What every replay of one evaluator shares besides the candidate.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReplayContext {
    pub mode: RunMode,
    /// GPUs of data-parallel training (the step time's all-reduce).
    pub gpus: i64,
    pub layout: BatchLayout,
    pub expandable_segments: bool,
    pub kernels: KernelSetup,
}

/// One traced step at a batch below [`TRACED_BATCHES`].
struct SmallTrace {
    events: Vec<TraceEvent>,
    calls: Vec<KernelCall>,
    work: Option<StepWork>,
    flops: f64,
    recompute_flops: f64,
    step_bytes: f64,
}

impl PredictedEvaluator {
    /// `direct`: trace every candidate's batch itself (for the cheap
    /// op-level traces); else trace batches 2 and 3 per crop and precision
    /// and extrapolate the rest.
    pub fn new(
        budget: Budget,
        tracer: Tracer,
        direct: bool,
        layout: BatchLayout,
    ) -> PredictedEvaluator {
        PredictedEvaluator {
            budget,
            tracer,
            pairs: HashMap::new(),
            small: HashMap::new(),
            traces_run: 0,
            direct,
            mode: RunMode::Train,
            layout,
            expandable_segments: true,
            kernels: KernelSetup::newest(),
            extrapolate_aligned: false,
            unaligned: Default::default(),
            peek: None,
            gpus: 1,
        }
    }

    /// Predicts steps of data-parallel training on `gpus` cards (their
    /// all-reduce in the step time).
    pub fn with_gpus(mut self, gpus: i64) -> PredictedEvaluator {
        self.gpus = gpus.max(1);
        self
    }

    /// Predicts a direct evaluator's accumulating candidates above the
    /// traced pair from it where the pair aligns (see the field) and both
    /// steps were traced already: by this search, or before it (`peek`).
    /// A pair is never traced for its own sake, so no search traces more.
    pub fn extrapolating_aligned_pairs(mut self, peek: Option<Peek>) -> PredictedEvaluator {
        self.extrapolate_aligned = self.direct;
        self.peek = peek;
        self
    }

    /// Whether the step at `batch` is known without tracing it: traced by
    /// this evaluator, or found by `peek` (and kept).
    fn known(&mut self, batch: i64, c: &Candidate) -> bool {
        let key = PairKey::of(c, true).at(batch);
        if matches!(self.small.get(&key), Some(Ok(_))) {
            return true;
        }
        let Some(step) = self.peek.as_ref().and_then(|peek| peek(key)) else {
            return false;
        };
        self.small.insert(
            key,
            Ok(SmallTrace {
                step_bytes: step_bytes(&step.events),
                flops: step.forward_flops,
                recompute_flops: step.recompute_flops,
                work: StepWork::from_trace(&step, c.amp),
                events: step.events,
                calls: step.kernel_calls,
            }),
        );
        true
    }

    /// `c` from its pair's two traces, if both are known and align; `None`:
    /// trace `c`.
    fn predicted_from_aligned_pair(
        &mut self,
        c: &Candidate,
        cx: ReplayContext,
    ) -> Option<TrialRecord> {
        let key = PairKey::of(c, true);
        if self.unaligned.contains(&key) {
            return None;
        }
        let (ba, bb) = ALIGNED_PAIR;
        if !(self.known(ba, c) && self.known(bb, c)) {
            return None;
        }
        let (Some(Ok(one)), Some(Ok(two))) =
            (self.small.get(&key.at(ba)), self.small.get(&key.at(bb)))
        else {
            return None;
        };
        let Some((events, calls)) = extrapolate_aligned(
            (&one.events, &one.calls),
            (&two.events, &two.calls),
            c.batch_size,
        ) else {
            self.unaligned.insert(key);
            return None;
        };
        let at = |values| lerp_between(ALIGNED_PAIR, values, c.batch_size);
        let flops = (
            at((one.flops, two.flops)),
            at((one.recompute_flops, two.recompute_flops)),
        );
        let bytes = at((one.step_bytes, two.step_bytes));
        let work = match (&one.work, &two.work) {
            (Some(a), Some(b)) => StepWork::lerp((ba, a), (bb, b), c.batch_size),
            _ => None,
        };
        Some(replay_against_budget(
            &self.budget,
            c,
            (&events, &calls),
            Speed {
                flops,
                bytes,
                work: work.as_ref(),
            },
            cx,
        ))
    }

    /// Predicts for this PyTorch release and these cuDNN flags (the
    /// candidate's precision is its own).
    pub fn with_kernels(mut self, kernels: KernelSetup) -> PredictedEvaluator {
        self.kernels = kernels;
        self
    }

    /// Predicts for a PyTorch release without `expandable_segments` (< 2.1):
    /// a candidate fits with the default allocator or not at all.
    pub fn without_expandable_segments(mut self) -> PredictedEvaluator {
        self.expandable_segments = false;
        self
    }

    /// Predicts inference (test) steps instead of training steps (the
    /// tracer must trace them).
    pub fn for_inference(mut self) -> PredictedEvaluator {
        self.mode = RunMode::Infer;
        self.direct = true;
        self
    }

    fn pair(
        &mut self,
        crop: (i64, i64),
        amp: Amp,
        knobs: ModelKnobs,
        accumulates: bool,
    ) -> std::result::Result<&TracePair, TraceFailure> {
        // fp16 and bf16 keep the same tensors in half precision (2 bytes):
        // one CPU trace (bf16 autocast) stands for both.
        let traced = if amp == Amp::Off { Amp::Off } else { Amp::Bf16 };
        let key = PairKey {
            crop,
            amp: traced,
            knobs,
            accumulates,
        };
        if !self.pairs.contains_key(&key) {
            let mut run = |b: i64| -> std::result::Result<TracedStep, TraceFailure> {
                self.traces_run += 1;
                (self.tracer)(key.at(b)).map_err(TraceFailure::from)
            };
            let (ba, bb) = TRACED_BATCHES;
            let pair = run(ba).and_then(|one| {
                let two = run(bb)?;
                Ok(TracePair {
                    work: (
                        StepWork::from_trace(&one, amp),
                        StepWork::from_trace(&two, amp),
                    ),
                    step_bytes: (step_bytes(&one.events), step_bytes(&two.events)),
                    flops: (one.forward_flops, two.forward_flops),
                    recompute_flops: (one.recompute_flops, two.recompute_flops),
                    one: one.events,
                    two: two.events,
                })
            });
            // The host's failures are not the step's: the next candidate
            // that needs this pair traces it again.
            if let Err(e) = &pair {
                if !e.is_verdict() {
                    return Err(e.clone());
                }
            }
            self.pairs.insert(key, pair);
        }
        self.pairs[&key].as_ref().map_err(Clone::clone)
    }

    /// The step at `batch` (below the traced pair) traced itself.
    fn small(
        &mut self,
        batch: i64,
        crop: (i64, i64),
        amp: Amp,
        knobs: ModelKnobs,
        accumulates: bool,
    ) -> std::result::Result<&SmallTrace, TraceFailure> {
        let traced = if amp == Amp::Off || self.direct {
            amp
        } else {
            Amp::Bf16
        };
        let key = StepKey {
            batch,
            crop,
            amp: traced,
            knobs,
            accumulates,
        };
        if !self.small.contains_key(&key) {
            self.traces_run += 1;
            let step = (self.tracer)(key)
                .map(|s| SmallTrace {
                    work: StepWork::from_trace(&s, amp),
                    step_bytes: step_bytes(&s.events),
                    flops: s.forward_flops,
                    recompute_flops: s.recompute_flops,
                    events: s.events,
                    calls: s.kernel_calls,
                })
                .map_err(TraceFailure::from);
            if let Err(e) = &step {
                if !e.is_verdict() {
                    return Err(e.clone());
                }
            }
            self.small.insert(key, step);
        }
        self.small[&key].as_ref().map_err(Clone::clone)
    }
}

impl Evaluator for PredictedEvaluator {
    fn mode(&self) -> Mode {
        Mode::Predicted
    }

    fn traces_run(&self) -> usize {
        self.traces_run
    }

    fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
        let budget = self.budget.clone();
        let mode = ReplayContext {
            mode: self.mode,
            gpus: self.gpus,
            layout: self.layout,
            expandable_segments: self.expandable_segments,
            kernels: self.kernels,
        };
        let accumulates = self.mode == RunMode::Train && c.accumulation > 1;
        if self.extrapolate_aligned && accumulates && c.batch_size > ALIGNED_PAIR.1 {
            if let Some(record) = self.predicted_from_aligned_pair(c, mode) {
                return record;
            }
        }
        if c.batch_size < TRACED_BATCHES.0 || self.direct {
            return match self.small(c.batch_size, c.crop, c.amp, c.knobs(), accumulates) {
                Err(e) if e.reason.contains(ONE_VALUE_PER_CHANNEL) => TrialRecord::failed(
                    CandidateStatus::Infeasible,
                    format!("cannot train at batch {}: {}", c.batch_size, e.reason),
                    Mode::Predicted,
                ),
                Err(e) => e.record(),
                Ok(s) => replay_against_budget(
                    &budget,
                    c,
                    (&s.events, &s.calls),
                    Speed {
                        flops: (s.flops, s.recompute_flops),
                        bytes: s.step_bytes,
                        work: s.work.as_ref(),
                    },
                    mode,
                ),
            };
        }
        let (events, flops, bytes, work) = match self.pair(c.crop, c.amp, c.knobs(), accumulates) {
            Err(e) => return e.record(),
            Ok(p) => {
                let (ba, bb) = TRACED_BATCHES;
                let work = match &p.work {
                    (Some(a), Some(b)) => StepWork::lerp((ba, a), (bb, b), c.batch_size),
                    _ => None,
                };
                let (ba, bb) = TRACED_BATCHES;
                // The traced batch sizes replay their own trace, without a copy.
                let events = if c.batch_size == ba {
                    Ok(Cow::Borrowed(p.one.as_slice()))
                } else if c.batch_size == bb {
                    Ok(Cow::Borrowed(p.two.as_slice()))
                } else {
                    extrapolate(&p.one, &p.two, c.batch_size).map(Cow::Owned)
                };
                (
                    events,
                    (
                        lerp(p.flops, c.batch_size),
                        lerp(p.recompute_flops, c.batch_size),
                    ),
                    lerp(p.step_bytes, c.batch_size),
                    work,
                )
            }
        };
        let events = match events {
            Ok(e) => e,
            Err(e) => {
                return TrialRecord::failed(CandidateStatus::Error, e, Mode::Predicted);
            }
        };
        let speed = Speed {
            flops,
            bytes,
            work: work.as_ref(),
        };
        replay_against_budget(&budget, c, (&events, &[]), speed, mode)
    }
}

#[cfg(test)]
mod tests {
    use super::super::against_budget::replay_with;
    use super::*;
    use crate::predict::allocator::AllocatorSettings;
    use crate::predict::Gpu;
    use crate::trial::trace::phase_code;

    const MIB: i64 = 1 << 20;

    fn roofline(flops: (f64, f64)) -> Speed<'static> {
        Speed {
            flops,
            bytes: 1.0,
            work: None,
        }
    }

    /// A 64x64 fp32 candidate of `batch_size` images.
    fn candidate(batch_size: i64) -> Candidate {
        Candidate {
            batch_size,
            crop: (64, 64),
            amp: Amp::Off,
            accumulation: 1,
            checkpoint: false,
            num_points: None,
            test_mode: None,
        }
    }

    /// A training replay on the newest PyTorch, fp32.
    fn training(expandable_segments: bool) -> ReplayContext {
        ReplayContext {
            mode: RunMode::Train,
            gpus: 1,
            layout: BatchLayout::MmSeg,
            expandable_segments,
            kernels: KernelSetup::newest(),
        }
    }

    #[test]
    fn a_candidate_that_fits_only_with_expandable_segments_says_so() {
        // Thirty 6 MiB tensors (after the first, which fills the cuBLAS
        // workspace's segment, three to each 20 MiB segment), the middle one
        // of each three kept: the holes left in fixed segments (6 and 8 MiB)
        // are too small for 9 MiB tensors, which need new segments; in one
        // expandable segment neighbouring holes merge into 12 MiB runs.
        let event = |id: u64, bytes: i64| TraceEvent {
            id,
            bytes,
            phase: phase_code(1, Phase::Forward),
            scope: 0,
        };
        let mut events: Vec<TraceEvent> = (0..30).map(|i| event(i, 6 * MIB)).collect();
        events.extend((0..30).filter(|i| i % 3 != 2).map(|i| event(i, -6 * MIB)));
        events.extend((100..109).map(|i| event(i, 9 * MIB)));
        // 600 MiB: 570 usable, 260 for the allocator besides the context.
        let gpu = Gpu::custom(
            600 << 20,
            crate::predict::budget::DEFAULT_COMPUTE_CAPABILITY,
        )
        .unwrap();
        let budget = Budget::new(&gpu, 0.05).unwrap();
        let c = candidate(1);
        let flops = (1.0, 0.0);
        let training = training(true);
        let default = replay_with(
            &budget,
            &c,
            (&events, &[]),
            Speed {
                flops,
                bytes: 1.0,
                work: None,
            },
            AllocatorSettings::default(),
            training,
            false,
        )
        .0;
        assert!(!default.fits(), "{default:?}");
        let record = replay_against_budget(&budget, &c, (&events, &[]), roofline(flops), training);
        assert!(record.fits(), "{record:?}");
        assert_eq!(
            record.alloc_conf.as_deref(),
            Some("expandable_segments:True")
        );
        assert!(record.device_bytes.unwrap() <= budget.usable_bytes);
        // PyTorch < 2.1 has no expandable segments to offer.
        let without = ReplayContext {
            expandable_segments: false,
            ..training
        };
        let record = replay_against_budget(&budget, &c, (&events, &[]), roofline(flops), without);
        assert!(!record.fits() && record.alloc_conf.is_none(), "{record:?}");
    }

    /// A convolution whose fastest algorithm wants a large workspace: the
    /// search's verdict follows the least the step needs (cuDNN falls back
    /// to a smaller workspace where memory is short), never the workspace
    /// cuDNN would take on a roomy card.
    #[test]
    fn feasibility_follows_the_least_figure_not_the_workspaces_cudnn_would_take() {
        let event = |id: u64, bytes: i64| TraceEvent {
            id,
            bytes,
            phase: phase_code(1, Phase::Forward),
            scope: 0,
        };
        // PSPNet's bottleneck at 256x256, batch 8 (4096 -> 512 channels, 3x3).
        let events = vec![event(1, 512 * MIB), event(2, 16 * MIB), event(2, -16 * MIB)];
        let calls = vec![KernelCall::from_line(
            "k 1 9 0 aten::convolution t:f32:8x4096x32x32 t:f32:512x4096x3x3 - l:1,1 l:1,1 l:1,1 b:0 l:0,0 i:1",
        )
        .unwrap()];
        let c = candidate(8);
        let cx = training(false);
        let record = |vram_mib: u64| {
            // sm 7.0 (no TF32): Winograd's transforms win fp32 3x3 convolutions.
            let gpu = Gpu::custom(vram_mib << 20, "7.0").unwrap();
            let budget = Budget::new(&gpu, 0.0).unwrap();
            let r = replay_with(
                &budget,
                &c,
                (&events, &calls),
                roofline((1.0, 0.0)),
                AllocatorSettings::default(),
                cx,
                false,
            )
            .0;
            (budget, r)
        };
        // On a roomy card the shown peak holds the fastest algorithm's workspace.
        let (budget, roomy) = record(80 << 10);
        let roomy_peak = roomy.peak_allocated_bytes.unwrap();
        let least_device = roomy.device_bytes.unwrap() - budget.cuda_context_bytes;
        assert!(
            roomy_peak > least_device + 32 * MIB as u64,
            "the fastest algorithm takes a workspace: shown {roomy_peak}, least {least_device}"
        );
        // A card whose allocator has room for the least but not for that
        // workspace: the candidate fits, with a smaller workspace.
        let tight = (1..4096)
            .map(|extra| record(budget.cuda_context_bytes / MIB as u64 + 500 + extra))
            .find(|(b, _)| b.allocator_capacity() > least_device + 2 * MIB as u64)
            .unwrap();
        assert!(
            tight.0.allocator_capacity() < roomy_peak,
            "the card is tight"
        );
        assert!(tight.1.fits(), "{:?}", tight.1);
        assert!(tight.1.peak_allocated_bytes.unwrap() <= tight.0.allocator_capacity());
    }
}
