//! Predict, then confirm (on a GPU): the candidates are first predicted
//! from CPU traces (no GPU time), then real trials confirm them from the
//! top of the predicted ranking down. The confirmation stops at the first
//! point where the best measured candidate ranks above every prediction not
//! yet measured; predicted throughput is rescaled by what the confirmed
//! trials measured, since the prediction's FLOPs model is only good for
//! ranking. A measured out-of-memory also rules out every larger batch of
//! its crop, precision and knobs without a trial.

use super::evaluate::{evaluate_retrying, Evaluator};
use super::journal::Journal;
use super::record::{CandidateStatus, Outcome, Prediction, TrialRecord};
use super::space::Candidate;
use super::strategy::{evaluate_all, Slot};
use super::strategy::{order, rank, Progress, Ranking, SearchSpace, Step};
use crate::error::Result;

/// What the confirmation did.
pub struct Confirmed {
    /// Measured outcomes, in the order they were measured.
    pub measured: Vec<Outcome>,
    /// Predicted-feasible candidates never measured: ranked below the
    /// winner by their (rescaled) prediction, or above a measured
    /// out-of-memory of their group (then `oom`, with that reason).
    pub unconfirmed: Vec<Outcome>,
    pub ran: usize,
    pub resumed: usize,
}

impl Confirmed {
    /// Whether some measured candidate fits.
    pub fn found(&self) -> bool {
        self.measured.iter().any(|o| o.record.fits())
    }
}

/// Whether `larger` is a larger batch of `oom`'s crop, precision and knobs.
fn above(oom: &Candidate, larger: &Candidate) -> bool {
    larger.crop == oom.crop
        && larger.amp == oom.amp
        && larger.knobs() == oom.knobs()
        && larger.batch_size >= oom.batch_size
}

/// `o` marked out of memory when a measured out-of-memory of its group
/// at a batch no larger rules it out.
fn ruled_out(mut o: Outcome, ooms: &[Candidate]) -> Outcome {
    if let Some(oom) = ooms.iter().find(|oom| above(oom, &o.candidate)) {
        o.record.status = CandidateStatus::Oom;
        o.record.reason = Some(format!(
            "not measured: batch {} of this crop and precision ran out of memory",
            oom.batch_size
        ));
    }
    o
}

/// Measured over predicted images/s of the confirmed candidates (geometric
/// mean), 1 before any.
fn speed_ratio(measured: &[Outcome]) -> f64 {
    let ratios: Vec<f64> = measured
        .iter()
        .filter_map(|o| {
            let p = o.record.predicted?.images_per_s?;
            let m = o.record.images_per_s?;
            (p > 0.0 && m > 0.0).then(|| (m / p).ln())
        })
        .collect();
    if ratios.is_empty() {
        1.0
    } else {
        (ratios.iter().sum::<f64>() / ratios.len() as f64).exp()
    }
}

/// The evaluators and the journal a confirmation uses.
pub struct Confirmation<'a> {
    pub ranking: Ranking,
    /// The batch sizes and accumulation of the search space.
    pub space: &'a SearchSpace<'a>,
    /// Predicts a batch the predicted search skipped (below a measured
    /// out-of-memory).
    pub predictor: &'a mut dyn Evaluator,
    /// One per device: the best open predictions are measured this many
    /// at once.
    pub measurers: Vec<Slot<'a>>,
    /// Its current device is the measuring one.
    pub journal: &'a mut Journal,
    /// The journal's device of the predictions.
    pub predicted_device: &'a str,
    pub progress: Progress<'a>,
}

