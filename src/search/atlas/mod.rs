//! `segtune atlas`: which of many configs train on which GPUs, and how.
//! For every config under the given directories and every GPU asked for, the
//! best feasible setting as `segtune search` picks it (it is that search:
//! same objective, effective-batch rule and knobs, its journal and emitted
//! config under `OUT/searches/`), or, when nothing fits, the least memory a
//! candidate was predicted to need; beside it the config's published result
//! (dataset and mIoU from MMSeg's `metafile.yaml` files).
//!
//! What makes it fast is sharing. A trace does not depend on the GPU, so one
//! trace cache (`OUT/trace-cache`, `predict::TraceCache`) serves every GPU
//! and every re-run. Each finished row is kept in `OUT/rows.jsonl`, keyed by
//! the resolved config, the GPU's budget, the search settings and the
//! worker binary, so a re-run with nothing changed replays no search. Only
//! judgements are kept there (see `row_cache`): a row that failed for a
//! reason of the host or the moment, or whose search directory is gone, is
//! searched again. A config that fails gets a row saying why; the atlas
//! never stops on one. One atlas at a time owns `OUT`
//! (`OUT/.segtune-atlas.lock`, an exclusive lock held while it runs).

mod published;
mod row_cache;

pub use published::published_results;
use published::{evaluated_on, fill_datasets, DatasetKey};
use row_cache::RowCache;

use super::record::{Mode, SearchResult};
use super::run::{search, SearchRequest, SearchRun};
use super::spec::SearchSpec;
use crate::config::metafile::Published;
use crate::config::{dump, Value};
use crate::error::{Error, Result};
use crate::kinds::GpuChoice;
use crate::predict::{Budget, Gpu, TraceCache};
use crate::worker::Worker;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bump when a row's meaning changes: older rows are searched again.
const ROW_FORMAT: u32 = 1;

/// The budget of one of the atlas's GPUs.
fn budget_of(gpu: &GpuChoice, margin: Option<f64>) -> Result<Budget> {
    Budget::new(&Gpu::choose(gpu)?, margin.unwrap_or(0.05))
}

/// What `segtune atlas` was asked.
pub struct AtlasRequest {
    /// Directories searched recursively for configs (`_base_` and hidden
    /// directories left out).
    pub dirs: Vec<PathBuf>,
    pub gpus: Vec<GpuChoice>,
    /// Where atlas.json, atlas.csv, atlas.html, the searches, the trace
    /// cache and the row cache go.
    pub out: PathBuf,
    /// Trees of `metafile.yaml` files; none given: the config directories.
    pub results: Vec<PathBuf>,
    /// Every search's settings besides its config and GPU (trace kind,
    /// threads, deadlines, where trials run, objective, margin, device).
    pub search: SearchRequest,
    /// Configs searched at once (each on its own thread, its GPUs in turn).
    pub jobs: usize,
}

/// How a config fared on a GPU.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AtlasStatus {
    /// A setting fits: the row holds the search's winner.
    Fits,
    /// Nothing the search tried fits: the row holds the least it needs.
    NothingFits,
    /// The config could not be searched (the reason says why).
    Failed,
}

