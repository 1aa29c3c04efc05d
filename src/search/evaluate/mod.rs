//! How a candidate is evaluated: measured by a real CUDA trial
//! ([`MeasuredEvaluator`]) or predicted from CPU traces
//! ([`PredictedEvaluator`]). The strategy sees only the [`Evaluator`] trait.

mod measured;
mod predicted;

pub use measured::MeasuredEvaluator;
pub use predicted::{PredictedEvaluator, Tracer};

use super::record::{Mode, TrialRecord};
use super::space::Candidate;

/// Evaluates `c`, and once more when the first try failed for a reason of
/// the host or the moment (a crash, a missed deadline, the host's refusal):
/// such a failure is no verdict on the candidate. A second failure is
/// returned, saying that it was tried twice.
pub fn evaluate_retrying(evaluator: &mut dyn Evaluator, c: &Candidate) -> TrialRecord {
    let first = evaluator.evaluate(c);
    if first.status.is_verdict() {
        return first;
    }
    let mut second = evaluator.evaluate(c);
    if !second.status.is_verdict() {
        second.reason = Some(format!(
            "{} (tried twice; a re-run tries it again)",
            second.reason.as_deref().unwrap_or(second.status.name())
        ));
    }
    second
}

/// Evaluates candidates, one at a time.
pub trait Evaluator {
    fn evaluate(&mut self, c: &Candidate) -> TrialRecord;
    fn mode(&self) -> Mode;
    /// CPU traces run so far (predicted mode).
    fn traces_run(&self) -> usize {
        0
    }
}