impl Confirmation<'_> {
    /// The prediction of `c` from the journal, else predicted and
    /// appended; with whether it was predicted now.
    fn predict(&mut self, c: &Candidate) -> Result<(TrialRecord, bool)> {
        let measured_device = self.journal.device().to_string();
        self.journal.set_device(self.predicted_device);
        let result = match self.journal.get(c) {
            Some(r) => Ok((r.clone(), false)),
            None => {
                let r = evaluate_retrying(&mut *self.predictor, c);
                self.journal.append(c, &r).map(|()| (r, true))
            }
        };
        self.journal.set_device(&measured_device);
        result
    }

    /// The measured records of `batch` (each with its prediction
    /// attached): from the journal, else measured, as many at once as there
    /// are measurers, and appended in order; with whether each was measured
    /// now.
    fn measure(&mut self, batch: &[(Candidate, Prediction)]) -> Result<Vec<(TrialRecord, bool)>> {
        let known: Vec<Option<TrialRecord>> = batch
            .iter()
            .map(|(c, _)| self.journal.get(c).cloned())
            .collect();
        let to_run: Vec<Candidate> = batch
            .iter()
            .zip(&known)
            .filter(|(_, k)| k.is_none())
            .map(|((c, _), _)| *c)
            .collect();
        let mut ran = evaluate_all(&mut self.measurers, &to_run).into_iter();
        let mut out = Vec::with_capacity(batch.len());
        for ((c, prediction), known) in batch.iter().zip(known) {
            match known {
                Some(r) => out.push((r, false)),
                None => {
                    let (mut r, run) = ran.next().expect("one record per candidate run");
                    r.predicted = Some(*prediction);
                    self.journal.append_run(c, &r, Some(&run))?;
                    out.push((r, true));
                }
            }
        }
        Ok(out)
    }

    /// The next smaller batch of `oom`'s group, predicted, when the
    /// predicted search skipped it and it is predicted to fit.
    fn predict_below(&mut self, oom: &Candidate, known: &[Candidate]) -> Result<Option<Outcome>> {
        let Some(batch) = self
            .space
            .batches
            .iter()
            .rev()
            .find(|b| **b < oom.batch_size)
        else {
            return Ok(None);
        };
        let c = Candidate {
            batch_size: *batch,
            accumulation: (self.space.accumulation)(*batch).0,
            ..*oom
        };
        if known.iter().any(|k| k.key() == c.key()) {
            return Ok(None);
        }
        let (record, now) = self.predict(&c)?;
        Ok(record.fits().then_some(Outcome {
            candidate: c,
            record,
            ran_now: now,
        }))
    }
}

