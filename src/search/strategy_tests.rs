//! The strategy's unit tests: binary search, retries, fallback passes, and
//! several evaluators at once, with fake evaluators.

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
        let mut r = TrialRecord::failed(CandidateStatus::Oom, "too big".into(), Mode::Predicted);
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
    let (explored, evaluator) = explore_on(evaluator, Objective::KeepCrop, dir.path(), false, &[]);
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
    let (explored, evaluator) = explore_on(evaluator, Objective::KeepCrop, dir.path(), false, &[]);
    assert_eq!(explored.outcomes.len(), UNJUDGED_BEFORE_GIVING_UP);
    assert_eq!(evaluator.evaluated.len(), 2 * UNJUDGED_BEFORE_GIVING_UP);
    assert!(crate::search::checks::some_verdict(&explored.outcomes).is_err());
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
    let (_, evaluator) = explore_with(3 * 512 * 512, 0, Objective::KeepCrop, dir.path(), true, &[]);
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
    // 6272 points halve it and fit 65536. 3136 points, the most frugal
    // pass, runs first and says which precisions can fit at all (both
    // here); then the others, largest point count first.
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
    let first_pass = tried.iter().position(|k| k.is_some()).unwrap();
    assert_eq!(tried[first_pass], Some(3136), "{tried:?}");
    let after: Vec<Option<i64>> = tried[first_pass..]
        .iter()
        .copied()
        .filter(|k| *k != Some(3136))
        .collect();
    assert_eq!(after.first(), Some(&Some(9408)), "{tried:?}");
    assert!(after.contains(&Some(6272)));
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
    let (explored, _) = explore_with(512 * 512 / 4, 0, Objective::KeepCrop, dir.path(), true, &ks);
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

/// [`FakeEvaluator`] that takes `millis` per candidate and counts how
/// many evaluations of the shared `running` overlap.
struct SlowEvaluator {
    inner: FakeEvaluator,
    millis: u64,
    running: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    most_at_once: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Evaluator for SlowEvaluator {
    fn mode(&self) -> Mode {
        Mode::Predicted
    }
    fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most_at_once.fetch_max(now, SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(self.millis));
        self.running.fetch_sub(1, SeqCst);
        self.inner.evaluate(c)
    }
}

/// Searches with `n` slow evaluators; the outcomes, the journal's rows
/// and the most evaluations that ran at once.
fn explore_parallel(
    n: usize,
    capacity: i64,
    objective: Objective,
    dir: &std::path::Path,
) -> (Explored, Vec<crate::search::journal::JournalRow>, usize) {
    let running = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut evaluators: Vec<Box<dyn Evaluator>> = (0..n)
        .map(|_| {
            Box::new(SlowEvaluator {
                inner: FakeEvaluator {
                    capacity,
                    fail_every: 0,
                    crash_batches: Vec::new(),
                    evaluated: Vec::new(),
                },
                millis: 30,
                running: running.clone(),
                most_at_once: most.clone(),
            }) as Box<dyn Evaluator>
        })
        .collect();
    let fallbacks = fallback_passes(
        ModelKnobs::default(),
        FallbackOptions {
            checkpoint: true,
            num_points: &[],
        },
    );
    let space = SearchSpace {
        crops: &[(512, 512), (384, 384)],
        precisions: &[Amp::Off, Amp::Fp16, Amp::Bf16],
        batches: &[1, 2, 3, 4, 5, 6, 7, 8],
        accumulation: &|b| (16 / b, 16 % b == 0),
        fallbacks: &fallbacks,
        knobs: ModelKnobs::default(),
    };
    let mut journal = Journal::open(dir, "hash", "fake").unwrap();
    let explored = run_search_on(
        &space,
        objective,
        false,
        &mut slots(&mut evaluators),
        &mut journal,
        &|_| {},
    )
    .unwrap();
    let rows = crate::search::journal::rows(dir).unwrap();
    (
        explored,
        rows,
        most.load(std::sync::atomic::Ordering::SeqCst),
    )
}

