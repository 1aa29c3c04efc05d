//! A traced step's identity ([`StepKey`]): what a predicted search's tracer
//! traces, the trace cache keeps and `peek` looks up, and the key of the
//! evaluator's traces.

use crate::kinds::Amp;
use crate::search::space::{Candidate, ModelKnobs};

/// One step a predicted search traces: the candidate's batch, crop,
/// precision and model knobs, and whether it accumulates gradients (then
/// traced at the last micro-step of a cycle, its gradients held through the
/// forward: any accumulation above 1 keeps the same tensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepKey {
    pub batch: i64,
    pub crop: (i64, i64),
    pub amp: Amp,
    pub knobs: ModelKnobs,
    pub accumulates: bool,
}

/// A [`StepKey`] but its batch: the steps that two traces at two batches
/// stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PairKey {
    pub crop: (i64, i64),
    pub amp: Amp,
    pub knobs: ModelKnobs,
    pub accumulates: bool,
}

impl PairKey {
    /// The step of this pair at `batch`.
    pub fn at(self, batch: i64) -> StepKey {
        StepKey {
            batch,
            crop: self.crop,
            amp: self.amp,
            knobs: self.knobs,
            accumulates: self.accumulates,
        }
    }

    /// `c`'s pair (its crop, precision and knobs), accumulating or not.
    pub fn of(c: &Candidate, accumulates: bool) -> PairKey {
        PairKey {
            crop: c.crop,
            amp: c.amp,
            knobs: c.knobs(),
            accumulates,
        }
    }
}
