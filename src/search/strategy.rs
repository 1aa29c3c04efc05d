//! The search strategy: per (crop, precision), a binary search over the
//! ascending batch sizes, using that memory grows with the batch (above an
//! out-of-memory nothing is tried, below a fit everything fits). With
//! keep-crop, smaller crops are only tried when nothing fits at the
//! recipe's. Every evaluated candidate goes to the journal at once; one
//! found there is not evaluated again.

use super::evaluate::{evaluate_retrying, Evaluator};
use super::journal::Journal;
use super::knobs::recipe_fidelity;
use super::record::{Outcome, TrialRecord};
use super::space::{Amp, Candidate, ModelKnobs};
use super::spec::Objective;
use crate::error::Result;

/// The candidates' axes.
pub struct SearchSpace<'a> {
    /// The recipe's crop first.
    pub crops: &'a [(i64, i64)],
    pub precisions: &'a [Amp],
    /// Ascending.
    pub batches: &'a [i64],
    /// Accumulation for a batch size, and whether it keeps the effective batch.
    pub accumulation: &'a dyn Fn(i64) -> (i64, bool),
    /// The model knobs to search the recipe's crop with, in turn, while no
    /// candidate keeps the recipe's crop and effective batch
    /// (`knobs::fallback_passes`).
    pub fallbacks: &'a [ModelKnobs],
    /// The knobs of every candidate (an inference search's test mode).
    pub knobs: ModelKnobs,
}

/// What the search loop did: every outcome in evaluation order, and how
/// many were evaluated now or taken from the journal.
pub struct Explored {
    pub outcomes: Vec<Outcome>,
    pub ran: usize,
    pub resumed: usize,
    /// Candidates predicted before real trials confirmed the best of them
    /// (0 without a confirmation).
    pub predictions: usize,
    /// Evaluations the loop may still make: a bound, lowered as it goes.
    left_at_most: usize,
}

/// How many candidates in a row may fail with no verdict, before any got
/// one, until the search stops trying: by then the host (an address-space
/// cap, a full temporary directory, a missing library) fails every trial
/// alike, and each further one costs a worker's start twice over.
const UNJUDGED_BEFORE_GIVING_UP: usize = 3;

impl Explored {
    /// Whether nothing has been judged and the last
    /// [`UNJUDGED_BEFORE_GIVING_UP`] candidates all failed without a
    /// verdict: the search stops and says why (`run::some_verdict`).
    fn host_fails_everything(&self) -> bool {
        self.outcomes.len() >= UNJUDGED_BEFORE_GIVING_UP
            && self.outcomes.iter().all(|o| !o.record.status.is_verdict())
    }

    pub fn new(outcomes: Vec<Outcome>, ran: usize, resumed: usize, predictions: usize) -> Explored {
        Explored {
            outcomes,
            ran,
            resumed,
            predictions,
            left_at_most: 0,
        }
    }
}

/// What the progress display hears after each decided candidate.
pub struct Step<'a> {
    pub candidate: &'a Candidate,
    pub record: &'a TrialRecord,
    /// From the journal (no trace or trial run for it now).
    pub resumed: bool,
    /// Candidates decided so far, this one included.
    pub done: usize,
    /// At most this many more will be evaluated (the binary search usually
    /// needs fewer).
    pub left_at_most: usize,
}

/// Hears of every decided candidate.
pub type Progress<'a> = &'a dyn Fn(&Step);

/// Evaluations one binary search over `n` batch sizes makes at most.
fn binary_search_bound(n: usize) -> usize {
    (usize::BITS - n.leading_zeros()) as usize
}