/// One config on one GPU.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct AtlasRow {
    /// The config's path under its directory.
    pub config: String,
    /// Its file stem (the model zoo's name for it).
    pub name: String,
    /// Its method directory (`segformer`, `pspnet`, ...).
    pub family: String,
    /// The published result's dataset and single-scale mIoU (percent), from
    /// the metafiles; `None`: none published. Without a published dataset,
    /// the one the config evaluates on, named as the metafiles name the
    /// other configs on it (else its MMSeg type without `Dataset`).
    pub dataset: Option<String>,
    pub miou: Option<f64>,
    /// Without an mIoU, the published metric there is (`mDice 88.92`).
    #[serde(default)]
    pub other_metric: Option<String>,
    /// The GPU's label (preset or `vram-<size>`) and its budget.
    pub gpu: String,
    pub vram_bytes: u64,
    pub usable_bytes: u64,
    pub status: AtlasStatus,
    /// The winner's settings (status `fits`).
    pub batch_size: Option<i64>,
    pub crop: Option<(i64, i64)>,
    pub amp: Option<String>,
    pub accumulation: Option<i64>,
    #[serde(default)]
    pub checkpoint: bool,
    pub num_points: Option<i64>,
    /// The winner's device memory (reserved + CUDA context); with nothing
    /// fitting, the least any candidate needed.
    pub device_bytes: Option<u64>,
    pub images_per_s: Option<f64>,
    /// The written schedule's training time at the winner's predicted step
    /// time, hours (an iteration-based loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_hours: Option<f64>,
    /// Whether the figures were predicted or measured.
    pub mode: Option<Mode>,
    pub reason: Option<String>,
    /// A failure of the host or the moment (a killed worker, the host's
    /// memory, a held lock), not a judgement of the config: searched
    /// again next time.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unjudged: bool,
    /// Seconds its search took (0 when the row was reused).
    pub seconds: f64,
}

/// A GPU of the atlas with its budget.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct AtlasGpuBudget {
    pub label: String,
    pub gpu: String,
    pub vram_bytes: u64,
    pub usable_bytes: u64,
}

/// `atlas.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Atlas {
    pub gpus: Vec<AtlasGpuBudget>,
    /// Configs found under the directories.
    pub configs: usize,
    /// Configs with a published mIoU.
    pub configs_with_results: usize,
    pub rows: Vec<AtlasRow>,
    /// Rows taken from `OUT/rows.jsonl` (no search run for them).
    pub rows_reused: usize,
    /// The trace cache's lookups: answered from it, and traced.
    pub trace_cache_hits: usize,
    pub trace_cache_misses: usize,
    /// Metafiles that could not be read, each with why.
    pub metafile_errors: Vec<String>,
    /// What the user should hear besides the rows (a damaged row cache
    /// kept aside).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub seconds: f64,
}

/// What the progress display hears after each row.
pub struct AtlasStep<'a> {
    pub row: &'a AtlasRow,
    pub reused: bool,
    /// Rows done, of all.
    pub done: usize,
    pub of: usize,
}

