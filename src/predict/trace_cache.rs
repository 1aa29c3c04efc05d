//! Traced steps kept on disk, so that a step traced once is not traced
//! again: a trace does not depend on the GPU (the budget, the card's cuDNN
//! and kernels enter only when it is replayed), so one trace serves every
//! preset of `segtune atlas` and every re-run of a search (`--trace-cache`).
//!
//! A trace is keyed by what decides it: the resolved config (its JSON
//! dump, which includes the candidate's knobs and accumulation through
//! `--cfg-options`), batch, crop, precision, synthetic label segments, GPUs
//! and PyTorch release, trace kind, mode, and the worker that traced it
//! (its path, size and modification time: a rebuilt segtune traces anew).
//! The config's file name is not in the key: two files resolving to one
//! model share their traces. Entries are written whole (a temporary file,
//! then a rename); one that does not read is a miss. A step that cannot
//! run (a batch of one under BatchNorm, a crop the model refuses) keeps its
//! reason instead (`KEY.failed`): it fails alike on every GPU.

use super::step_trace::{StepToTrace, TracedStep};
use crate::config::{dump, Value};
use crate::trial::worker::Worker;
use crate::trial::RunMode;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Bump when what a trace holds changes.
const FORMAT: u32 = 1;

/// A directory of traced steps, with its hits and misses so far.
#[derive(Debug)]
pub struct TraceCache {
    dir: PathBuf,
    hits: AtomicUsize,
    misses: AtomicUsize,
    /// The steps read or stored last, newest at the back: an atlas's
    /// searches of one config on each GPU ask for the same steps in turn,
    /// and reading a large trace back costs more than replaying it.
    recent: Mutex<VecDeque<(String, Arc<TracedStep>)>>,
}

/// How many traced steps [`TraceCache`] keeps in memory (a config's steps
/// over every GPU of an atlas, for the configs searched at once).
const KEPT_IN_MEMORY: usize = 64;

/// Top-level config keys a training step never reads (the loops, the
/// learning-rate schedule, hooks, logging, evaluation, the test pipeline,
/// segtune's own search settings), left out of a training step's key.
const NOT_IN_A_TRAINING_STEP: &[&str] = &[
    "train_cfg",
    "val_cfg",
    "test_cfg",
    "param_scheduler",
    "default_hooks",
    "custom_hooks",
    "log_processor",
    "log_level",
    "visualizer",
    "vis_backends",
    "val_dataloader",
    "test_dataloader",
    "val_evaluator",
    "test_evaluator",
    "test_pipeline",
    "tta_model",
    "tta_pipeline",
    "img_ratios",
    "work_dir",
    "load_from",
    "resume",
    "launcher",
    "segtune",
];

