//! How a candidate is evaluated: measured by a real CUDA trial
//! ([`MeasuredEvaluator`]) or predicted from CPU traces
//! ([`PredictedEvaluator`], built for a search by [`predictor`], its steps
//! named by [`StepKey`]). The strategy sees only the [`Evaluator`] trait.

mod against_budget;
mod measured;
mod predicted;
mod predictor;
mod step_key;

pub use measured::MeasuredEvaluator;
pub use predicted::{Peek, PredictedEvaluator, Tracer};
pub use predictor::predictor;
pub(crate) use predictor::trace_slots;
pub use step_key::{PairKey, StepKey};

use super::record::{Mode, TrialRecord};
use super::space::Candidate;

/// Evaluates `c`, and once more when the first try failed for a reason of
/// the host or the moment (a crash, a missed deadline, the host's refusal):
/// such a failure is no verdict on the candidate. A second failure is
/// returned, saying that it was tried twice.
pub fn evaluate_retrying(evaluator: &mut dyn Evaluator, c: &Candidate) -> TrialRecord {
    evaluate_retrying_noted(evaluator, c).0
}

/// [`evaluate_retrying`], with the first try's failure when it was tried
/// again (the journal keeps it: a trial Slurm cancelled is said so even
/// when its retry fits).
pub fn evaluate_retrying_noted(
    evaluator: &mut dyn Evaluator,
    c: &Candidate,
) -> (TrialRecord, Option<String>) {
    let first = evaluator.evaluate(c);
    if first.status.is_verdict() {
        return (first, None);
    }
    let first_failure = format!(
        "{}: {}",
        first.status.name(),
        first.reason.as_deref().unwrap_or("")
    );
    let mut second = evaluator.evaluate(c);
    if !second.status.is_verdict() {
        second.reason = Some(format!(
            "{} (tried twice; a re-run tries it again)",
            second.reason.as_deref().unwrap_or(second.status.name())
        ));
    }
    (second, Some(first_failure))
}

/// Evaluates candidates, one at a time (several evaluators, each on a
/// thread of its own, run a search's candidates at once).
pub trait Evaluator: Send {
    fn evaluate(&mut self, c: &Candidate) -> TrialRecord;
    fn mode(&self) -> Mode;
    /// CPU traces run so far (predicted mode).
    fn traces_run(&self) -> usize {
        0
    }
}
