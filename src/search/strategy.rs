//! The search strategy: per (crop, precision), a binary search over the
//! ascending batch sizes, using that memory grows with the batch (above an
//! out-of-memory nothing is tried, below a fit everything fits). With
//! keep-crop, the fallback passes (checkpointing, fewer points) run at the
//! recipe's crop, and smaller crops are only tried when nothing fits there
//! even so; those later stages start each binary search at the smallest
//! batch. Every evaluated candidate goes to the journal at once; one found
//! there is not evaluated again.

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
    /// verdict: the search stops and says why (`checks::some_verdict`).
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
    // The most evaluations a group makes: the recipe's crop's groups search
    // from the middle, later ones from the smallest batch.
    let n = space.batches.len();
    let first_group = GroupSearch::new((0, 0), Amp::Off, space.knobs, n);
    let per_group = first_group.max_evaluations(exhaustive);
    let per_later_group = if exhaustive {
        per_group
    } else {
        first_group.smallest_first().max_evaluations(false)
    };
    let precisions = space.precisions.len();
    let fallback_bound = per_later_group * precisions * space.fallbacks.len();
    let smaller_crops = space.crops.len().saturating_sub(1);
    let walk_bound = per_later_group * precisions * smaller_crops;
    let mut explored = Explored {
        outcomes: Vec::new(),
        ran: 0,
        resumed: 0,
        predictions: 0,
        left_at_most: per_group * precisions + walk_bound + fallback_bound,
    };
    let mut stages = Stages {
        space,
        exhaustive,
        evaluators,
        journal,
        progress,
    };
    let Some(recipe_crop) = space.crops.first().copied() else {
        return Ok(explored);
    };
    let groups_at = |crops: &[(i64, i64)], later_stage: bool| -> Vec<GroupSearch> {
        crops
            .iter()
            .flat_map(|crop| space.precisions.iter().map(move |amp| (*crop, *amp)))
            .map(|(crop, amp)| {
                let group = GroupSearch::new(crop, amp, space.knobs, n);
                if later_stage && !exhaustive {
                    group.smallest_first()
                } else {
                    group
                }
            })
            .collect()
    };
    if objective != Objective::KeepCrop || exhaustive {
        // throughput (or a benchmark): every crop at once, then the
        // fallback passes at the recipe's crop.
        stages.run(groups_at(space.crops, false), fallback_bound, &mut explored)?;
        run_fallbacks(&mut stages, recipe_crop, per_later_group, 0, &mut explored)?;
        return Ok(explored);
    }
    // keep-crop: the largest crop where anything fits wins (any knobs), so
    // the recipe's crop comes first, then the fallback passes there
    // (checkpointing, fewer points), and only when nothing fits at the
    // recipe's crop even so, the smaller crops, each waiting for the one
    // before.
    stages.run(
        groups_at(&[recipe_crop], false),
        walk_bound + fallback_bound,
        &mut explored,
    )?;
    run_fallbacks(
        &mut stages,
        recipe_crop,
        per_later_group,
        walk_bound,
        &mut explored,
    )?;
    let fits_at = |explored: &Explored, crop: (i64, i64)| {
        explored
            .outcomes
            .iter()
            .any(|o| o.candidate.crop == crop && o.record.fits())
    };
    if fits_at(&explored, recipe_crop) {
        explored.left_at_most = 0;
        return Ok(explored);
    }
    for (i, crop) in space.crops[1..].iter().enumerate() {
        let later = per_later_group * precisions * (smaller_crops - i - 1);
        stages.run(groups_at(&[*crop], true), later, &mut explored)?;
        if fits_at(&explored, *crop) {
            break;
        }
    }
    explored.left_at_most = 0;
    Ok(explored)
}