/// Every config under `dirs` (`.py` and `.rhai`; `_base_`, `_`- and
/// `.`-named directories left out), with the directory it was found under,
/// sorted.
pub fn configs_under(dirs: &[PathBuf]) -> Vec<(PathBuf, PathBuf)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, PathBuf)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let hidden = name.starts_with('_') || name.starts_with('.');
            match entry.file_type() {
                Ok(t) if t.is_dir() && !hidden => walk(root, &path, out),
                Ok(t)
                    if !t.is_dir()
                        && !hidden
                        && (name.ends_with(".py") || name.ends_with(".rhai")) =>
                {
                    out.push((root.to_path_buf(), path))
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    for dir in dirs {
        if dir.is_file() {
            let root = dir.parent().unwrap_or(Path::new(".")).to_path_buf();
            out.push((root, dir.clone()));
        } else {
            walk(dir, dir, &mut out);
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out.dedup_by(|a, b| a.1 == b.1);
    out
}

/// A config's name parts: its path under `root`, stem and method directory.
fn names(root: &Path, config: &Path) -> (String, String, String) {
    let relative = config
        .strip_prefix(root)
        .unwrap_or(config)
        .display()
        .to_string();
    let stem = config
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let family = config
        .parent()
        .and_then(|p| p.file_name())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    (relative, stem, family)
}

/// The first lines of an error, for a row (a whole rendered diagnostic is
/// more than a table cell).
fn short(e: &Error) -> String {
    let text = e.to_string();
    // A diagnostic's pointer (`--> file:line`) and what follows it: the row
    // names its config already.
    let text = text.split("  --> ").next().unwrap_or(&text).to_string();
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines.truncate(3);
    let joined = lines.join(" ");
    let mut s: String = joined.chars().take(400).collect();
    if joined.chars().count() > 400 {
        s.push('…');
    }
    s.trim_start_matches("error: ").to_string()
}

/// Whether a search's error is a judgement of the config on the GPU, kept
/// in the row cache: the config does not load, its model is unsupported,
/// its settings cannot be used. A failure of the host or the moment (a
/// killed or crashed worker, the host's memory, a deadline, an unreadable
/// file, a lock another search held) is not: the next atlas searches the
/// row again.
fn is_judgement(e: &Error) -> bool {
    match e {
        Error::Config(_) | Error::Model { .. } | Error::Rendered(_) => true,
        Error::Input(message) => !message.starts_with(super::journal::ANOTHER_SEARCH),
        // A worker's failure without a verdict (an inspection killed by
        // SIGKILL, one out of the host's memory) reads as a trial's.
        Error::Trial(_) | Error::Environment { .. } | Error::Unanswered { .. } => false,
    }
}

/// Where a row's search keeps its journal and written config.
fn search_dir(out: &Path, family: &str, name: &str, gpu: &str) -> PathBuf {
    out.join("searches").join(family).join(name).join(gpu)
}

/// Whether a cached row's search is still there: a row that fits or does
/// not stands on its search's journal, which the user may have deleted.
fn search_kept(out: &Path, row: &AtlasRow) -> bool {
    row.status == AtlasStatus::Failed
        || search_dir(out, &row.family, &row.name, &row.gpu)
            .join("trials.jsonl")
            .is_file()
}

/// Takes `out`'s atlas lock (held while the returned file is open), or
/// refuses naming the atlas that holds it.
fn lock_out(out: &Path) -> Result<std::fs::File> {
    let path = out.join(".segtune-atlas.lock");
    let mut lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("cannot write into {}", out.display()), e))?;
    match lock.try_lock() {
        Ok(()) => {
            // Who holds it, for the message of the next one.
            use std::io::{Seek, Write};
            let _ = lock.set_len(0);
            let _ = lock.seek(std::io::SeekFrom::Start(0));
            let _ = write!(lock, "{}", std::process::id());
            Ok(lock)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = std::io::Read::read_to_string(&mut std::io::Read::take(&lock, 32), &mut holder);
            let holder = holder
                .trim()
                .parse::<u32>()
                .map_or(String::new(), |pid| format!(" (process {pid})"));
            Err(Error::Input(format!(
                "another segtune atlas{holder} is using {} (it holds {}); wait for it to \
                 finish or give another --out",
                out.display(),
                path.display()
            )))
        }
        Err(std::fs::TryLockError::Error(e)) => {
            Err(Error::io(format!("cannot lock {}", path.display()), e))
        }
    }
}

/// The row of a finished search.
fn row_of(base: AtlasRow, result: &SearchResult) -> AtlasRow {
    let mut row = base;
    row.mode = Some(result.mode);
    match &result.winner {
        Some(w) => {
            let c = &w.candidate;
            row.status = AtlasStatus::Fits;
            row.batch_size = Some(c.batch_size);
            row.crop = Some(c.crop);
            row.amp = Some(c.amp.to_string());
            row.accumulation = Some(c.accumulation);
            row.checkpoint = c.checkpoint;
            row.num_points = c.num_points;
            row.device_bytes = w.record.device_bytes;
            row.images_per_s = w.record.images_per_s;
            row.training_hours = result.training_time.as_ref().map(|t| t.hours);
        }
        None => {
            row.status = AtlasStatus::NothingFits;
            let least = result
                .infeasible
                .iter()
                .filter_map(|o| o.record.device_bytes.map(|b| (b, o)))
                .min_by_key(|(b, _)| *b);
            row.device_bytes = least.map(|(b, _)| b);
            row.reason = Some(match least {
                Some((bytes, o)) => format!(
                    "nothing fits: the least any candidate needs is {:.2} GiB (batch {} x {}x{}, {}), {:.2} GiB usable",
                    bytes as f64 / (1u64 << 30) as f64,
                    o.candidate.batch_size,
                    o.candidate.crop.0,
                    o.candidate.crop.1,
                    o.candidate.amp,
                    row.usable_bytes as f64 / (1u64 << 30) as f64
                ),
                None => "nothing fits, and no candidate's memory was predicted".into(),
            });
        }
    }
    row
}

/// The part of a row's key every row of one atlas shares: the search
/// settings and the worker binary.
fn settings_key(settings: &SearchRequest, worker: &Worker) -> String {
    format!(
        "{ROW_FORMAT}|{}|{:?}|{:?}|{:?}|{}|{:?}|{:?}|{:?}|{:?}|{:?}",
        worker.stamp(),
        settings.settings.objective,
        settings.settings.device,
        settings.settings.gpus,
        settings.run.trace,
        settings.run.gt_segments,
        settings.settings.torch,
        settings.run.cudnn_benchmark,
        settings.cfg_options,
        settings.precisions,
    )
}

/// The configs of the request, refused when there is none.
fn configs_of(request: &AtlasRequest) -> Result<Vec<(PathBuf, PathBuf)>> {
    let configs = configs_under(&request.dirs);
    if configs.is_empty() {
        return Err(Error::Input(format!(
            "no config (.py or .rhai) under {}",
            request
                .dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(configs)
}

/// A row before its search: the config, its published result, the GPU.
fn base_row(
    (relative, name, family): &(String, String, String),
    found: Option<&Published>,
    gpu: &GpuChoice,
    budget: &Budget,
) -> AtlasRow {
    AtlasRow {
        config: relative.clone(),
        name: name.clone(),
        family: family.clone(),
        dataset: found.and_then(|p| p.dataset.clone()),
        miou: found.and_then(|p| p.miou),
        other_metric: found.and_then(|p| p.other_metric.clone()),
        gpu: gpu.label(),
        vram_bytes: budget.vram_bytes,
        usable_bytes: budget.usable_bytes,
        status: AtlasStatus::Failed,
        batch_size: None,
        crop: None,
        amp: None,
        accumulation: None,
        checkpoint: false,
        num_points: None,
        device_bytes: None,
        images_per_s: None,
        training_hours: None,
        mode: None,
        reason: None,
        unjudged: false,
        seconds: 0.0,
    }
}

/// `base`'s row searched: `config` on `gpu` with the atlas's settings and
/// its trace cache, the search's files under `OUT/searches/`; with whether
/// it is a judgement, to be kept (see [`is_judgement`]).
fn searched_row(
    request: &AtlasRequest,
    settings: &SearchRequest,
    worker: &Worker,
    config: &Path,
    gpu: &GpuChoice,
    cache: &Arc<TraceCache>,
    base: AtlasRow,
) -> (AtlasRow, bool) {
    let started = Instant::now();
    let search_request = SearchRequest {
        config: config.to_path_buf(),
        settings: SearchSpec {
            gpu: gpu.clone(),
            ..settings.settings.clone()
        },
        out: search_dir(&request.out, &base.family, &base.name, &gpu.label()),
        run: SearchRun {
            trace_cache: Some(cache.clone()),
            ..settings.run.clone()
        },
        ..settings.clone()
    };
    let (mut row, judged) = match search(&search_request, worker, &|_| {}) {
        Ok(result) => (row_of(base, &result), true),
        Err(e) => (
            AtlasRow {
                reason: Some(short(&e)),
                unjudged: !is_judgement(&e),
                ..base
            },
            is_judgement(&e),
        ),
    };
    row.seconds = started.elapsed().as_secs_f64();
    (row, judged)
}

/// What the atlas's threads share.
struct Shared<'a> {
    request: &'a AtlasRequest,
    /// The searches' settings (one trace at a time when configs run at once).
    search: &'a SearchRequest,
    worker: &'a Worker,
    budgets: &'a [(GpuChoice, Budget)],
    published: &'a BTreeMap<String, Published>,
    cache: &'a Arc<TraceCache>,
    rows_cache: &'a Mutex<RowCache>,
    settings_key: &'a str,
    done: AtomicUsize,
    total: usize,
    progress: &'a (dyn Fn(&AtlasStep) + Sync),
}

/// One config's rows (one per GPU, in the GPUs' order).
struct ConfigRows {
    rows: Vec<Result<AtlasRow>>,
    reused: usize,
    with_result: bool,
    /// The dataset it evaluates on ([`evaluated_on`]).
    evaluated_on: Option<DatasetKey>,
}

impl Shared<'_> {
    /// Every config's rows, `jobs` configs at once, each in its slot.
    fn search_all(
        &self,
        configs: &[(PathBuf, PathBuf)],
        jobs: usize,
    ) -> Vec<Mutex<Option<ConfigRows>>> {
        let next = AtomicUsize::new(0);
        let per_config: Vec<Mutex<Option<ConfigRows>>> =
            configs.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some((root, config)) = configs.get(i) else {
                        return;
                    };
                    let rows = self.rows_of(root, config);
                    if let Ok(mut slot) = per_config[i].lock() {
                        *slot = Some(rows);
                    }
                });
            }
        });
        per_config
    }

    /// `config` on every GPU, in turn (its later GPUs replay the traces the
    /// first one took), each row from the row cache where nothing changed.
    fn rows_of(&self, root: &Path, config: &Path) -> ConfigRows {
        let names = names(root, config);
        let found = self.published.get(&names.1);
        let resolved = crate::config::resolve(config, &self.search.cfg_options).ok();
        let evaluated_on = resolved.as_ref().and_then(evaluated_on);
        let model_key = resolved.map(|cfg| dump::hash_text(&dump::to_json(&Value::Dict(cfg))));
        let mut out = ConfigRows {
            rows: Vec::with_capacity(self.budgets.len()),
            reused: 0,
            with_result: found.and_then(|p| p.miou).is_some(),
            evaluated_on,
        };
        for (gpu, budget) in self.budgets {
            let base = base_row(&names, found, gpu, budget);
            let key = model_key.as_ref().map(|m| {
                dump::hash_text(&format!(
                    "{}|{m}|{}|{}",
                    self.settings_key,
                    gpu.label(),
                    serde_json::to_string(budget).unwrap_or_default()
                ))
            });
            let cached = key
                .as_deref()
                .and_then(|k| self.rows_cache.lock().ok().and_then(|c| c.get(k).cloned()))
                .filter(|row| search_kept(&self.request.out, row));
            let was_cached = cached.is_some();
            let row = match cached {
                // The row may be another config's of the same model (a
                // schedule variant), and the published result may have
                // changed (another --results): only the search's outcome
                // is taken.
                Some(cached) => Ok(AtlasRow {
                    config: base.config,
                    name: base.name,
                    family: base.family,
                    dataset: base.dataset,
                    miou: base.miou,
                    other_metric: base.other_metric,
                    gpu: base.gpu,
                    vram_bytes: base.vram_bytes,
                    usable_bytes: base.usable_bytes,
                    seconds: 0.0,
                    ..cached
                }),
                None => {
                    let (row, judged) = searched_row(
                        self.request,
                        self.search,
                        self.worker,
                        config,
                        gpu,
                        self.cache,
                        base,
                    );
                    // Only a judgement stands for the search next time.
                    let stored = match (key, self.rows_cache.lock()) {
                        (Some(key), Ok(mut c)) if judged => c.put(key, &row),
                        _ => Ok(()),
                    };
                    stored.map(|()| row)
                }
            };
            out.reused += usize::from(was_cached);
            if let Ok(row) = &row {
                (self.progress)(&AtlasStep {
                    row,
                    reused: was_cached,
                    done: self.done.fetch_add(1, Ordering::SeqCst) + 1,
                    of: self.total,
                });
            }
            let failed = row.is_err();
            out.rows.push(row);
            if failed {
                break;
            }
        }
        out
    }
}

