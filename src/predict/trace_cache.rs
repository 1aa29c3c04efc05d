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
//! then a rename), and each holds its key and a checksum of its trace: an
//! entry that does not read, that another key's file was copied over, or
//! whose trace was edited is a miss, traced again and overwritten. A step
//! that cannot run (a batch of one under BatchNorm, a crop the model
//! refuses) keeps its reason instead (`KEY.failed`, keyed alike): it fails
//! alike on every GPU; a valid trace beside it wins. Only regular files are
//! read (a link, a directory or a pipe in the cache is ignored), and a
//! reason is read bounded: its first line, at most [`MAX_REASON_BYTES`].

use super::step_trace::{StepToTrace, TracedStep};
use crate::config::{dump, Value};
use crate::error::{Error, Result};
use crate::kinds::RunMode;
use crate::worker::Worker;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Bump when what a trace holds changes (2: entries hold their key and
/// a checksum; 3: every op's work, for the step-time model).
const FORMAT: u32 = 3;

/// The most of a `.failed` marker read back, and of its reason kept: a
/// reason is a line or two of a worker's message.
pub const MAX_REASON_BYTES: usize = 2048;

/// What the cache holds for a step's key.
#[derive(Debug)]
pub enum Lookup {
    /// Its trace.
    Trace(TracedStep),
    /// Why it cannot run (no trace was ever stored for it).
    Failed(String),
    /// Nothing that reads as this key's.
    Miss,
}

/// The first line of an entry: whose it is and a checksum of its trace.
#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    format: u32,
    key: String,
    /// FNV-1a 64 of the trace's JSON (the rest of the entry).
    checksum: String,
}

/// A `.failed` marker: whose it is, why, and a checksum of both.
#[derive(serde::Serialize, serde::Deserialize)]
struct FailureMarker {
    key: String,
    reason: String,
    checksum: String,
}

/// FNV-1a 64 of bytes, in hex (as `dump::hash_text`).
fn checksum(bytes: &[u8]) -> String {
    let h = bytes.iter().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100000001b3)
    });
    format!("{h:016x}")
}