/// The search loop: binary search of the batch per (crop, precision);
/// `exhaustive` evaluates every candidate instead (for benchmarks).
pub fn run_search(
    space: &SearchSpace,
    objective: Objective,
    exhaustive: bool,
    evaluator: &mut dyn Evaluator,
    journal: &mut Journal,
    progress: Progress,
) -> Result<Explored> {
    let per_group = if exhaustive {
        space.batches.len()
    } else {
        binary_search_bound(space.batches.len())
    };
    let passes_after = space.fallbacks.len();
    let mut explored = Explored {
        outcomes: Vec::new(),
        ran: 0,
        resumed: 0,
        predictions: 0,
        left_at_most: per_group * space.precisions.len() * (space.crops.len() + passes_after),
    };
    let mut batches_of =
        |crop: (i64, i64), amp: Amp, knobs: ModelKnobs, explored: &mut Explored| {
            search_batches(
                space,
                (crop, amp, knobs),
                exhaustive,
                evaluator,
                journal,
                progress,
                explored,
            )
        };
    for crop in space.crops.iter() {
        for amp in space.precisions.iter() {
            batches_of(*crop, *amp, space.knobs, &mut explored)?;
        }
        // keep-crop: the largest crop where anything fits wins; smaller crops need no trial.
        let any_fit_here = explored
            .outcomes
            .iter()
            .any(|o| o.candidate.crop == *crop && o.record.fits());
        if objective == Objective::KeepCrop && any_fit_here && !exhaustive {
            break;
        }
    }
    explored.left_at_most = per_group * space.precisions.len() * passes_after;
    let Some(recipe_crop) = space.crops.first() else {
        return Ok(explored);
    };
    // A batch below a fitting one fits too (memory grows with the batch):
    // the recipe is kept when some batch up to a fit keeps the effective batch.
    let keeps_recipe = |o: &Outcome| {
        o.record.fits()
            && o.candidate.crop == *recipe_crop
            && space
                .batches
                .iter()
                .any(|b| *b <= o.candidate.batch_size && (space.accumulation)(*b).1)
    };
    let kept = |explored: &Explored| !exhaustive && explored.outcomes.iter().any(keeps_recipe);
    for knobs in space.fallbacks.iter().copied() {
        if kept(&explored) {
            explored.left_at_most = 0;
            break;
        }
        for amp in space.precisions.iter() {
            batches_of(*recipe_crop, *amp, knobs, &mut explored)?;
        }
    }
    Ok(explored)
}

