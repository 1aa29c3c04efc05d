//! Predict, then confirm, on a fake GPU: the README example searched with
//! `--device cuda` semantics, where a "real trial" is the prediction with
//! its memory off by a known factor (and its speed off by another). With
//! predictions within 5%, at most 3 real trials run.

mod common;

use segtune::predict::Budget;
use segtune::search::evaluate::Evaluator;
use segtune::search::run::predictor;
use segtune::search::space::Candidate;
use segtune::search::{
    search_with, CandidateStatus, Mode, RealTrials, SearchRequest, SearchRun, SearchSpec,
    TrialRecord,
};
use segtune::worker::Worker;
use std::path::Path;

/// A GPU whose trials measure `memory` times the predicted device memory
/// and `speed` times the predicted images/s.
struct FakeGpu {
    request: SearchRequest,
    memory: f64,
    speed: f64,
    devices: usize,
}

struct FakeTrials {
    predictor: Box<dyn Evaluator>,
    budget: Budget,
    memory: f64,
    speed: f64,
}

impl Evaluator for FakeTrials {
    fn mode(&self) -> Mode {
        Mode::Measured
    }

    fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
        let mut r = self.predictor.evaluate(c);
        r.mode = Mode::Measured;
        let scale = |b: Option<u64>| b.map(|b| (b as f64 * self.memory) as u64);
        r.peak_allocated_bytes = scale(r.peak_allocated_bytes);
        r.peak_reserved_bytes = scale(r.peak_reserved_bytes);
        r.device_bytes = scale(r.device_bytes);
        r.images_per_s = r.images_per_s.map(|v| v * self.speed);
        if r.device_bytes.is_some_and(|d| d > self.budget.usable_bytes) {
            r.status = CandidateStatus::Oom;
            r.reason = Some("fake GPU: out of memory".into());
        } else if r.status == CandidateStatus::Oom {
            r.status = CandidateStatus::Fits;
            r.reason = None;
        }
        r
    }
}

impl RealTrials for FakeGpu {
    fn devices(&self) -> usize {
        self.devices
    }

    fn evaluator(&self, _device: usize, budget: &Budget, gpus: i64) -> Box<dyn Evaluator> {
        Box::new(FakeTrials {
            predictor: predictor(
                &self.request,
                &worker(),
                budget,
                segtune::kinds::TrainingSetup {
                    gpus,
                    ..Default::default()
                },
                segtune::predict::estimate::BatchLayout::MmSeg,
                1,
            ),
            budget: budget.clone(),
            memory: self.memory,
            speed: self.speed,
        })
    }
}

fn worker() -> Worker {
    Worker::at(env!("CARGO_BIN_EXE_segtune-torch"))
}

fn request(out: &Path) -> SearchRequest {
    SearchRequest {
        config: common::readme_example(),
        cfg_options: Vec::new(),
        settings: SearchSpec::default(),
        precisions: None,
        mode: segtune::kinds::RunMode::Train,
        exhaustive: false,
        out: out.to_path_buf(),
        run: SearchRun {
            gt_segments: Some(20),
            ..SearchRun::default()
        },
    }
}

/// Copies the journal's predictions (not its measurements) into `to`.
fn copy_predictions(from: &Path, to: &Path) {
    let text = std::fs::read_to_string(from.join("trials.jsonl")).unwrap();
    let kept: String = text
        .lines()
        .filter(|l| l.contains("\"device\":\"predicted:"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::create_dir_all(to).unwrap();
    std::fs::write(to.join("trials.jsonl"), kept).unwrap();
}

#[test]
fn the_readme_example_on_a_gpu_confirms_predictions_within_5_percent_in_at_most_3_trials() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("exact");
    let mut counts = Vec::new();
    for (i, memory) in [1.0, 1.05, 0.95].into_iter().enumerate() {
        let out = dir.path().join(format!("run{i}"));
        if i > 0 {
            // The predictions are the same in every run: reuse them.
            copy_predictions(&first, &out);
        }
        let request = request(if i == 0 { &first } else { &out });
        let gpu = FakeGpu {
            request: request.clone(),
            memory,
            speed: 0.55,
            devices: 1,
        };
        let result = search_with(&request, &worker(), &|_| {}, &gpu).unwrap();
        assert_eq!(result.mode, Mode::Measured);
        let winner = result.winner.as_ref().expect("a winner");
        assert_eq!(winner.record.mode, Mode::Measured);
        assert!(winner.record.fits());
        let predicted = winner.record.predicted.expect("the prediction is kept");
        let device = winner.record.device_bytes.unwrap() as f64;
        let ratio = device / predicted.device_bytes.unwrap() as f64;
        assert!((ratio - memory).abs() < 0.01, "{ratio} vs {memory}");
        assert!(result.predictions_confirmed_from > 0);
        assert!(
            result.trials_run <= 3,
            "memory x{memory}: {} real trials",
            result.trials_run
        );
        // The journal keeps prediction and measurement of each confirmed one.
        let journal = std::fs::read_to_string(&result.journal).unwrap();
        let measured = journal
            .lines()
            .filter(|l| l.contains("\"device\":\"cuda:0"))
            .count();
        assert_eq!(measured, result.trials_run);
        assert!(journal
            .lines()
            .filter(|l| l.contains("\"device\":\"cuda:0"))
            .all(|l| l.contains("\"predicted\":{")));
        // The table shows the prediction beside the measurement.
        let table = segtune::report::search(&result, false);
        assert!(table.contains("predicted GiB"), "{table}");
        counts.push(format!(
            "memory x{memory}: {} predictions, {} real trials, winner batch {} {} {}x{}",
            result.predictions_confirmed_from,
            result.trials_run,
            winner.candidate.batch_size,
            winner.candidate.amp,
            winner.candidate.crop.0,
            winner.candidate.crop.1
        ));
    }
    println!("{}", counts.join("\n"));
}

#[test]
fn two_gpus_confirm_side_by_side_and_find_the_one_gpu_winner() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, devices: usize, memory: f64| {
        let out = dir.path().join(name);
        if name != "one" {
            copy_predictions(&dir.path().join("one"), &out);
        }
        let mut request = request(&out);
        if devices > 1 {
            request.run.placement.devices = Some("all".parse().unwrap());
        }
        let gpu = FakeGpu {
            request: request.clone(),
            memory,
            speed: 0.55,
            devices,
        };
        search_with(&request, &worker(), &|_| {}, &gpu).unwrap()
    };
    let one = run("one", 1, 1.3);
    let two = run("two", 2, 1.3);
    assert_eq!(two.mode, Mode::Measured);
    let key = |r: &segtune::search::SearchResult| r.winner.as_ref().map(|w| w.candidate.key());
    assert_eq!(key(&two), key(&one));
    let journal = std::fs::read_to_string(&two.journal).unwrap();
    let slots: std::collections::BTreeSet<String> = journal
        .lines()
        .filter(|l| l.contains("\"device\":\"cuda:0"))
        .filter_map(|l| {
            let row: serde_json::Value = serde_json::from_str(l).ok()?;
            Some(row["run"]["slot"].to_string())
        })
        .collect();
    assert_eq!(slots.len(), 2, "both GPUs measured: {journal}");
    println!(
        "one GPU: {} real trials; two: {} (winner {:?})",
        one.trials_run,
        two.trials_run,
        key(&two)
    );
}