/// `path` opened for reading if it is a regular file: a link (followed by
/// nothing), a directory or a pipe (whose open would wait for a writer)
/// in the cache is not an entry.
fn open_regular(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    if !std::fs::symlink_metadata(path).ok()?.file_type().is_file() {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    // Checked again on what was opened: the name may have changed since.
    file.metadata().ok()?.is_file().then_some(file)
}

/// The first line of `text`, at most [`MAX_REASON_BYTES`] (cut at a
/// character boundary).
fn first_line_bounded(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim_end();
    let mut end = line.len().min(MAX_REASON_BYTES);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    line[..end].to_string()
}

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

    /// Refuses a cache directory that exists as something else (a file, a
    /// device), which would otherwise be silently unused.
    pub fn check(&self) -> Result<()> {
        match std::fs::metadata(&self.dir) {
            Ok(meta) if !meta.is_dir() => Err(Error::Input(format!(
                "--trace-cache {} is {}; give a directory (segtune creates it if missing)",
                self.dir.display(),
                if meta.is_file() {
                    "a file"
                } else {
                    "not a directory"
                }
            ))),
            _ => Ok(()),
        }
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
            "{FORMAT}|{stamp}|{}|b{}|{}x{}|{}|segments{:?}|gpus{}|torch{}|mmcv{}|{}|{}|python{:?}",
            dump::to_json(&Value::Dict(cfg)),
            step.batch_size,
            step.crop.0,
            step.crop.1,
            step.amp,
            step.gt_segments,
            step.setup.gpus,
            step.setup.torch,
            step.setup.mmcv,
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

    /// What the cache holds for `key`, counted once as a hit or a miss: a
    /// valid trace wins over a `.failed` marker beside it.
    pub fn lookup(&self, key: &str) -> Lookup {
        if let Some(step) = self.recalled(key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Lookup::Trace(step);
        }
        let found = match self.read(key) {
            Some(step) => {
                self.remember(key, &step);
                Lookup::Trace(step)
            }
            None => self.read_failure(key).map_or(Lookup::Miss, Lookup::Failed),
        };
        let counter = if matches!(found, Lookup::Miss) {
            &self.misses
        } else {
            &self.hits
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
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

    /// The trace stored on disk under `key`, if one reads as this key's:
    /// its header names the key, and its checksum holds.
    fn read(&self, key: &str) -> Option<TracedStep> {
        let f = open_regular(&self.path(key))?;
        // Whole, then parsed: serde_json reads a slice many times faster
        // than a reader.
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(f), &mut text).ok()?;
        let at = text.iter().position(|b| *b == b'\n')?;
        let header: Header = serde_json::from_slice(&text[..at]).ok()?;
        let trace = &text[at + 1..];
        if header.format != FORMAT || header.key != key || header.checksum != checksum(trace) {
            return None;
        }
        serde_json::from_slice(trace).ok()
    }

    /// The trace stored under `key` if there is one, without counting a
    /// miss when there is none (a lookup that would not trace).
    pub fn peek(&self, key: &str) -> Option<TracedStep> {
        if let Some(step) = self.recalled(key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(step);
        }
        let step = self.read(key)?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.remember(key, &step);
        Some(step)
    }

    fn failure_path(&self, key: &str) -> PathBuf {
        self.dir.join(&key[..2]).join(format!("{key}.failed"))
    }

    /// Why the step under `key` failed, when it did and no trace of it
    /// reads: a failure that comes back every time (the step cannot run),
    /// stored by [`Self::put_failure`].
    pub fn failure(&self, key: &str) -> Option<String> {
        if self.read(key).is_some() {
            return None;
        }
        let message = self.read_failure(key)?;
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(message)
    }

    /// The reason of `key`'s marker, if it is a regular file that reads as
    /// this key's (read bounded: a marker is one short line).
    fn read_failure(&self, key: &str) -> Option<String> {
        let f = open_regular(&self.failure_path(key))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(f, (MAX_REASON_BYTES * 8) as u64),
            &mut bytes,
        )
        .ok()?;
        let text = String::from_utf8_lossy(&bytes);
        let marker: FailureMarker = serde_json::from_str(text.lines().next()?).ok()?;
        let sum = checksum(format!("{}\n{}", marker.key, marker.reason).as_bytes());
        (marker.key == key && marker.checksum == sum).then(|| first_line_bounded(&marker.reason))
    }

    /// Stores why the step under `key` cannot run (its first line, bounded;
    /// written whole, as a trace is).
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
        let reason = first_line_bounded(message);
        let marker = FailureMarker {
            checksum: checksum(format!("{key}\n{reason}").as_bytes()),
            key: key.to_string(),
            reason,
        };
        let line = serde_json::to_string(&marker).expect("markers serialise");
        if std::io::Write::write_all(&mut tmp, line.as_bytes()).is_ok() {
            let _ = tmp.persist(&path);
        }
    }

    /// Stores `trace` under `key` (its header line, then its JSON); a
    /// failure to write only costs a re-trace later, so it is not an error.
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
        // Whole first, for its checksum; then gzipped (a trace's events
        // compress about tenfold) in one large write: flate2 clears its
        // output buffer on every write, and serde writes a few bytes at a
        // time (that clearing took 80% of an atlas's own CPU).
        let Ok(json) = serde_json::to_vec(trace) else {
            return;
        };
        let header = Header {
            format: FORMAT,
            key: key.to_string(),
            checksum: checksum(&json),
        };
        let mut gz = flate2::write::GzEncoder::new(tmp, flate2::Compression::fast());
        let header = serde_json::to_string(&header).expect("headers serialise");
        let written = std::io::Write::write_all(&mut gz, format!("{header}\n").as_bytes())
            .and_then(|()| std::io::Write::write_all(&mut gz, &json));
        if written.is_err() {
            return;
        }
        if let Ok(tmp) = gz.finish() {
            // Replaces what was there (an entry of another key copied over
            // this one's, a link): the rename replaces the name itself.
            let _ = tmp.persist(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trial::trace::TraceEvent;

    fn trace(bytes: i64) -> TracedStep {
        TracedStep {
            events: vec![TraceEvent {
                id: 1,
                bytes,
                phase: 1,
                scope: 2,
            }],
            kernel_calls: Vec::new(),
            ops: Vec::new(),
            cpu_peak_bytes: bytes,
            forward_flops: 1e9,
            recompute_flops: 0.0,
            model_scopes: vec!["backbone".into()],
        }
    }

    #[test]
    fn an_entry_copied_over_another_key_or_edited_is_a_miss_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TraceCache::new(dir.path().join("traces"));
        let (batch4, batch8) = ("ab00000000000004", "ab00000000000008");
        cache.put(batch4, &trace(4));
        std::fs::copy(cache.path(batch4), {
            std::fs::create_dir_all(cache.path(batch8).parent().unwrap()).unwrap();
            cache.path(batch8)
        })
        .unwrap();
        let fresh = TraceCache::new(dir.path().join("traces"));
        assert!(matches!(fresh.lookup(batch8), Lookup::Miss));
        assert_eq!(fresh.counts(), (0, 1));
        fresh.put(batch8, &trace(8));
        let again = TraceCache::new(dir.path().join("traces"));
        assert_eq!(again.get(batch8).unwrap().cpu_peak_bytes, 8);
        // An edited trace (its header kept) fails its checksum.
        let edited = {
            let mut text = Vec::new();
            std::io::Read::read_to_end(
                &mut flate2::read::GzDecoder::new(std::fs::File::open(cache.path(batch4)).unwrap()),
                &mut text,
            )
            .unwrap();
            String::from_utf8(text)
                .unwrap()
                .replace("\"bytes\":4", "\"bytes\":1")
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, edited.as_bytes()).unwrap();
        std::fs::write(cache.path(batch4), gz.finish().unwrap()).unwrap();
        assert!(TraceCache::new(dir.path().join("traces"))
            .get(batch4)
            .is_none());
    }

    #[test]
    fn a_valid_trace_beats_a_failure_and_odd_markers_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let cache = TraceCache::new(dir.path().join("traces"));
        let key = "cd00000000000001";
        cache.put_failure(key, "the traced meta step failed (infeasible): no");
        cache.put(key, &trace(4));
        let fresh = TraceCache::new(dir.path().join("traces"));
        assert!(matches!(fresh.lookup(key), Lookup::Trace(_)));
        assert!(fresh.failure(key).is_none());

        // A link to /etc/passwd, a directory, a pipe: none is a marker.
        let linked = "cd00000000000002";
        std::os::unix::fs::symlink("/etc/passwd", cache.failure_path(linked)).unwrap();
        assert!(matches!(fresh.lookup(linked), Lookup::Miss));
        let dir_key = "cd00000000000003";
        std::fs::create_dir(cache.failure_path(dir_key)).unwrap();
        assert!(matches!(fresh.lookup(dir_key), Lookup::Miss));
        let fifo = "cd00000000000004";
        let path = std::ffi::CString::new(cache.failure_path(fifo).to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        assert!(matches!(fresh.lookup(fifo), Lookup::Miss));
        // A linked entry is not read either.
        std::os::unix::fs::symlink(cache.path(key), cache.path(linked)).unwrap();
        assert!(fresh.get(linked).is_none());
        // Another key's marker copied over, and a plain-text one: ignored.
        cache.put_failure("cd00000000000005", "its own reason");
        std::fs::copy(
            cache.failure_path("cd00000000000005"),
            cache.failure_path("cd00000000000006"),
        )
        .unwrap();
        assert!(matches!(fresh.lookup("cd00000000000006"), Lookup::Miss));

        // A long reason is kept bounded, its first line only.
        let long = format!("first line {}\nsecond line", "x".repeat(10_000));
        cache.put_failure("cd00000000000007", &long);
        match fresh.lookup("cd00000000000007") {
            Lookup::Failed(reason) => {
                assert!(reason.len() <= MAX_REASON_BYTES && reason.starts_with("first line"));
                assert!(!reason.contains("second"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_cache_that_is_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cache");
        std::fs::write(&file, "").unwrap();
        let err = TraceCache::new(&file).check().unwrap_err().to_string();
        assert!(
            err.contains("--trace-cache") && err.contains("is a file"),
            "{err}"
        );
        assert!(TraceCache::new(dir.path().join("new")).check().is_ok());
    }

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
            ops: Vec::new(),
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
            amp: crate::kinds::Amp::Off,
            threads: 1,
            gt_segments: None,
            setup: crate::kinds::TrainingSetup::default(),
            kind: super::super::TraceKind::Meta,
            mode: crate::kinds::RunMode::Train,
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
            mode: crate::kinds::RunMode::Infer,
            ..step(a, 2, options)
        };
        assert_ne!(key(infer(&[])), key(infer(schedule)));
    }
}
