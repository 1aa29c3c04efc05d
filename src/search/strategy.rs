//! The search strategy: per (crop, precision), a binary search over the
//! ascending batch sizes, using that memory grows with the batch (above an
//! out-of-memory nothing is tried, below a fit everything fits). With
//! keep-crop, smaller crops are only tried when nothing fits at the
//! recipe's. Every evaluated candidate goes to the journal at once; one
//! found there is not evaluated again.

use super::evaluate::{evaluate_retrying_noted, Evaluator};
use super::journal::{Journal, RunInfo};
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
/// `exhaustive` evaluates every candidate instead (for benchmarks). One
/// evaluator: candidates one at a time ([`run_search_on`] for several).
pub fn run_search(
    space: &SearchSpace,
    objective: Objective,
    exhaustive: bool,
    evaluator: &mut dyn Evaluator,
    journal: &mut Journal,
    progress: Progress,
) -> Result<Explored> {
    run_search_on(
        space,
        objective,
        exhaustive,
        &mut [evaluator],
        journal,
        progress,
    )
}

/// [`run_search`] with several evaluators (one per device or Slurm slot),
/// each evaluating one candidate at a time on a thread of its own. The
/// strategy keeps its order: the groups (crop, precision, knobs) a stage
/// searches are independent binary searches, and an idle evaluator takes
/// the next candidate of the first group with none pending; what a
/// candidate decides still gates what its group tries next, and a stage
/// (keep-crop's next crop, a fallback pass) starts only once the one
/// before it is decided. With one evaluator the order is the serial one.
/// The journal has one writer, this thread, appending each candidate as it
/// finishes.
pub fn run_search_on(
    space: &SearchSpace,
    objective: Objective,
    exhaustive: bool,
    evaluators: &mut [Slot<'_>],
    journal: &mut Journal,
    progress: Progress,
) -> Result<Explored> {
    let per_group = if exhaustive {
        space.batches.len()
    } else {
        binary_search_bound(space.batches.len())
    };
    let precisions = space.precisions.len();
    let fallback_bound = per_group * precisions * space.fallbacks.len();
    let mut explored = Explored {
        outcomes: Vec::new(),
        ran: 0,
        resumed: 0,
        predictions: 0,
        left_at_most: per_group * precisions * space.crops.len() + fallback_bound,
    };
    let mut stages = Stages {
        space,
        exhaustive,
        per_group,
        evaluators,
        journal,
        progress,
    };
    // keep-crop: the largest crop where anything fits wins, and smaller
    // crops need no trial, so each crop waits for the one before; for
    // throughput every crop is searched, all at once.
    let crop_stages: Vec<&[(i64, i64)]> = if objective == Objective::KeepCrop && !exhaustive {
        space.crops.chunks(1).collect()
    } else {
        vec![space.crops]
    };
    for (i, crops) in crop_stages.iter().enumerate() {
        let groups = crops
            .iter()
            .flat_map(|crop| space.precisions.iter().map(move |amp| (*crop, *amp)))
            .map(|(crop, amp)| GroupSearch::new(crop, amp, space.knobs, space.batches.len()))
            .collect();
        let later: usize = crop_stages[i + 1..].iter().map(|c| c.len()).sum();
        stages.run(
            groups,
            per_group * precisions * later + fallback_bound,
            &mut explored,
        )?;
        let any_fit_here = explored
            .outcomes
            .iter()
            .any(|o| crops.contains(&o.candidate.crop) && o.record.fits());
        if objective == Objective::KeepCrop && any_fit_here && !exhaustive {
            break;
        }
    }
    explored.left_at_most = fallback_bound;
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
    for (i, knobs) in space.fallbacks.iter().copied().enumerate() {
        if kept(&explored) {
            explored.left_at_most = 0;
            break;
        }
        let groups = space
            .precisions
            .iter()
            .map(|amp| GroupSearch::new(*recipe_crop, *amp, knobs, space.batches.len()))
            .collect();
        let later = space.fallbacks.len() - i - 1;
        stages.run(groups, per_group * precisions * later, &mut explored)?;
    }
    Ok(explored)
}

/// An evaluator of a search's slot (a device, a Slurm slot).
pub type Slot<'e> = &'e mut (dyn Evaluator + 'e);

/// The evaluators in `boxes`, as slots of [`run_search_on`].
pub fn slots(boxes: &mut [Box<dyn Evaluator>]) -> Vec<Slot<'_>> {
    boxes.iter_mut().map(reborrow_box).collect()
}

fn reborrow_box<'x>(b: &'x mut Box<dyn Evaluator>) -> Slot<'x> {
    &mut **b
}

fn reborrow<'x>(e: &'x mut Slot<'_>) -> Slot<'x> {
    &mut **e
}

/// One binary search (or, exhaustive, sweep) of the batch of one crop,
/// precision and model knobs: batches below a fit fit, above an OOM do not.
struct GroupSearch {
    crop: (i64, i64),
    amp: Amp,
    knobs: ModelKnobs,
    /// Invariant: batches[..lo] fit (or are unknown below a fit),
    /// batches[hi..] do not.
    lo: usize,
    hi: usize,
    next_exhaustive: usize,
    pending: bool,
    evaluated: usize,
}