#[test]
fn several_evaluators_find_the_serial_winner_side_by_side() {
    for (capacity, objective) in [
        (3 * 512 * 512, Objective::KeepCrop),
        (100_000, Objective::KeepCrop),
        (20_000, Objective::KeepCrop),
        (3 * 512 * 512, Objective::Throughput),
    ] {
        let serial_dir = tempfile::tempdir().unwrap();
        let (serial, serial_rows, one_at_once) =
            explore_parallel(1, capacity, objective, serial_dir.path());
        assert_eq!(one_at_once, 1);
        let dir = tempfile::tempdir().unwrap();
        let (parallel, rows, at_once) = explore_parallel(3, capacity, objective, dir.path());
        let winner = |e: Explored| ranked_fits(e, objective).first().map(|o| o.candidate);
        let keys = |e: &Explored| {
            let mut k: Vec<String> = e.outcomes.iter().map(|o| o.candidate.key()).collect();
            k.sort();
            k
        };
        // The same candidates: what a trial decides still gates its group.
        assert_eq!(keys(&parallel), keys(&serial), "{capacity} {objective:?}");
        assert_eq!(winner(parallel), winner(serial));
        // Three precisions searched at once, never more than 3 evaluators.
        assert_eq!(at_once, 3, "{capacity} {objective:?}");
        assert_eq!(rows.len(), serial_rows.len());
        let slots: std::collections::BTreeSet<usize> =
            rows.iter().map(|r| r.run.as_ref().unwrap().slot).collect();
        assert_eq!(slots.len(), 3);
        for r in &rows {
            let run = r.run.as_ref().unwrap();
            assert!(run.ended_ms >= run.started_ms + 30, "{run:?}");
        }
    }
}

#[test]
fn a_resumed_parallel_search_runs_nothing_again() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _, _) = explore_parallel(2, 3 * 512 * 512, Objective::KeepCrop, dir.path());
    let (again, rows, _) = explore_parallel(2, 3 * 512 * 512, Objective::KeepCrop, dir.path());
    assert_eq!(again.ran, 0);
    assert_eq!(again.resumed, first.ran);
    assert_eq!(rows.len(), first.ran);
}

#[test]
fn later_stages_start_at_the_smallest_batch_and_find_the_same_boundaries() {
    let ks = [9408, 6272, 3136];
    // From nothing fitting anywhere to everything fitting, through the
    // budgets where smaller crops, checkpointing and fewer points win.
    for capacity in (0..=64).map(|i| i * 512 * 512 / 16) {
        let dir = tempfile::tempdir().unwrap();
        let (explored, evaluator) =
            explore_with(capacity, 0, Objective::KeepCrop, dir.path(), true, &ks);
        // Each group searched found the largest batch that fits there, as
        // evaluating all of its batches would.
        let mut judge = FakeEvaluator {
            capacity,
            fail_every: 0,
            crash_batches: Vec::new(),
            evaluated: Vec::new(),
        };
        let mut groups: Vec<Candidate> = explored.outcomes.iter().map(|o| o.candidate).collect();
        groups.dedup_by_key(|c| (c.crop, c.amp, c.checkpoint, c.num_points));
        for g in groups {
            let found = explored
                .outcomes
                .iter()
                .filter(|o| {
                    let c = o.candidate;
                    (c.crop, c.amp, c.checkpoint, c.num_points)
                        == (g.crop, g.amp, g.checkpoint, g.num_points)
                        && o.record.fits()
                })
                .map(|o| o.candidate.batch_size)
                .max();
            let truth = (1..=8)
                .filter(|b| {
                    judge
                        .evaluate(&Candidate {
                            batch_size: *b,
                            accumulation: (16 / b).max(1),
                            ..g
                        })
                        .fits()
                })
                .max();
            assert_eq!(found, truth, "capacity {capacity}, group {g:?}");
        }
        // Past the recipe's crop, a group that fits nowhere costs one
        // evaluation: at most 4 + 4 at the recipe's crop, then 2 at the
        // smaller crop and 2 for each fallback pass (a binary search from
        // the middle: 4 each, 8 + 8 + 8 per pass).
        if !explored.outcomes.iter().any(|o| o.record.fits()) {
            let passes = fallback_passes(
                ModelKnobs::default(),
                FallbackOptions {
                    checkpoint: true,
                    num_points: &ks,
                },
            )
            .len();
            let n = evaluator.evaluated.len();
            assert!(
                n <= 8 + 2 + 2 * passes,
                "capacity {capacity}: {n} evaluations"
            );
        }
    }
}

#[test]
fn a_precision_the_most_frugal_pass_cannot_fit_is_left_out_of_the_other_passes() {
    // fp32 needs 262144 x 3136 / 12544 = 65536 at the fewest points; half
    // precision 32768. A capacity between: only half precision can fit.
    let ks = [9408, 6272, 3136];
    let dir = tempfile::tempdir().unwrap();
    let (explored, evaluator) =
        explore_with(40_000, 0, Objective::KeepCrop, dir.path(), false, &ks);
    let fp32_passes = evaluator
        .evaluated
        .iter()
        .filter(|c| c.amp == Amp::Off && c.num_points.is_some())
        .count();
    assert_eq!(fp32_passes, 1, "{:?}", evaluator.evaluated);
    let winner = &ranked_fits(explored, Objective::KeepCrop)[0];
    assert_eq!(winner.candidate.amp, Amp::Fp16);
    assert_eq!(winner.candidate.crop, (512, 512));
}
