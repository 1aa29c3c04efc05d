//! `segtune search`: the best feasible training config for a GPU budget.
//!
//! The space (batch x crop x AMP, accumulation keeping the recipe's
//! effective batch) is searched per (crop, AMP) by binary search over the
//! batch sizes, using that memory grows with the batch: above an
//! out-of-memory nothing is tried, below a fit everything fits. With the
//! default objective (keep-crop) smaller crops are only tried when nothing
//! fits at the recipe's. On a CUDA device each candidate is a short real
//! training trial in its own process; without one, each is predicted from
//! CPU traces (see `predict`), and says so. Every finished trial goes to the
//! journal at once; a re-run redoes none.

pub mod command;
pub mod emit;
pub mod journal;
pub mod space;

use crate::predict::estimate::{batch_tensors, cublas_workspace_bytes};
use crate::predict::extrapolate::extrapolate;
use crate::predict::replay::{replay, ReplayInputs};
use crate::predict::trace::{phase_of, Phase, TraceEvent};
use journal::Journal;
use space::{Amp, Candidate};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;

/// The search settings: from the CLI, or a `segtune` section of the config.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SearchSpec {
    /// GPU memory (`4G`, `4096MiB`, ...; binary units) — or use `preset`.
    pub vram: Option<String>,
    /// A shipped GPU preset (`rtx3050ti`, `rtx2070`, `rtx3090`, `rtx4090`, `h200`).
    pub preset: Option<String>,
    /// Fraction of the VRAM kept free (default 0.05).
    pub margin: Option<f64>,
    /// `keep-crop` (default) or `throughput`.
    pub objective: Option<String>,
    /// `auto` (default), `cpu` (predict) or `cuda:N` (measure).
    pub device: Option<String>,
    /// Compute capability of a `vram` budget (e.g. "8.6").
    pub compute_capability: Option<String>,
    /// GPUs training data-parallel (default 1): the batch is per GPU, the
    /// effective batch is batch x accumulation x gpus, and every GPU holds
    /// DDP's gradient buckets.
    pub gpus: Option<i64>,
}

/// One evaluated candidate.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct TrialRecord {
    /// `fits`, `oom`, `error`, `non_finite_loss`, `timeout`.
    pub status: String,
    pub reason: Option<String>,
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    /// Reserved + CUDA context, compared with the usable budget.
    pub device_bytes: Option<u64>,
    pub images_per_s: Option<f64>,
    /// `measured` (a CUDA trial) or `predicted` (from CPU traces).
    pub mode: String,
}

impl TrialRecord {
    pub fn fits(&self) -> bool {
        self.status == "fits"
    }

    /// An infeasible candidate without figures.
    pub fn failed(status: &str, reason: String, mode: &str) -> TrialRecord {
        TrialRecord {
            status: status.into(),
            reason: Some(reason),
            peak_allocated_bytes: None,
            peak_reserved_bytes: None,
            device_bytes: None,
            images_per_s: None,
            mode: mode.into(),
        }
    }
}

/// How candidates are evaluated.
pub trait Evaluator {
    fn evaluate(&mut self, c: &Candidate) -> TrialRecord;
    fn mode(&self) -> &'static str;
    /// CPU traces run so far (predicted mode).
    fn traces_run(&self) -> usize {
        0
    }
}

/// The GPU a search targets.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct Budget {
    pub gpu: String,
    pub vram_bytes: u64,
    pub compute_capability: String,
    pub bf16: bool,
    pub fp16_tflops: f64,
    pub fp32_tflops: f64,
    pub bf16_tflops: f64,
    pub bandwidth_gbs: f64,
    pub margin: f64,
    pub cuda_context_bytes: u64,
    /// VRAM x (1 - margin): what reserved memory + context may use.
    pub usable_bytes: u64,
}

/// Traces of one (crop, precision) at batch 1 and 2, and what they imply.
struct TracePair {
    one: Vec<TraceEvent>,
    two: Vec<TraceEvent>,
    flops: (f64, f64),
    step_bytes: (f64, f64),
}

fn step_bytes(events: &[TraceEvent]) -> f64 {
    let last = events
        .iter()
        .map(|e| phase_of(e.phase).0)
        .max()
        .unwrap_or(0);
    events
        .iter()
        .filter(|e| {
            e.bytes > 0 && phase_of(e.phase).0 == last && phase_of(e.phase).1 != Phase::Data
        })
        .map(|e| e.bytes as f64)
        .sum()
}