/// Each GPU's budget.
fn budgets_of(request: &AtlasRequest) -> Result<Vec<(GpuChoice, Budget)>> {
    request
        .gpus
        .iter()
        .map(|g| budget_of(g, request.search.settings.margin).map(|b| (g.clone(), b)))
        .collect()
}

/// The searches' settings when `jobs` configs are searched at once: each
/// search of a parallel atlas traces one step at a time (the atlas's own
/// threads fill the cores).
fn searches_for(settings: &SearchRequest, jobs: usize) -> SearchRequest {
    let mut search = settings.clone();
    if jobs > 1 {
        search.run.placement.local_traces = Some(1);
        if let Some(slurm) = &mut search.run.placement.slurm {
            slurm.max_parallel = 1;
        }
    }
    search
}

/// Every config's rows in the configs' order, datasets filled in, with
/// the rows reused and the configs with a published mIoU.
fn gathered(
    per_config: Vec<Mutex<Option<ConfigRows>>>,
    total: usize,
) -> Result<(Vec<AtlasRow>, usize, usize)> {
    let mut rows: Vec<AtlasRow> = Vec::with_capacity(total);
    let mut datasets: Vec<Option<DatasetKey>> = Vec::with_capacity(total);
    let (mut reused, mut with_results) = (0usize, 0usize);
    for slot in per_config {
        let done = slot
            .into_inner()
            .ok()
            .flatten()
            .ok_or_else(|| Error::Trial("an atlas thread ended without its rows".into()))?;
        with_results += usize::from(done.with_result);
        reused += done.reused;
        let these = done.rows.into_iter().collect::<Result<Vec<_>>>()?;
        datasets.extend(std::iter::repeat_n(done.evaluated_on, these.len()));
        rows.extend(these);
    }
    fill_datasets(&mut rows, &datasets);
    Ok((rows, reused, with_results))
}

