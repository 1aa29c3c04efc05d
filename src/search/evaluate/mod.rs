//! How a candidate is evaluated: measured by a real CUDA trial
//! ([`MeasuredEvaluator`]) or predicted from CPU traces
//! ([`PredictedEvaluator`]). The strategy sees only the [`Evaluator`] trait.

mod measured;
mod predicted;

pub use measured::MeasuredEvaluator;
pub use predicted::{PredictedEvaluator, Tracer};

use super::record::{Mode, TrialRecord};
use super::space::Candidate;

/// Evaluates candidates, one at a time.
pub trait Evaluator {
    fn evaluate(&mut self, c: &Candidate) -> TrialRecord;
    fn mode(&self) -> Mode;
    /// CPU traces run so far (predicted mode).
    fn traces_run(&self) -> usize {
        0
    }
}