/// The fallback passes at the recipe's crop, while no candidate keeps the
/// recipe's crop and effective batch. The last pass has every knob at its
/// most frugal: run first, it tells which precisions any pass can fit in at
/// all (each knob only lowers the memory), and the passes before it run
/// for those alone. Its own candidates keep less of the recipe, so the
/// passes still run in order until one keeps the recipe. `after`: the
/// evaluations the stages after the passes may make.
fn run_fallbacks(
    stages: &mut Stages<'_, '_>,
    recipe_crop: (i64, i64),
    per_group: usize,
    after: usize,
    explored: &mut Explored,
) -> Result<()> {
    let (space, exhaustive) = (stages.space, stages.exhaustive);
    // A batch below a fitting one fits too (memory grows with the batch):
    // the recipe is kept when some batch up to a fit keeps the effective batch.
    let keeps_recipe = |o: &Outcome| {
        o.record.fits()
            && o.candidate.crop == recipe_crop
            && space
                .batches
                .iter()
                .any(|b| *b <= o.candidate.batch_size && (space.accumulation)(*b).1)
    };
    let mut passes = space.fallbacks.to_vec();
    let frugal = (passes.len() > 1 && !exhaustive)
        .then(|| passes.pop())
        .flatten();
    let kept = |explored: &Explored| {
        !exhaustive
            && explored
                .outcomes
                .iter()
                .any(|o| keeps_recipe(o) && Some(o.candidate.knobs()) != frugal)
    };
    let group = |amp: Amp, knobs: ModelKnobs| {
        GroupSearch::new(recipe_crop, amp, knobs, space.batches.len()).smallest_first()
    };
    let mut viable = space.precisions.to_vec();
    if let Some(frugal) = frugal.filter(|_| !kept(explored)) {
        let groups = viable.iter().map(|amp| group(*amp, frugal)).collect();
        let later = per_group * viable.len() * passes.len() + after;
        stages.run(groups, later, explored)?;
        viable.retain(|amp| {
            explored.outcomes.iter().any(|o| {
                o.record.fits()
                    && o.candidate.amp == *amp
                    && o.candidate.crop == recipe_crop
                    && o.candidate.knobs() == frugal
            })
        });
    }
    for (i, knobs) in passes.iter().copied().enumerate() {
        if kept(explored) || viable.is_empty() {
            break;
        }
        let groups = viable.iter().map(|amp| group(*amp, knobs)).collect();
        let later = per_group * viable.len() * (passes.len() - i - 1) + after;
        stages.run(groups, later, explored)?;
    }
    explored.left_at_most = after;
    Ok(())
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
    /// Whether the first evaluation is the smallest batch: in a stage that
    /// runs because nothing fitted before it, most groups fit nowhere, and
    /// an out-of-memory at the smallest batch decides the whole group at
    /// once (memory grows with the batch). The boundary found is the one
    /// the plain binary search finds.
    smallest_first: bool,
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
            smallest_first: false,
        }
    }

    /// This group starting at its smallest batch (see the field).
    fn smallest_first(mut self) -> GroupSearch {
        self.smallest_first = true;
        self
    }

    fn searching(&self, exhaustive: bool) -> bool {
        if exhaustive {
            self.next_exhaustive < self.hi
        } else {
            self.lo < self.hi
        }
    }

    /// The most evaluations this group may still make, a pending one
    /// included.
    fn max_evaluations(&self, exhaustive: bool) -> usize {
        if exhaustive {
            return self.hi.saturating_sub(self.next_exhaustive);
        }
        let span = self.hi.saturating_sub(self.lo);
        if self.smallest_first && self.evaluated == 0 && span > 0 {
            1 + binary_search_bound(span - 1)
        } else {
            binary_search_bound(span)
        }
    }

    /// The index of the batch to evaluate next, when none is pending.
    fn next(&self, exhaustive: bool) -> Option<usize> {
        (!self.pending && self.searching(exhaustive)).then(|| {
            if exhaustive {
                self.next_exhaustive
            } else if self.smallest_first && self.evaluated == 0 {
                self.lo
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

    /// `record` decided the batch at `mid`.
    fn decide(&mut self, mid: usize, record: &TrialRecord, exhaustive: bool) {
        let fits = record.fits();
        let probe = self.smallest_first && self.evaluated == 0;
        self.pending = false;
        self.evaluated += 1;
        if exhaustive {
            self.next_exhaustive += 1;
        } else if probe && record.status == super::record::CandidateStatus::Infeasible {
            // The smallest batch cannot train at all (BatchNorm over one
            // value): no verdict on memory; the larger batches are searched.
            self.lo = mid + 1;
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
    let _ = crate::worker::launcher::take_launched_jobs();
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
        slurm_jobs: crate::worker::launcher::take_launched_jobs(),
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
                    .map(|g| g.max_evaluations(exhaustive))
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
                        groups[g].decide(mid, &record, exhaustive);
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
                        crate::worker::stop_running_workers();
                        failure = Some(e);
                    }
                }
                // A Slurm controller gone fails every further trial alike:
                // the search stops (exit 2) rather than judge by the rest.
                if let (None, Some(why)) = (&failure, crate::worker::launcher::controller_lost()) {
                    crate::worker::stop_running_workers();
                    failure = Some(crate::error::Error::environment(format!(
                        "the search stopped: {why}"
                    )));
                }
                groups[done.group].decide(done.mid, &done.record, exhaustive);
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
pub fn rank(mut feasible: Vec<Outcome>, ranking: impl Into<Ranking>) -> Vec<Outcome> {
    let ranking = ranking.into();
    feasible.sort_by(|a, b| order(a, b, ranking));
    feasible
}

/// How feasible candidates are ordered: the objective, and what of the
/// recipe a candidate keeps (its effective batch, its precision) before
/// its speed, so the winner changes only what must change to fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranking {
    pub objective: Objective,
    /// The recipe's precision, preferred over a faster one (`None`: speed
    /// decides between precisions, as `--amp` or `--objective throughput`
    /// on a card with fast half precision allow).
    pub keep_precision: Option<Amp>,
    /// The recipe's effective batch and the GPUs: a candidate that keeps
    /// it ranks above one that needs `auto_scale_lr` (`None`: not ranked).
    pub effective_batch: Option<(i64, i64)>,
}

impl From<Objective> for Ranking {
    fn from(objective: Objective) -> Ranking {
        Ranking {
            objective,
            keep_precision: None,
            effective_batch: None,
        }
    }
}

/// The ranking's order of two feasible outcomes ([`rank`]).
pub fn order(a: &Outcome, b: &Outcome, ranking: impl Into<Ranking>) -> std::cmp::Ordering {
    let ranking = ranking.into();
    let ips = |o: &Outcome| o.record.images_per_s.unwrap_or(0.0);
    let fidelity = |o: &Outcome| recipe_fidelity(o.candidate.knobs());
    let keeps_batch = |o: &Outcome| {
        ranking
            .effective_batch
            .is_some_and(|(n, gpus)| o.candidate.effective_batch(gpus) == n)
    };
    let keeps_precision = |o: &Outcome| ranking.keep_precision == Some(o.candidate.amp);
    let by_crop =
        (b.candidate.crop.0 * b.candidate.crop.1).cmp(&(a.candidate.crop.0 * a.candidate.crop.1));
    let by_speed = ips(b).total_cmp(&ips(a));
    let by_fidelity = fidelity(b).cmp(&fidelity(a));
    let by_batch = keeps_batch(b).cmp(&keeps_batch(a));
    let by_precision = keeps_precision(b).cmp(&keeps_precision(a));
    match ranking.objective {
        Objective::KeepCrop => by_crop
            .then(by_fidelity)
            .then(by_batch)
            .then(by_precision)
            .then(by_speed),
        Objective::Throughput => by_precision.then(by_speed).then(by_crop),
    }
}

#[cfg(test)]
#[path = "strategy_tests.rs"]
mod tests;