/// Function that traces a step: (batch, crop, precision) -> (events, forward FLOPs).
pub type Tracer = Box<dyn FnMut(i64, (i64, i64), Amp) -> Result<(Vec<TraceEvent>, f64), String>>;

/// Predicts candidates from CPU traces (two per crop and precision).
pub struct PredictedEvaluator {
    budget: Budget,
    tracer: Tracer,
    pairs: HashMap<((i64, i64), Amp), Result<TracePair, String>>,
    pub traces_run: usize,
}

impl PredictedEvaluator {
    pub fn new(budget: Budget, tracer: Tracer) -> PredictedEvaluator {
        PredictedEvaluator {
            budget,
            tracer,
            pairs: HashMap::new(),
            traces_run: 0,
        }
    }

    fn pair(&mut self, crop: (i64, i64), amp: Amp) -> &Result<TracePair, String> {
        // fp16 and bf16 keep the same tensors in half precision (2 bytes):
        // one CPU trace (bf16 autocast) stands for both.
        let traced = if amp == Amp::Off { Amp::Off } else { Amp::Bf16 };
        if !self.pairs.contains_key(&(crop, traced)) {
            let mut run = |b: i64| -> Result<(Vec<TraceEvent>, f64), String> {
                self.traces_run += 1;
                (self.tracer)(b, crop, traced)
            };
            let (ba, bb) = crate::predict::extrapolate::TRACED_BATCHES;
            let pair = run(ba).and_then(|(one, f1)| {
                let (two, f2) = run(bb)?;
                let (s1, s2) = (step_bytes(&one), step_bytes(&two));
                Ok(TracePair {
                    one,
                    two,
                    flops: (f1, f2),
                    step_bytes: (s1, s2),
                })
            });
            self.pairs.insert((crop, traced), pair);
        }
        &self.pairs[&(crop, traced)]
    }

    /// Step time from FLOPs and bytes against the GPU's peak rates (an
    /// estimate for ranking only: 40% of peak FLOPs, 60% of bandwidth).
    fn images_per_s(&self, c: &Candidate, flops: f64, bytes: f64) -> f64 {
        let tflops = match c.amp {
            Amp::Off => self.budget.fp32_tflops,
            Amp::Fp16 => self.budget.fp16_tflops,
            Amp::Bf16 => self.budget.bf16_tflops,
        };
        let compute = 3.0 * flops / (tflops.max(0.1) * 1e12 * 0.4);
        let memory = 2.0 * bytes / (self.budget.bandwidth_gbs.max(1.0) * 1e9 * 0.6);
        c.batch_size as f64 / (compute + memory)
    }
}

fn lerp(pair: (f64, f64), batch: i64) -> f64 {
    let (ba, bb) = crate::predict::extrapolate::TRACED_BATCHES;
    pair.0 + (pair.1 - pair.0) * (batch - ba) as f64 / (bb - ba) as f64
}

impl Evaluator for PredictedEvaluator {
    fn mode(&self) -> &'static str {
        "predicted"
    }

    fn traces_run(&self) -> usize {
        self.traces_run
    }

    fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
        let budget = self.budget.clone();
        let failed =
            |status: &str, reason: String| TrialRecord::failed(status, reason, "predicted");
        let (events, flops, bytes) = match self.pair(c.crop, c.amp) {
            Err(e) => return failed("error", e.clone()),
            Ok(p) => {
                let (ba, bb) = crate::predict::extrapolate::TRACED_BATCHES;
                // The traced batch sizes replay their own trace, without a copy.
                let events = if c.batch_size == ba {
                    Ok(Cow::Borrowed(p.one.as_slice()))
                } else if c.batch_size == bb {
                    Ok(Cow::Borrowed(p.two.as_slice()))
                } else {
                    extrapolate(&p.one, &p.two, c.batch_size).map(Cow::Owned)
                };
                (
                    events,
                    lerp(p.flops, c.batch_size),
                    lerp(p.step_bytes, c.batch_size),
                )
            }
        };
        let events = match events {
            Ok(e) => e,
            Err(e) => return failed("error", e),
        };
        let capacity = budget
            .usable_bytes
            .saturating_sub(budget.cuda_context_bytes);
        let inputs = ReplayInputs {
            batch_copies: batch_tensors(c.batch_size, c.crop),
            cublas_workspace: cublas_workspace_bytes(&budget.compute_capability),
            capacity: Some(capacity),
        };
        let r = replay(&events, &inputs);
        let device = r.peak_reserved + budget.cuda_context_bytes;
        let mut record = TrialRecord {
            status: "fits".into(),
            reason: None,
            peak_allocated_bytes: Some(r.peak_allocated),
            peak_reserved_bytes: Some(r.peak_reserved),
            device_bytes: Some(device),
            images_per_s: Some(self.images_per_s(c, flops, bytes)),
            mode: "predicted".into(),
        };
        if r.out_of_memory || device > budget.usable_bytes {
            record.status = "oom".into();
            record.reason = Some(format!(
                "predicted out of memory: needs more than the usable {:.2} GiB",
                budget.usable_bytes as f64 / (1u64 << 30) as f64
            ));
        }
        record
    }
}