impl GroupSearch {
    fn new(crop: (i64, i64), amp: Amp, knobs: ModelKnobs, batches: usize) -> GroupSearch {
        GroupSearch {
            crop,
            amp,
            knobs,
            lo: 0,
            hi: batches,
            next_exhaustive: 0,
            pending: false,
            evaluated: 0,
        }
    }

    fn searching(&self, exhaustive: bool) -> bool {
        if exhaustive {
            self.next_exhaustive < self.hi
        } else {
            self.lo < self.hi
        }
    }

    /// The index of the batch to evaluate next, when none is pending.
    fn next(&self, exhaustive: bool) -> Option<usize> {
        (!self.pending && self.searching(exhaustive)).then(|| {
            if exhaustive {
                self.next_exhaustive
            } else {
                (self.lo + self.hi) / 2
            }
        })
    }

    /// The candidate of the batch at `mid`.
    fn candidate(&self, space: &SearchSpace, mid: usize) -> Candidate {
        let batch = space.batches[mid];
        Candidate {
            batch_size: batch,
            crop: self.crop,
            amp: self.amp,
            accumulation: (space.accumulation)(batch).0,
            checkpoint: self.knobs.checkpoint,
            num_points: self.knobs.num_points,
            test_mode: self.knobs.test_mode,
        }
    }

    fn decide(&mut self, mid: usize, fits: bool, exhaustive: bool) {
        self.pending = false;
        self.evaluated += 1;
        if exhaustive {
            self.next_exhaustive += 1;
        } else if fits {
            self.lo = mid + 1;
        } else {
            self.hi = mid;
        }
    }
}

/// What the stages of one search share: the evaluators, the journal, the
/// progress display.
struct Stages<'s, 'e> {
    space: &'s SearchSpace<'s>,
    exhaustive: bool,
    per_group: usize,
    evaluators: &'s mut [Slot<'e>],
    journal: &'s mut Journal,
    progress: Progress<'s>,
}

/// A candidate evaluated on an evaluator's thread, coming back.
struct Evaluated<'e> {
    group: usize,
    mid: usize,
    candidate: Candidate,
    record: TrialRecord,
    run: RunInfo,
    evaluator: (usize, Slot<'e>),
}

/// Milliseconds since the Unix epoch.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Evaluates `c` (retrying a failure that is no verdict) on this thread,
/// with when it ran and the Slurm jobs it ran as. A panic in an evaluator
/// is the candidate's crash, not the search's end.
fn evaluate_here(
    evaluator: &mut dyn Evaluator,
    c: &Candidate,
    slot: usize,
) -> (TrialRecord, RunInfo) {
    let started = unix_ms();
    let _ = crate::trial::launcher::take_launched_jobs();
    let (record, first_failure) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        evaluate_retrying_noted(evaluator, c)
    }))
    .unwrap_or_else(|_| {
        let panicked = TrialRecord::failed(
            super::record::CandidateStatus::Crash,
            "the evaluation panicked (a bug in segtune; please report it)".into(),
            evaluator.mode(),
        );
        (panicked, None)
    });
    let run = RunInfo {
        slot,
        started_ms: started,
        ended_ms: unix_ms(),
        slurm_jobs: crate::trial::launcher::take_launched_jobs(),
        first_failure,
    };
    (record, run)
}