/// Confirms `predicted` (feasible predictions) with real trials, best
/// prediction first.
pub fn confirm(predicted: Vec<Outcome>, cx: &mut Confirmation) -> Result<Confirmed> {
    let objective = cx.ranking;
    let mut queue = rank(predicted, objective);
    let mut known: Vec<Candidate> = queue.iter().map(|o| o.candidate).collect();
    let mut done = Confirmed {
        measured: Vec::new(),
        unconfirmed: Vec::new(),
        ran: 0,
        resumed: 0,
    };
    let mut ooms: Vec<Candidate> = Vec::new();
    let width = cx.measurers.len().max(1);
    while !queue.is_empty() {
        // The best open predictions, one per measurer, measured at once; then
        // taken in the ranking's order, as one at a time would.
        let mut batch: Vec<Outcome> = Vec::new();
        while batch.len() < width && !queue.is_empty() {
            let next = queue.remove(0);
            if ooms.iter().any(|oom| above(oom, &next.candidate)) {
                done.unconfirmed.push(ruled_out(next, &ooms));
            } else {
                batch.push(next);
            }
        }
        let predictions: Vec<(Candidate, Prediction)> = batch
            .iter()
            .map(|o| {
                let prediction = Prediction {
                    device_bytes: o.record.device_bytes,
                    images_per_s: o.record.images_per_s,
                };
                (o.candidate, prediction)
            })
            .collect();
        let records = cx.measure(&predictions)?;
        // Set once the best measured beats every open prediction: the rest
        // of this batch was measured already and is kept as measured.
        let mut settled = false;
        for ((c, prediction), (mut record, now)) in predictions.into_iter().zip(records) {
            if now {
                done.ran += 1;
            } else {
                done.resumed += 1;
            }
            record.predicted.get_or_insert(prediction);
            if record.status == CandidateStatus::Oom {
                ooms.push(c);
                if !settled {
                    if let Some(below) = cx.predict_below(&c, &known)? {
                        known.push(below.candidate);
                        queue.push(below);
                        queue = rank(queue, objective);
                    }
                }
            }
            let open = |o: &&Outcome| !ooms.iter().any(|oom| above(oom, &o.candidate));
            (cx.progress)(&Step {
                candidate: &c,
                record: &record,
                resumed: !now,
                done: done.measured.len() + 1,
                left_at_most: queue.iter().filter(open).count(),
            });
            done.measured.push(Outcome {
                candidate: c,
                record,
                ran_now: now,
            });
            if settled {
                continue;
            }
            let ratio = speed_ratio(&done.measured);
            let rescaled = |o: &Outcome| {
                let mut o = o.clone();
                o.record.images_per_s = o.record.images_per_s.map(|v| v * ratio);
                o
            };
            let fitting = done.measured.iter().filter(|o| o.record.fits()).cloned();
            let best = rank(fitting.collect(), objective);
            let Some(best) = best.first() else {
                continue;
            };
            let beats_the_rest = queue
                .iter()
                .filter(open)
                .all(|o| order(best, &rescaled(o), objective) != std::cmp::Ordering::Greater);
            if beats_the_rest {
                let rest: Vec<Outcome> = queue
                    .drain(..)
                    .map(|o| ruled_out(rescaled(&o), &ooms))
                    .collect();
                done.unconfirmed.extend(rest);
                settled = true;
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::record::Mode;
    use crate::search::space::Amp;
    use crate::search::spec::Objective;
    use crate::search::strategy::run_search;

    const AREA: f64 = 512.0 * 512.0;

    /// Memory in units of one fp32 512x512 image, `memory` times the truth;
    /// images/s `speed` times the truth (each precision its own factor).
    struct Fake {
        capacity: f64,
        memory: f64,
        speed: [f64; 3],
        mode: Mode,
        evaluated: usize,
    }

    impl Evaluator for Fake {
        fn mode(&self) -> Mode {
            self.mode
        }
        fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
            self.evaluated += 1;
            let area = (c.crop.0 * c.crop.1) as f64;
            let (half, amp_speed, factor) = match c.amp {
                Amp::Off => (1.0, 1.0, self.speed[0]),
                Amp::Fp16 => (0.5, 1.8, self.speed[1]),
                Amp::Bf16 => (0.5, 1.7, self.speed[2]),
            };
            let need = c.batch_size as f64 * area / AREA * half * self.memory;
            let mut r = TrialRecord::failed(CandidateStatus::Oom, "too big".into(), self.mode);
            r.device_bytes = Some((need * 1e9) as u64);
            if need <= self.capacity {
                r.status = CandidateStatus::Fits;
                r.reason = None;
                let per_image = AREA / area * amp_speed / (1.0 + 0.02 * c.batch_size as f64);
                r.images_per_s = Some(c.batch_size as f64 * per_image * factor);
            }
            r
        }
    }

    /// Predicts the space with `predicted`, then confirms with `measured`.
    fn predict_then_confirm(predicted: &mut Fake, measured: &mut Fake) -> Confirmed {
        predict_then_confirm_on(predicted, vec![measured])
    }

    /// [`predict_then_confirm`] with several measurers at once.
    fn predict_then_confirm_on(predicted: &mut Fake, measured: Vec<&mut Fake>) -> Confirmed {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path(), "hash", "predicted").unwrap();
        let space = SearchSpace {
            crops: &[(512, 512), (384, 384)],
            precisions: &[Amp::Off, Amp::Fp16, Amp::Bf16],
            batches: &[1, 2, 3, 4, 5, 6, 7, 8],
            accumulation: &|b| (16 / b, 16 % b == 0),
            fallbacks: &[],
            knobs: crate::search::space::ModelKnobs::default(),
        };
        let explored = run_search(
            &space,
            Objective::KeepCrop,
            false,
            predicted,
            &mut journal,
            &|_| {},
        )
        .unwrap();
        journal.set_device("cuda:0");
        let fits = explored.outcomes.into_iter().filter(|o| o.record.fits());
        let measurers: Vec<Slot> = measured.into_iter().map(|m| m as Slot).collect();
        let mut cx = Confirmation {
            ranking: Objective::KeepCrop.into(),
            space: &space,
            predictor: predicted,
            measurers,
            journal: &mut journal,
            predicted_device: "predicted",
            progress: &|_| {},
        };
        confirm(fits.collect(), &mut cx).unwrap()
    }

    fn fake(capacity: f64, memory: f64, speed: [f64; 3], mode: Mode) -> Fake {
        Fake {
            capacity,
            memory,
            speed,
            mode,
            evaluated: 0,
        }
    }

    fn winner(confirmed: &Confirmed) -> Outcome {
        let fits = confirmed.measured.iter().filter(|o| o.record.fits());
        rank(fits.cloned().collect(), Objective::KeepCrop)[0].clone()
    }

    #[test]
    fn predictions_within_five_percent_need_at_most_three_real_trials() {
        for memory in [0.95, 1.0, 1.05] {
            for speed in [[0.6, 0.6, 0.6], [0.57, 0.63, 0.6], [0.63, 0.57, 0.6]] {
                let mut predicted = fake(5.5, 1.0, [1.0; 3], Mode::Predicted);
                let mut measured = fake(5.5, memory, speed, Mode::Measured);
                let confirmed = predict_then_confirm(&mut predicted, &mut measured);
                assert!(
                    measured.evaluated <= 3,
                    "{memory} {speed:?}: {} real trials",
                    measured.evaluated
                );
                let w = winner(&confirmed);
                assert_eq!((w.candidate.crop, w.candidate.batch_size), ((512, 512), 8));
                assert_eq!(w.record.mode, Mode::Measured);
                let p = w.record.predicted.expect("the prediction is kept");
                assert!(p.device_bytes.is_some() && p.images_per_s.is_some());
                assert!(confirmed
                    .unconfirmed
                    .iter()
                    .all(|o| o.record.mode == Mode::Predicted));
            }
        }
    }

    #[test]
    fn a_measured_out_of_memory_rules_out_the_larger_batches_of_its_group() {
        // Predictions 30% low: fp16 and bf16 at batch 8 and 7 run out of
        // memory when measured (4.2 and 4.55 > 4.2); batch 6 fits (3.9).
        let mut predicted = fake(4.2, 1.0, [1.0; 3], Mode::Predicted);
        let mut measured = fake(4.2, 1.3, [0.6; 3], Mode::Measured);
        let confirmed = predict_then_confirm(&mut predicted, &mut measured);
        let w = winner(&confirmed);
        assert_eq!((w.candidate.batch_size, w.candidate.amp), (6, Amp::Fp16));
        assert_eq!(measured.evaluated, 5, "b8 and b7 in fp16 and bf16, then b6");
        assert!(confirmed
            .measured
            .iter()
            .filter(|o| !o.record.fits())
            .all(|o| o.candidate.batch_size >= 7));
    }

    #[test]
    fn nothing_predicted_feasible_leaves_the_choice_to_the_caller() {
        let mut predicted = fake(1.0, 100.0, [1.0; 3], Mode::Predicted);
        let mut measured = fake(1.0, 1.0, [1.0; 3], Mode::Measured);
        let confirmed = predict_then_confirm(&mut predicted, &mut measured);
        assert!(!confirmed.found());
        assert_eq!(measured.evaluated, 0);
    }

    #[test]
    fn two_devices_confirm_the_best_predictions_two_at_a_time() {
        for memory in [0.95, 1.05, 1.3] {
            let mut predicted = fake(4.2, 1.0, [1.0; 3], Mode::Predicted);
            let mut one = fake(4.2, memory, [0.6; 3], Mode::Measured);
            let serial = predict_then_confirm(&mut predicted, &mut one);
            let mut predicted = fake(4.2, 1.0, [1.0; 3], Mode::Predicted);
            let (mut a, mut b) = (
                fake(4.2, memory, [0.6; 3], Mode::Measured),
                fake(4.2, memory, [0.6; 3], Mode::Measured),
            );
            let parallel = predict_then_confirm_on(&mut predicted, vec![&mut a, &mut b]);
            assert_eq!(
                winner(&parallel).candidate,
                winner(&serial).candidate,
                "memory x{memory}"
            );
            // Both devices measured; at most one batch of two beyond the serial count.
            assert!(a.evaluated > 0 && b.evaluated > 0, "memory x{memory}");
            let total = a.evaluated + b.evaluated;
            assert!(
                total >= one.evaluated && total <= one.evaluated + 1,
                "{total} trials on two devices, {} on one (memory x{memory})",
                one.evaluated
            );
        }
    }
}