/// Measures candidates with real CUDA trials, each in its own process.
pub struct CudaEvaluator {
    pub config: PathBuf,
    pub cfg_options: Vec<String>,
    pub device: usize,
    pub budget: Budget,
    pub timeout: std::time::Duration,
    /// GPUs of the data-parallel run the trial stands for (DDP's buckets).
    pub gpus: i64,
}

impl Evaluator for CudaEvaluator {
    fn mode(&self) -> &'static str {
        "measured"
    }

    fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
        let failed = |status: &str, reason: String| TrialRecord::failed(status, reason, "measured");
        let worker = match crate::cli::worker_path() {
            Ok(w) => w,
            Err(e) => return failed("error", e),
        };
        let mut cmd = std::process::Command::new(worker);
        cmd.arg("trial")
            .arg(&self.config)
            .args([
                "--batch-size",
                &c.batch_size.to_string(),
                "--crop",
                &format!("{}x{}", c.crop.0, c.crop.1),
            ])
            .args([
                "--amp",
                c.amp.name(),
                "--accum",
                &c.accumulation.to_string(),
                "--warmup",
                "1",
                "--steps",
                "2",
            ])
            .args(["--device", &format!("cuda:{}", self.device), "--json"])
            .args(["--gpus", &self.gpus.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if !self.cfg_options.is_empty() {
            cmd.arg("--cfg-options").args(&self.cfg_options);
        }
        let mut child = match cmd.spawn() {
            Ok(ch) => ch,
            Err(e) => return failed("error", format!("cannot start the trial: {e}")),
        };
        let started = std::time::Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if started.elapsed() > self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return failed(
                        "timeout",
                        format!("no result within {} s", self.timeout.as_secs()),
                    );
                }
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(100)),
                Err(e) => return failed("error", e.to_string()),
            }
        }
        let out = match child.wait_with_output() {
            Ok(o) => o,
            Err(e) => return failed("error", e.to_string()),
        };
        let report: serde_json::Value = match serde_json::from_slice(&out.stdout) {
            Ok(r) => r,
            Err(_) => {
                return failed(
                    "error",
                    format!(
                        "the trial crashed: {}",
                        String::from_utf8_lossy(&out.stderr)
                            .lines()
                            .last()
                            .unwrap_or("")
                    ),
                )
            }
        };
        let status = report["status"].as_str().unwrap_or("error");
        if status != "ok" {
            return failed(status, report["message"].as_str().unwrap_or("").to_string());
        }
        let reserved = report["cuda_peak_reserved_bytes"].as_u64().unwrap_or(0);
        let device = reserved + self.budget.cuda_context_bytes;
        let mut record = TrialRecord {
            status: "fits".into(),
            reason: None,
            peak_allocated_bytes: report["cuda_peak_allocated_bytes"].as_u64(),
            peak_reserved_bytes: Some(reserved),
            device_bytes: Some(device),
            images_per_s: report["images_per_s"].as_f64(),
            mode: "measured".into(),
        };
        if device > self.budget.usable_bytes {
            record.status = "oom".into();
            record.reason = Some("ran, but above the usable budget (VRAM minus the margin)".into());
        }
        record
    }
}

impl Evaluator for Box<dyn Evaluator> {
    fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
        (**self).evaluate(c)
    }
    fn mode(&self) -> &'static str {
        (**self).mode()
    }
    fn traces_run(&self) -> usize {
        (**self).traces_run()
    }
}

/// Wraps an evaluator so that every n-th trial fails (a test hook:
/// `SEGTUNE_TEST_FAIL_EVERY=n`).
pub struct FailEvery<E> {
    pub inner: E,
    pub every: usize,
    pub count: usize,
}