impl TraceCache {
    /// The cache in `dir` (created when the first trace is stored).
    pub fn new(dir: impl Into<PathBuf>) -> TraceCache {
        TraceCache {
            dir: dir.into(),
            hits: AtomicUsize::new(0),
            misses: AtomicUsize::new(0),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Lookups answered from the cache, and lookups that were not.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// The key of `step` traced by `worker`; `None` when its config does not
    /// resolve (the worker will say why).
    pub fn key(&self, worker: &Worker, step: &StepToTrace) -> Option<String> {
        let mut cfg = crate::config::resolve(step.config, step.cfg_options).ok()?;
        if step.mode == RunMode::Train {
            // The schedule, the hooks and evaluation do not enter a training
            // step: configs that differ only there (MMSeg's 40k/80k/160k
            // variants) share their traces.
            for key in NOT_IN_A_TRAINING_STEP {
                cfg.shift_remove(*key);
            }
        }
        let stamp = worker.stamp();
        let text = format!(
            "{FORMAT}|{stamp}|{}|b{}|{}x{}|{}|segments{:?}|gpus{}|torch{}|{}|{}|python{:?}",
            dump::to_json(&Value::Dict(cfg)),
            step.batch_size,
            step.crop.0,
            step.crop.1,
            step.amp,
            step.gt_segments,
            step.setup.gpus,
            step.setup.torch,
            step.kind,
            step.mode,
            step.python.map(|p| p.python().display().to_string()),
        );
        Some(dump::hash_text(&text))
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(&key[..2]).join(format!("{key}.json.gz"))
    }

    /// The step kept in memory under `key`, made the newest.
    fn recalled(&self, key: &str) -> Option<TracedStep> {
        let mut recent = self.recent.lock().ok()?;
        let at = recent.iter().position(|(k, _)| k == key)?;
        let entry = recent.remove(at)?;
        let step = TracedStep::clone(&entry.1);
        recent.push_back(entry);
        Some(step)
    }

    /// Keeps `step` in memory under `key`, forgetting the oldest beyond
    /// [`KEPT_IN_MEMORY`].
    fn remember(&self, key: &str, step: &TracedStep) {
        let Ok(mut recent) = self.recent.lock() else {
            return;
        };
        recent.retain(|(k, _)| k != key);
        recent.push_back((key.to_string(), Arc::new(step.clone())));
        while recent.len() > KEPT_IN_MEMORY {
            recent.pop_front();
        }
    }

    /// The trace stored under `key`, if one reads.
    pub fn get(&self, key: &str) -> Option<TracedStep> {
        if let Some(step) = self.recalled(key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(step);
        }
        let found = self.read(key);
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(step) = &found {
            self.remember(key, step);
        }
        found
    }

    /// The trace stored on disk under `key`, if one reads.
    fn read(&self, key: &str) -> Option<TracedStep> {
        std::fs::File::open(self.path(key)).ok().and_then(|f| {
            // Whole, then parsed: serde_json reads a slice many times faster
            // than a reader.
            let mut text = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(f), &mut text).ok()?;
            serde_json::from_slice(&text).ok()
        })
    }

    /// The trace stored under `key` if there is one, without counting a
    /// miss when there is none (a lookup that would not trace).
    pub fn peek(&self, key: &str) -> Option<TracedStep> {
        if let Some(step) = self.recalled(key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(step);
        }
        if self.path(key).exists() {
            self.get(key)
        } else {
            None
        }
    }

    fn failure_path(&self, key: &str) -> PathBuf {
        self.dir.join(&key[..2]).join(format!("{key}.failed"))
    }

    /// Why the step under `key` failed, when it did: a failure that comes
    /// back every time (the step cannot run), stored by [`Self::put_failure`].
    pub fn failure(&self, key: &str) -> Option<String> {
        let message = std::fs::read_to_string(self.failure_path(key)).ok()?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(message)
    }

    /// Stores why the step under `key` cannot run (written whole, as a
    /// trace is).
    pub fn put_failure(&self, key: &str, message: &str) {
        let path = self.failure_path(key);
        let Some(parent) = path.parent() else {
            return;
        };
        if std::fs::create_dir_all(parent).is_err() {
            return;
        }
        let Ok(mut tmp) = tempfile::NamedTempFile::new_in(parent) else {
            return;
        };
        if std::io::Write::write_all(&mut tmp, message.as_bytes()).is_ok() {
            let _ = tmp.persist(&path);
        }
    }

    /// Stores `trace` under `key`; a failure to write only costs a re-trace
    /// later, so it is not an error.
    pub fn put(&self, key: &str, trace: &TracedStep) {
        self.remember(key, trace);
        let path = self.path(key);
        let Some(parent) = path.parent() else {
            return;
        };
        if std::fs::create_dir_all(parent).is_err() {
            return;
        }
        let Ok(tmp) = tempfile::NamedTempFile::new_in(parent) else {
            return;
        };
        // Gzipped JSON: a trace's events compress about tenfold. The JSON
        // reaches the encoder in large blocks: flate2 clears its output
        // buffer on every write, and serde writes a few bytes at a time
        // (that clearing took 80% of an atlas's own CPU).
        let gz = flate2::write::GzEncoder::new(tmp, flate2::Compression::fast());
        let mut json = std::io::BufWriter::with_capacity(1 << 20, gz);
        if serde_json::to_writer(&mut json, trace).is_err() {
            return;
        }
        let Ok(gz) = json.into_inner() else {
            return;
        };
        if let Ok(tmp) = gz.finish() {
            let _ = tmp.persist(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trial::trace::TraceEvent;

    #[test]
    fn a_stored_trace_reads_back_and_a_torn_one_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TraceCache::new(dir.path().join("traces"));
        let trace = TracedStep {
            events: vec![TraceEvent {
                id: 1,
                bytes: 4096,
                phase: 1,
                scope: 2,
            }],
            kernel_calls: Vec::new(),
            cpu_peak_bytes: 4096,
            forward_flops: 1e9,
            recompute_flops: 0.0,
            model_scopes: vec!["backbone".into()],
        };
        let key = "ab12cd34ef567890";
        assert!(cache.get(key).is_none());
        cache.put(key, &trace);
        let back = cache.get(key).unwrap();
        assert_eq!(back.events, trace.events);
        assert_eq!(back.model_scopes, trace.model_scopes);
        assert_eq!(cache.counts(), (1, 1));
        // A re-run reads it from disk.
        let again = TraceCache::new(dir.path().join("traces"));
        assert_eq!(again.get(key).unwrap().events, trace.events);
        std::fs::write(cache.path(key), b"\x1f\x8b\x08 torn").unwrap();
        let torn = TraceCache::new(dir.path().join("traces"));
        assert!(torn.get(key).is_none());
        assert!(torn.peek(key).is_none());
    }

    #[test]
    fn a_step_that_cannot_run_is_kept_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TraceCache::new(dir.path().join("traces"));
        let key = "cd34ef567890ab12";
        assert!(cache.failure(key).is_none());
        let why =
            "the traced meta step failed (infeasible): Expected more than 1 value per channel";
        cache.put_failure(key, why);
        let again = TraceCache::new(dir.path().join("traces"));
        assert_eq!(again.failure(key).as_deref(), Some(why));
        assert!(again.get(key).is_none());
    }

    #[test]
    fn the_key_follows_the_resolved_model_not_the_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let text =
            "model = dict(type='EncoderDecoder', backbone=dict(type='ResNetV1c', depth=18))\n";
        let a = dir.path().join("a.py");
        let b = dir.path().join("b.py");
        std::fs::write(&a, text).unwrap();
        std::fs::write(&b, text).unwrap();
        let cache = TraceCache::new(dir.path().join("traces"));
        let worker = Worker::at(dir.path().join("segtune-torch"));
        let step = |config: &'static Path, batch: i64, options: &'static [String]| StepToTrace {
            config,
            cfg_options: options,
            batch_size: batch,
            crop: (128, 128),
            amp: crate::trial::Amp::Off,
            threads: 1,
            gt_segments: None,
            setup: crate::trial::TrainingSetup::default(),
            kind: super::super::TraceKind::Meta,
            mode: crate::trial::RunMode::Train,
            deadline: std::time::Duration::from_secs(1),
            python: None,
        };
        let a: &'static Path = Box::leak(a.into_boxed_path());
        let b: &'static Path = Box::leak(b.into_boxed_path());
        let knob: &'static [String] =
            Box::leak(vec!["model.backbone.depth=50".to_string()].into_boxed_slice());
        let key = |s: StepToTrace| cache.key(&worker, &s).unwrap();
        assert_eq!(key(step(a, 2, &[])), key(step(b, 2, &[])));
        assert_ne!(key(step(a, 2, &[])), key(step(a, 4, &[])));
        assert_ne!(key(step(a, 2, &[])), key(step(a, 2, knob)));
        // A schedule variant (MMSeg's 40k/80k/160k configs) shares the
        // training step's traces; the optimizer does not.
        let schedule: &'static [String] = Box::leak(
            vec![
                "train_cfg.max_iters=160000".to_string(),
                "param_scheduler.0.end=160000".to_string(),
            ]
            .into_boxed_slice(),
        );
        let optimizer: &'static [String] =
            Box::leak(vec!["optim_wrapper.optimizer.type=AdamW".to_string()].into_boxed_slice());
        assert_eq!(key(step(a, 2, &[])), key(step(a, 2, schedule)));
        assert_ne!(key(step(a, 2, &[])), key(step(a, 2, optimizer)));
        // An inference step reads the test pipeline: its key keeps it all.
        let infer = |options| StepToTrace {
            mode: crate::trial::RunMode::Infer,
            ..step(a, 2, options)
        };
        assert_ne!(key(infer(&[])), key(infer(schedule)));
    }
}