impl Stages<'_, '_> {
    /// Searches `groups` to their end, `later` evaluations at most after
    /// them.
    fn run(
        &mut self,
        mut groups: Vec<GroupSearch>,
        later: usize,
        explored: &mut Explored,
    ) -> Result<()> {
        let exhaustive = self.exhaustive;
        let bound = |groups: &[GroupSearch]| {
            later
                + groups
                    .iter()
                    .filter(|g| g.searching(exhaustive) || g.pending)
                    .map(|g| self.per_group.saturating_sub(g.evaluated))
                    .sum::<usize>()
        };
        let space = self.space;
        let journal = &mut *self.journal;
        let progress = self.progress;
        let mut idle: Vec<(usize, Slot<'_>)> = self
            .evaluators
            .iter_mut()
            .enumerate()
            .map(|(i, e)| (i, reborrow(e)))
            .rev()
            .collect();
        let evaluators = idle.len();
        let first_outcome = explored.outcomes.len();
        // The group of each outcome of this stage, in the order decided.
        let mut decided_groups: Vec<usize> = Vec::new();
        std::thread::scope(|scope| -> Result<()> {
            let (tx, rx) = std::sync::mpsc::channel::<Evaluated>();
            let mut pending = 0usize;
            let mut failure: Option<crate::error::Error> = None;
            loop {
                while failure.is_none() && !explored.host_fails_everything() {
                    let Some((g, mid)) = next_ready(&groups, exhaustive, evaluators) else {
                        break;
                    };
                    let c = groups[g].candidate(space, mid);
                    if let Some(r) = journal.get(&c) {
                        let record = r.clone();
                        explored.resumed += 1;
                        groups[g].decide(mid, record.fits(), exhaustive);
                        explored.left_at_most = bound(&groups);
                        decided_groups.push(g);
                        decided(explored, c, record, false, progress);
                        continue;
                    }
                    let Some((slot, evaluator)) = idle.pop() else {
                        break;
                    };
                    groups[g].pending = true;
                    let tx = tx.clone();
                    scope.spawn(move || {
                        let (record, run) = evaluate_here(&mut *evaluator, &c, slot);
                        let _ = tx.send(Evaluated {
                            group: g,
                            mid,
                            candidate: c,
                            record,
                            run,
                            evaluator: (slot, evaluator),
                        });
                    });
                    pending += 1;
                }
                if pending == 0 {
                    break;
                }
                let Ok(done) = rx.recv() else {
                    break;
                };
                pending -= 1;
                idle.push(done.evaluator);
                explored.ran += 1;
                if failure.is_none() {
                    if let Err(e) =
                        journal.append_run(&done.candidate, &done.record, Some(&done.run))
                    {
                        // Nothing more starts; what runs is stopped, not awaited.
                        crate::trial::worker::stop_running_workers();
                        failure = Some(e);
                    }
                }
                groups[done.group].decide(done.mid, done.record.fits(), exhaustive);
                explored.left_at_most = bound(&groups);
                decided_groups.push(done.group);
                decided(explored, done.candidate, done.record, true, progress);
            }
            failure.map_or(Ok(()), Err)
        })?;
        restore_serial_order(explored, first_outcome, decided_groups);
        explored.left_at_most = later;
        Ok(())
    }
}

/// The group whose candidate goes next, and the index of its batch. One
/// evaluator: group by group, the serial order. More: the group least far
/// along first, so that the groups' chains of evaluations interleave and no
/// evaluator waits at the end for one long group.
fn next_ready(
    groups: &[GroupSearch],
    exhaustive: bool,
    evaluators: usize,
) -> Option<(usize, usize)> {
    let ready = groups
        .iter()
        .enumerate()
        .filter_map(|(i, g)| g.next(exhaustive).map(|m| (i, m, g.evaluated)));
    let next = if evaluators > 1 {
        ready.min_by_key(|(i, _, evaluated)| (*evaluated, *i))
    } else {
        ready.min_by_key(|(i, _, _)| *i)
    };
    next.map(|(g, mid, _)| (g, mid))
}

/// Puts a stage's outcomes (from `first` on, decided for the groups in
/// `groups`) back in the serial order: group by group, within a group as
/// decided. The ranking breaks ties by it, so the winner does not depend on
/// which evaluator finished first.
fn restore_serial_order(explored: &mut Explored, first: usize, groups: Vec<usize>) {
    let mut stage: Vec<(usize, Outcome)> = groups
        .into_iter()
        .zip(explored.outcomes.drain(first..))
        .collect();
    stage.sort_by_key(|(g, _)| *g);
    explored.outcomes.extend(stage.into_iter().map(|(_, o)| o));
}

/// Evaluates `candidates` on `evaluators`, as many at once as there are
/// evaluators (each on a thread of its own, retrying a failure that is no
/// verdict); the records and where they ran, in the candidates' order.
pub fn evaluate_all(
    evaluators: &mut [Slot<'_>],
    candidates: &[Candidate],
) -> Vec<(TrialRecord, RunInfo)> {
    let mut results: Vec<Option<(TrialRecord, RunInfo)>> = vec![None; candidates.len()];
    let mut idle: Vec<(usize, Slot<'_>)> = evaluators
        .iter_mut()
        .enumerate()
        .map(|(i, e)| (i, reborrow(e)))
        .rev()
        .collect();
    std::thread::scope(|scope| {
        type Done<'x> = (usize, TrialRecord, RunInfo, (usize, Slot<'x>));
        let (tx, rx) = std::sync::mpsc::channel::<Done>();
        let (mut next, mut pending) = (0usize, 0usize);
        loop {
            while next < candidates.len() {
                let Some((slot, evaluator)) = idle.pop() else {
                    break;
                };
                let (i, c, tx) = (next, candidates[next], tx.clone());
                scope.spawn(move || {
                    let (record, run) = evaluate_here(&mut *evaluator, &c, slot);
                    let _ = tx.send((i, record, run, (slot, evaluator)));
                });
                next += 1;
                pending += 1;
            }
            if pending == 0 {
                break;
            }
            let Ok((i, record, run, evaluator)) = rx.recv() else {
                break;
            };
            pending -= 1;
            idle.push(evaluator);
            results[i] = Some((record, run));
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every candidate is evaluated"))
        .collect()
}

/// Records a decided candidate and tells the progress display.
fn decided(
    explored: &mut Explored,
    c: Candidate,
    record: TrialRecord,
    now: bool,
    progress: Progress,
) {
    progress(&Step {
        candidate: &c,
        record: &record,
        resumed: !now,
        done: explored.outcomes.len() + 1,
        left_at_most: explored.left_at_most,
    });
    explored.outcomes.push(Outcome {
        candidate: c,
        record,
        ran_now: now,
    });
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
#[path = "strategy_tests.rs"]
mod tests;