impl<E: Evaluator> Evaluator for FailEvery<E> {
    fn mode(&self) -> &'static str {
        self.inner.mode()
    }
    fn traces_run(&self) -> usize {
        self.inner.traces_run()
    }
    fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
        self.count += 1;
        if self.every > 0 && self.count.is_multiple_of(self.every) {
            return TrialRecord::failed(
                "error",
                "the trial process crashed (injected by SEGTUNE_TEST_FAIL_EVERY)".into(),
                self.inner.mode(),
            );
        }
        self.inner.evaluate(c)
    }
}

/// A candidate with its outcome.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct Outcome {
    pub candidate: Candidate,
    pub record: TrialRecord,
    /// Whether this run evaluated it (false: from the journal).
    pub ran_now: bool,
}

/// What a search found.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct SearchResult {
    pub config: String,
    pub budget: Budget,
    /// GPUs training data-parallel; `budget` is per GPU.
    pub gpus: i64,
    pub recipe: space::Recipe,
    pub objective: String,
    pub mode: String,
    /// Ranked feasible candidates, best first.
    pub feasible: Vec<Outcome>,
    pub infeasible: Vec<Outcome>,
    /// Candidates in the full grid.
    pub grid_size: usize,
    /// Candidates evaluated by this run (not from the journal).
    pub trials_run: usize,
    /// Candidates taken from the journal.
    pub trials_resumed: usize,
    /// CPU traces run for the predictions.
    pub traces_run: usize,
    pub winner: Option<Outcome>,
    /// Files written for the winner.
    pub emitted: Vec<String>,
    pub cfg_options: Option<String>,
    /// Set when no batch size keeps the recipe's effective batch.
    pub auto_scale_lr: bool,
    pub journal: String,
}

/// The candidates' axes.
pub struct SearchSpace<'a> {
    /// The recipe's crop first.
    pub crops: &'a [(i64, i64)],
    pub precisions: &'a [Amp],
    /// Ascending.
    pub batches: &'a [i64],
    /// Accumulation for a batch size, and whether it keeps the effective batch.
    pub accumulation: &'a dyn Fn(i64) -> (i64, bool),
}

/// The search loop: binary search of the batch per (crop, precision).
pub fn run_search(
    space: &SearchSpace,
    keep_crop: bool,
    exhaustive: bool,
    evaluator: &mut dyn Evaluator,
    journal: &mut Journal,
    progress: &dyn Fn(&Candidate, &TrialRecord),
) -> Result<(Vec<Outcome>, usize, usize), String> {
    let SearchSpace {
        crops,
        precisions,
        batches,
        accumulation,
    } = space;
    let mut outcomes = Vec::new();
    let (mut ran, mut resumed) = (0usize, 0usize);
    for crop in crops.iter() {
        for amp in precisions.iter() {
            // Invariant: batches[..lo] fit (or are unknown below a fit), batches[hi..] do not.
            let (mut lo, mut hi) = (0usize, batches.len());
            let mut next_exhaustive = 0usize;
            while lo < hi {
                let mid = if exhaustive {
                    next_exhaustive
                } else {
                    (lo + hi) / 2
                };
                let (acc, _) = accumulation(batches[mid]);
                let c = Candidate {
                    batch_size: batches[mid],
                    crop: *crop,
                    amp: *amp,
                    accumulation: acc,
                };
                let (record, now) = match journal.get(&c) {
                    Some(r) => {
                        resumed += 1;
                        (r.clone(), false)
                    }
                    None => {
                        let r = evaluator.evaluate(&c);
                        ran += 1;
                        journal.append(&c, &r)?;
                        (r, true)
                    }
                };
                progress(&c, &record);
                let fits = record.fits();
                outcomes.push(Outcome {
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
        }
        // keep-crop: the largest crop where anything fits wins; smaller crops need no trial.
        let any_fit_here = outcomes
            .iter()
            .any(|o| o.candidate.crop == *crop && o.record.fits());
        if keep_crop && any_fit_here && !exhaustive {
            break;
        }
    }
    Ok((outcomes, ran, resumed))
}

/// Ranks feasible outcomes: keep-crop puts the largest crop first, then
/// throughput; throughput ranks by images/s alone.
pub fn rank(mut feasible: Vec<Outcome>, keep_crop: bool) -> Vec<Outcome> {
    let ips = |o: &Outcome| o.record.images_per_s.unwrap_or(0.0);
    feasible.sort_by(|a, b| {
        let by_crop = (b.candidate.crop.0 * b.candidate.crop.1)
            .cmp(&(a.candidate.crop.0 * a.candidate.crop.1));
        let by_speed = ips(b).total_cmp(&ips(a));
        if keep_crop {
            by_crop.then(by_speed)
        } else {
            by_speed.then(by_crop)
        }
    });
    feasible
}