/// Runs the atlas: every config on every GPU, rows reused where nothing
/// changed; `progress` hears of each row. Writes nothing but the searches'
/// directories and the row cache; the caller writes the outputs.
pub fn atlas(
    request: &AtlasRequest,
    worker: &Worker,
    progress: &(dyn Fn(&AtlasStep) + Sync),
) -> Result<Atlas> {
    let started = Instant::now();
    if request.gpus.is_empty() {
        return Err(Error::Input(
            "no GPU: give --preset NAME (one or more), --all-presets or --vram SIZE".into(),
        ));
    }
    super::journal::create_out_dir(&request.out)?;
    let _lock = lock_out(&request.out)?;
    if let Some(cache) = &request.search.run.trace_cache {
        cache.check()?;
    }
    let configs = configs_of(request)?;
    let budgets = budgets_of(request)?;
    let (published, metafile_errors) = published_results(
        if request.results.is_empty() {
            &request.dirs
        } else {
            &request.results
        },
        &configs,
    );
    let cache = request
        .search
        .run
        .trace_cache
        .clone()
        .unwrap_or_else(|| Arc::new(TraceCache::new(request.out.join("trace-cache"))));
    let rows_cache = RowCache::open(&request.out)?;
    let notes: Vec<String> = rows_cache.note().map(str::to_string).into_iter().collect();
    let rows_cache = Mutex::new(rows_cache);
    let settings_key = settings_key(&request.search, worker);
    let total = configs.len() * budgets.len();
    let jobs = request.jobs.clamp(1, configs.len().max(1));
    let search = searches_for(&request.search, jobs);
    let shared = Shared {
        request,
        search: &search,
        worker,
        budgets: &budgets,
        published: &published,
        cache: &cache,
        rows_cache: &rows_cache,
        settings_key: &settings_key,
        done: AtomicUsize::new(0),
        total,
        progress,
    };
    let per_config = shared.search_all(&configs, jobs);
    let (rows, reused, with_results) = gathered(per_config, total)?;
    let (hits, misses) = cache.counts();
    Ok(Atlas {
        gpus: budgets
            .iter()
            .map(|(g, b)| AtlasGpuBudget {
                label: g.label(),
                gpu: b.gpu.clone(),
                vram_bytes: b.vram_bytes,
                usable_bytes: b.usable_bytes,
            })
            .collect(),
        configs: configs.len(),
        configs_with_results: with_results,
        rows,
        rows_reused: reused,
        trace_cache_hits: hits,
        trace_cache_misses: misses,
        metafile_errors,
        notes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests;