/// Binary search (or, `exhaustive`, every batch) of one crop, precision
/// and model knobs: batches below a fit fit, above an OOM do not.
fn search_batches(
    space: &SearchSpace,
    (crop, amp, knobs): ((i64, i64), Amp, ModelKnobs),
    exhaustive: bool,
    evaluator: &mut dyn Evaluator,
    journal: &mut Journal,
    progress: Progress,
    explored: &mut Explored,
) -> Result<()> {
    let batches = space.batches;
    let bound_at_start = explored.left_at_most;
    let group_bound = if exhaustive {
        batches.len()
    } else {
        binary_search_bound(batches.len())
    };
    let mut evaluated_here = 0usize;
    // Invariant: batches[..lo] fit (or are unknown below a fit), batches[hi..] do not.
    let (mut lo, mut hi) = (0usize, batches.len());
    let mut next_exhaustive = 0usize;
    while lo < hi {
        if explored.host_fails_everything() {
            break;
        }
        let mid = if exhaustive {
            next_exhaustive
        } else {
            (lo + hi) / 2
        };
        let (acc, _) = (space.accumulation)(batches[mid]);
        let c = Candidate {
            batch_size: batches[mid],
            crop,
            amp,
            accumulation: acc,
            checkpoint: knobs.checkpoint,
            num_points: knobs.num_points,
            test_mode: knobs.test_mode,
        };
        let (record, now) = match journal.get(&c) {
            Some(r) => {
                explored.resumed += 1;
                (r.clone(), false)
            }
            None => {
                let r = evaluate_retrying(evaluator, &c);
                explored.ran += 1;
                journal.append(&c, &r)?;
                (r, true)
            }
        };
        evaluated_here += 1;
        explored.left_at_most = bound_at_start.saturating_sub(evaluated_here);
        progress(&Step {
            candidate: &c,
            record: &record,
            resumed: !now,
            done: explored.outcomes.len() + 1,
            left_at_most: explored.left_at_most,
        });
        let fits = record.fits();
        explored.outcomes.push(Outcome {
            candidate: c,
            record,
            ran_now: now,
        });
        if exhaustive {
            next_exhaustive += 1;
            if next_exhaustive == batches.len() {
                break;
            }
        } else if fits {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    // The group's unused evaluations leave the bound.
    explored.left_at_most = bound_at_start.saturating_sub(group_bound);
    Ok(())
}

/// Ranks feasible outcomes: keep-crop puts the largest crop first, then the
/// knobs that keep most of the recipe's training (`knobs::recipe_fidelity`),
/// then throughput; throughput ranks by images/s alone.
pub fn rank(mut feasible: Vec<Outcome>, objective: Objective) -> Vec<Outcome> {
    feasible.sort_by(|a, b| order(a, b, objective));
    feasible
}

/// The ranking's order of two feasible outcomes ([`rank`]).
pub fn order(a: &Outcome, b: &Outcome, objective: Objective) -> std::cmp::Ordering {
    let ips = |o: &Outcome| o.record.images_per_s.unwrap_or(0.0);
    let fidelity = |o: &Outcome| recipe_fidelity(o.candidate.knobs());
    let by_crop =
        (b.candidate.crop.0 * b.candidate.crop.1).cmp(&(a.candidate.crop.0 * a.candidate.crop.1));
    let by_speed = ips(b).total_cmp(&ips(a));
    let by_fidelity = fidelity(b).cmp(&fidelity(a));
    match objective {
        Objective::KeepCrop => by_crop.then(by_fidelity).then(by_speed),
        Objective::Throughput => by_speed.then(by_crop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::knobs::{fallback_passes, FallbackOptions};
    use crate::search::record::{CandidateStatus, Mode};

    /// Fits when batch x crop area is at most `capacity`; every
    /// `fail_every`-th evaluation fails as a crashed trial would, and so
    /// does every evaluation of a batch in `crash_batches`.
    struct FakeEvaluator {
        capacity: i64,
        fail_every: usize,
        crash_batches: Vec<i64>,
        evaluated: Vec<Candidate>,
    }

    impl Evaluator for FakeEvaluator {
        fn mode(&self) -> Mode {
            Mode::Predicted
        }
        fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
            self.evaluated.push(*c);
            if (self.fail_every > 0 && self.evaluated.len().is_multiple_of(self.fail_every))
                || self.crash_batches.contains(&c.batch_size)
            {
                return TrialRecord::failed(
                    CandidateStatus::Crash,
                    "the trial process crashed".into(),
                    Mode::Predicted,
                );
            }
            let need = c.batch_size * c.crop.0 * c.crop.1
                / if c.amp == Amp::Off { 1 } else { 2 }
                / if c.checkpoint { 4 } else { 1 }
                * c.num_points.unwrap_or(12544)
                / 12544;
            let mut r =
                TrialRecord::failed(CandidateStatus::Oom, "too big".into(), Mode::Predicted);
            if need <= self.capacity {
                r.status = CandidateStatus::Fits;
                r.reason = None;
                r.images_per_s = Some(c.batch_size as f64 * 1e6 / (c.crop.0 * c.crop.1) as f64);
            }
            r
        }
    }

    fn explore(
        capacity: i64,
        fail_every: usize,
        objective: Objective,
        journal_dir: &std::path::Path,
    ) -> (Explored, FakeEvaluator) {
        explore_with(capacity, fail_every, objective, journal_dir, false, &[])
    }

    fn explore_with(
        capacity: i64,
        fail_every: usize,
        objective: Objective,
        journal_dir: &std::path::Path,
        checkpoint: bool,
        num_points: &[i64],
    ) -> (Explored, FakeEvaluator) {
        let evaluator = FakeEvaluator {
            capacity,
            fail_every,
            crash_batches: Vec::new(),
            evaluated: Vec::new(),
        };
        explore_on(evaluator, objective, journal_dir, checkpoint, num_points)
    }

    fn explore_on(
        mut evaluator: FakeEvaluator,
        objective: Objective,
        journal_dir: &std::path::Path,
        checkpoint: bool,
        num_points: &[i64],
    ) -> (Explored, FakeEvaluator) {
        let mut journal = Journal::open(journal_dir, "hash", "fake").unwrap();
        let fallbacks = fallback_passes(
            ModelKnobs::default(),
            FallbackOptions {
                checkpoint,
                num_points,
            },
        );
        let space = SearchSpace {
            crops: &[(512, 512), (384, 384)],
            precisions: &[Amp::Off, Amp::Fp16],
            batches: &[1, 2, 3, 4, 5, 6, 7, 8],
            accumulation: &|b| (16 / b, 16 % b == 0),
            fallbacks: &fallbacks,
            knobs: ModelKnobs::default(),
        };
        let explored = run_search(
            &space,
            objective,
            false,
            &mut evaluator,
            &mut journal,
            &|_| {},
        )
        .unwrap();
        (explored, evaluator)
    }

    fn ranked_fits(explored: Explored, objective: Objective) -> Vec<Outcome> {
        let fits = explored.outcomes.into_iter().filter(|o| o.record.fits());
        rank(fits.collect(), objective)
    }

    #[test]
    fn binary_search_finds_the_largest_fitting_batch_with_few_trials() {
        let dir = tempfile::tempdir().unwrap();
        // 3 images of 512x512 fit in fp32, 6 in half precision.
        let (explored, evaluator) = explore(3 * 512 * 512, 0, Objective::KeepCrop, dir.path());
        let best = |amp: Amp| {
            explored
                .outcomes
                .iter()
                .filter(|o| o.record.fits() && o.candidate.amp == amp)
                .map(|o| o.candidate.batch_size)
                .max()
        };
        assert_eq!(best(Amp::Off), Some(3));
        assert_eq!(best(Amp::Fp16), Some(6));
        assert!(evaluator.evaluated.len() <= 8, "{:?}", evaluator.evaluated);
        // keep-crop: something fits at 512x512, so 384x384 is never tried.
        assert!(evaluator.evaluated.iter().all(|c| c.crop == (512, 512)));
        let ranked = ranked_fits(explored, Objective::KeepCrop);
        assert_eq!(ranked[0].candidate.batch_size, 6);
        assert_eq!(ranked[0].candidate.amp, Amp::Fp16);
    }

    #[test]
    fn nothing_fitting_at_the_recipe_crop_tries_the_smaller_one() {
        let dir = tempfile::tempdir().unwrap();
        // Not even one 512x512 image in half precision (131072), but one 384x384 (73728).
        let (explored, _) = explore(100_000, 0, Objective::KeepCrop, dir.path());
        let winner = ranked_fits(explored, Objective::KeepCrop);
        assert_eq!(winner[0].candidate.crop, (384, 384));
    }

    #[test]
    fn a_crashed_trial_is_tried_again_and_its_retry_decides() {
        let dir = tempfile::tempdir().unwrap();
        let (explored, evaluator) = explore(3 * 512 * 512, 3, Objective::KeepCrop, dir.path());
        assert!(explored
            .outcomes
            .iter()
            .all(|o| o.record.status.is_verdict()));
        let crashes = evaluator.evaluated.len() / 3;
        assert!(crashes > 0);
        assert_eq!(
            evaluator.evaluated.len(),
            explored.outcomes.len() + crashes,
            "each crash tried once more"
        );
        let undisturbed = tempfile::tempdir().unwrap();
        let (expected, _) = explore(3 * 512 * 512, 0, Objective::KeepCrop, undisturbed.path());
        assert_eq!(
            ranked_fits(explored, Objective::KeepCrop)[0].candidate,
            ranked_fits(expected, Objective::KeepCrop)[0].candidate
        );
    }

    #[test]
    fn a_trial_that_fails_twice_has_no_verdict_and_the_search_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let evaluator = FakeEvaluator {
            capacity: 3 * 512 * 512,
            fail_every: 0,
            crash_batches: vec![4],
            evaluated: Vec::new(),
        };
        let (explored, evaluator) =
            explore_on(evaluator, Objective::KeepCrop, dir.path(), false, &[]);
        let crashed: Vec<&Outcome> = explored
            .outcomes
            .iter()
            .filter(|o| o.record.status == CandidateStatus::Crash)
            .collect();
        assert!(!crashed.is_empty());
        assert!(crashed.iter().all(|o| o.candidate.batch_size == 4
            && o.record.reason.as_deref().unwrap().contains("tried twice")));
        let tries = |b: i64| {
            evaluator
                .evaluated
                .iter()
                .filter(|c| c.batch_size == b)
                .count()
        };
        assert_eq!(tries(4), 2 * crashed.len());
        assert!(
            explored.outcomes.iter().any(|o| o.record.fits()),
            "still a winner"
        );
        // The journal keeps the crash but a re-run tries it again.
        let journal = Journal::open(dir.path(), "hash", "fake").unwrap();
        assert!(journal.get(&crashed[0].candidate).is_none());
    }

    #[test]
    fn a_host_that_fails_every_trial_stops_the_search_early() {
        let dir = tempfile::tempdir().unwrap();
        let evaluator = FakeEvaluator {
            capacity: 3 * 512 * 512,
            fail_every: 1,
            crash_batches: Vec::new(),
            evaluated: Vec::new(),
        };
        let (explored, evaluator) =
            explore_on(evaluator, Objective::KeepCrop, dir.path(), false, &[]);
        assert_eq!(explored.outcomes.len(), UNJUDGED_BEFORE_GIVING_UP);
        assert_eq!(evaluator.evaluated.len(), 2 * UNJUDGED_BEFORE_GIVING_UP);
        assert!(crate::search::run::some_verdict(&explored.outcomes).is_err());
    }

    #[test]
    fn a_rerun_resumes_from_the_journal_without_new_trials() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = explore(3 * 512 * 512, 0, Objective::Throughput, dir.path());
        let (second, evaluator) = explore(3 * 512 * 512, 0, Objective::Throughput, dir.path());
        assert_eq!(second.ran, 0);
        assert!(evaluator.evaluated.is_empty());
        assert_eq!(second.resumed, first.ran);
    }

    #[test]
    fn checkpointing_is_tried_only_when_nothing_keeps_the_recipes_crop_and_batch() {
        let dir = tempfile::tempdir().unwrap();
        // Plenty of memory: no checkpointed candidate is ever evaluated.
        let (_, evaluator) =
            explore_with(3 * 512 * 512, 0, Objective::KeepCrop, dir.path(), true, &[]);
        assert!(evaluator.evaluated.iter().all(|c| !c.checkpoint));
        // Not one 512x512 image without checkpointing (half precision needs
        // 131072), but two in half precision with it (a quarter: 65536).
        let dir = tempfile::tempdir().unwrap();
        let (explored, evaluator) =
            explore_with(512 * 512 / 4, 0, Objective::KeepCrop, dir.path(), true, &[]);
        assert!(evaluator.evaluated.iter().any(|c| c.checkpoint));
        assert!(evaluator
            .evaluated
            .iter()
            .filter(|c| c.checkpoint)
            .all(|c| c.crop == (512, 512)));
        let winner = &ranked_fits(explored, Objective::KeepCrop)[0];
        assert!(winner.candidate.checkpoint);
        assert_eq!(winner.candidate.crop, (512, 512));
        assert_eq!(winner.candidate.batch_size, 2);
        assert_eq!(winner.candidate.amp, Amp::Fp16);
    }

    #[test]
    fn lower_point_counts_are_tried_largest_first_until_the_recipe_fits() {
        let ks = [9408, 6272, 3136];
        // Plenty of memory: the config's point count only.
        let dir = tempfile::tempdir().unwrap();
        let (_, evaluator) = explore_with(
            3 * 512 * 512,
            0,
            Objective::KeepCrop,
            dir.path(),
            false,
            &ks,
        );
        assert!(evaluator.evaluated.iter().all(|c| c.num_points.is_none()));
        // One 512x512 image in half precision needs 131072 at K = 12544:
        // 6272 points halve it and fit 65536; 3136 is never tried.
        let dir = tempfile::tempdir().unwrap();
        let (explored, evaluator) = explore_with(
            512 * 512 / 4,
            0,
            Objective::KeepCrop,
            dir.path(),
            false,
            &ks,
        );
        let tried: Vec<Option<i64>> = evaluator.evaluated.iter().map(|c| c.num_points).collect();
        assert!(tried.contains(&Some(9408)) && tried.contains(&Some(6272)));
        assert!(!tried.contains(&Some(3136)));
        assert!(evaluator
            .evaluated
            .iter()
            .filter(|c| c.num_points.is_some())
            .all(|c| c.crop == (512, 512)));
        let winner = &ranked_fits(explored, Objective::KeepCrop)[0];
        assert_eq!(winner.candidate.num_points, Some(6272));
        assert_eq!(winner.candidate.crop, (512, 512));
        // With checkpointing available it is tried first (a quarter: fits).
        let dir = tempfile::tempdir().unwrap();
        let (explored, _) =
            explore_with(512 * 512 / 4, 0, Objective::KeepCrop, dir.path(), true, &ks);
        let winner = &ranked_fits(explored, Objective::KeepCrop)[0];
        assert!(winner.candidate.checkpoint);
        assert_eq!(winner.candidate.num_points, None);
    }

    #[test]
    fn progress_counts_what_is_done_and_bounds_what_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let mut evaluator = FakeEvaluator {
            capacity: 512 * 512 / 4,
            fail_every: 0,
            crash_batches: Vec::new(),
            evaluated: Vec::new(),
        };
        let mut journal = Journal::open(dir.path(), "hash", "fake").unwrap();
        let space = SearchSpace {
            crops: &[(512, 512), (384, 384)],
            precisions: &[Amp::Off, Amp::Fp16],
            batches: &[1, 2, 3, 4, 5, 6, 7, 8],
            accumulation: &|b| (16 / b, 16 % b == 0),
            fallbacks: &fallback_passes(
                ModelKnobs::default(),
                FallbackOptions {
                    checkpoint: true,
                    num_points: &[],
                },
            ),
            knobs: ModelKnobs::default(),
        };
        let steps = std::cell::RefCell::new(Vec::new());
        let explored = run_search(
            &space,
            Objective::KeepCrop,
            false,
            &mut evaluator,
            &mut journal,
            &|s: &Step| steps.borrow_mut().push((s.done, s.left_at_most)),
        )
        .unwrap();
        let steps = steps.into_inner();
        assert_eq!(steps.len(), explored.outcomes.len());
        // 4 binary searches of 8 batches (2 crops x 2 precisions) and 2 with
        // checkpointing: at most 4 evaluations each.
        let bound = 6 * 4;
        for (i, (done, left)) in steps.iter().enumerate() {
            assert_eq!(*done, i + 1);
            assert!(done + left <= bound, "{steps:?}");
        }
        // The bound only falls.
        assert!(steps.windows(2).all(|w| w[0].0 + w[0].1 >= w[1].0 + w[1].1));
    }
}
