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
//! worker binary, so a re-run with nothing changed replays no search. A
//! config that fails gets a row saying why; the atlas never stops on one.

use super::record::{Mode, SearchResult};
use super::run::{search, SearchRequest};
use super::spec::SearchSpec;
use crate::config::metafile::{self, Published};
use crate::config::{dump, Value};
use crate::error::{Error, Result};
use crate::predict::{Budget, Gpu, TraceCache};
use crate::trial::worker::Worker;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Bump when a row's meaning changes: older rows are searched again.
const ROW_FORMAT: u32 = 1;

/// One GPU of the atlas: a preset, or a VRAM size (and compute capability).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtlasGpu {
    pub preset: Option<String>,
    pub vram: Option<String>,
    pub compute_capability: Option<String>,
}

impl AtlasGpu {
    pub fn preset(name: &str) -> AtlasGpu {
        AtlasGpu {
            preset: Some(name.to_string()),
            vram: None,
            compute_capability: None,
        }
    }

    /// The column's name: the preset's, or `vram-<size>`.
    pub fn label(&self) -> String {
        match (&self.preset, &self.vram) {
            (Some(p), _) => p.clone(),
            (None, Some(v)) => format!("vram-{v}"),
            (None, None) => "gpu".into(),
        }
    }

    fn budget(&self, margin: Option<f64>) -> Result<Budget> {
        let gpu = Gpu::choose(
            self.preset.as_deref(),
            self.vram.as_deref(),
            self.compute_capability.as_deref(),
        )?;
        Budget::new(&gpu, margin.unwrap_or(0.05))
    }
}

/// What `segtune atlas` was asked.
pub struct AtlasRequest {
    /// Directories searched recursively for configs (`_base_` and hidden
    /// directories left out).
    pub dirs: Vec<PathBuf>,
    pub gpus: Vec<AtlasGpu>,
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
    /// Whether the figures were predicted or measured.
    pub mode: Option<Mode>,
    pub reason: Option<String>,
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

/// The row cache: `OUT/rows.jsonl`, one `{key, row}` per line, appended as
/// rows finish (a killed atlas keeps what it finished).
struct RowCache {
    path: PathBuf,
    rows: HashMap<String, AtlasRow>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CachedRow {
    key: String,
    row: AtlasRow,
}

impl RowCache {
    fn open(out: &Path) -> RowCache {
        let path = out.join("rows.jsonl");
        let rows = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<CachedRow>(l).ok())
            .map(|c| (c.key, c.row))
            .collect();
        RowCache { path, rows }
    }

    fn get(&self, key: &str) -> Option<&AtlasRow> {
        self.rows.get(key)
    }

    fn put(&mut self, key: String, row: &AtlasRow) -> Result<()> {
        let line = serde_json::to_string(&CachedRow {
            key: key.clone(),
            row: row.clone(),
        })
        .expect("rows serialise");
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| writeln!(f, "{line}"))
            .map_err(|e| Error::io(format!("cannot write {}", self.path.display()), e))?;
        self.rows.insert(key, row.clone());
        Ok(())
    }
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

/// The least share of name parts a misnamed metafile entry and a config
/// must have in common to be taken for each other.
const MISNAMED_OVERLAP: f64 = 0.7;

/// Gives a config that no metafile entry names the entry of its directory
/// that names no config, where their names are the same but for a typo or
/// the parts' order (MMSeg 1.2.2's `ddeeplabv3plus_r101-d16-mg124_...`,
/// `eemanet_r50-d8_...`, `fpn_poolformer_s36_8xb4-40k_ade20k-512x512` for
/// `fpn_poolformer_s36_8x4_512x512_40k_ade20k`): the config of the entry's
/// directory sharing the most name parts (`_`/`-`-separated), at least
/// [`MISNAMED_OVERLAP`] of them, and more than any other config there.
/// `configs`: (name, family) of each config.
fn match_misnamed_entries(
    published: &mut BTreeMap<String, Published>,
    configs: &[(String, String)],
) {
    fn parts(name: &str) -> std::collections::BTreeSet<&str> {
        name.split(['_', '-']).filter(|p| !p.is_empty()).collect()
    }
    fn overlap(a: &str, b: &str) -> f64 {
        let (a, b) = (parts(a), parts(b));
        let shared = a.intersection(&b).count();
        shared as f64 / a.union(&b).count().max(1) as f64
    }
    let named: std::collections::HashSet<&str> = configs.iter().map(|(n, _)| n.as_str()).collect();
    let mut claims: BTreeMap<String, Vec<Published>> = BTreeMap::new();
    for (entry, found) in published.iter() {
        if named.contains(entry.as_str()) {
            continue;
        }
        let directory = Path::new(&found.metafile)
            .parent()
            .and_then(Path::file_name)
            .map(|d| d.to_string_lossy().into_owned());
        let mut scored: Vec<(f64, &str)> = configs
            .iter()
            .filter(|(name, family)| {
                Some(family) == directory.as_ref() && !published.contains_key(name)
            })
            .map(|(name, _)| (overlap(entry, name), name.as_str()))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        match scored.as_slice() {
            [(best, name), rest @ ..]
                if *best >= MISNAMED_OVERLAP && rest.first().is_none_or(|r| r.0 < *best) =>
            {
                claims
                    .entry(name.to_string())
                    .or_default()
                    .push(found.clone());
            }
            _ => {}
        }
    }
    // A config two entries would claim gets neither.
    for (name, mut found) in claims {
        if found.len() == 1 {
            published.insert(name, found.remove(0));
        }
    }
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

/// The published results in the metafile trees `dirs` by config name (the
/// first of a name wins; misnamed entries matched to `configs`, as
/// (root, path) pairs, by [`match_misnamed_entries`]), and the metafiles
/// that could not be read.
pub fn published_results(
    dirs: &[PathBuf],
    configs: &[(PathBuf, PathBuf)],
) -> (BTreeMap<String, Published>, Vec<String>) {
    let mut published: BTreeMap<String, Published> = BTreeMap::new();
    let mut errors = Vec::new();
    for dir in dirs {
        let (found, unread) = metafile::read_tree(dir);
        for (k, v) in found {
            published.entry(k).or_insert(v);
        }
        errors.extend(unread.iter().map(|e| e.to_string()));
    }
    let named: Vec<(String, String)> = configs
        .iter()
        .map(|(root, config)| {
            let (_, name, family) = names(root, config);
            (name, family)
        })
        .collect();
    match_misnamed_entries(&mut published, &named);
    (published, errors)
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
        settings.trace,
        settings.gt_segments,
        settings.settings.torch,
        settings.cudnn_benchmark,
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
    gpu: &AtlasGpu,
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
        mode: None,
        reason: None,
        seconds: 0.0,
    }
}

/// `base`'s row searched: `config` on `gpu` with the atlas's settings and
/// its trace cache, the search's files under `OUT/searches/`.
fn searched_row(
    request: &AtlasRequest,
    settings: &SearchRequest,
    worker: &Worker,
    config: &Path,
    gpu: &AtlasGpu,
    cache: &Arc<TraceCache>,
    base: AtlasRow,
) -> AtlasRow {
    let started = Instant::now();
    let search_request = SearchRequest {
        config: config.to_path_buf(),
        settings: SearchSpec {
            preset: gpu.preset.clone(),
            vram: gpu.vram.clone(),
            compute_capability: gpu.compute_capability.clone(),
            ..settings.settings.clone()
        },
        out: request
            .out
            .join("searches")
            .join(&base.family)
            .join(&base.name)
            .join(gpu.label()),
        trace_cache: Some(cache.clone()),
        ..settings.clone()
    };
    let mut row = match search(&search_request, worker, &|_| {}) {
        Ok(result) => row_of(base, &result),
        Err(e) => AtlasRow {
            reason: Some(short(&e)),
            ..base
        },
    };
    row.seconds = started.elapsed().as_secs_f64();
    row
}

/// What the atlas's threads share.
struct Shared<'a> {
    request: &'a AtlasRequest,
    /// The searches' settings (one trace at a time when configs run at once).
    search: &'a SearchRequest,
    worker: &'a Worker,
    budgets: &'a [(AtlasGpu, Budget)],
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

/// A dataset as a config names it: its MMSeg type and `data_root`.
type DatasetKey = (String, String);

/// The dataset a config evaluates on: its `test_dataloader`'s (else
/// `val_dataloader`'s) dataset, through wrappers (`ConcatDataset`'s
/// first, `RepeatDataset`'s), as (type, `data_root`).
fn evaluated_on(cfg: &crate::config::Dict) -> Option<DatasetKey> {
    let loader = cfg
        .get("test_dataloader")
        .or_else(|| cfg.get("val_dataloader"))?
        .as_dict()?;
    let mut dataset = loader.get("dataset")?.as_dict()?;
    while dataset.get("data_root").is_none() {
        let inner = dataset.get("dataset").and_then(Value::as_dict).or_else(|| {
            dataset
                .get("datasets")
                .and_then(Value::as_seq)
                .and_then(|list| list.first())
                .and_then(Value::as_dict)
        });
        match inner {
            Some(inner) => dataset = inner,
            None => break,
        }
    }
    let kind = dataset.get("type")?.as_str()?.to_string();
    let root = dataset
        .get("data_root")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Some((kind, root))
}

/// Gives each row without a published dataset the one its config
/// evaluates on (`keys`, per row): the name the metafiles give most often
/// to the configs on that dataset, else its type without `Dataset`
/// (`PascalContextDataset59`: `PascalContext59`).
fn fill_datasets(rows: &mut [AtlasRow], keys: &[Option<DatasetKey>]) {
    let mut names: HashMap<&DatasetKey, BTreeMap<&str, usize>> = HashMap::new();
    for (row, key) in rows.iter().zip(keys) {
        if let (Some(key), Some(name)) = (key, row.dataset.as_deref()) {
            *names.entry(key).or_default().entry(name).or_default() += 1;
        }
    }
    let chosen: HashMap<&DatasetKey, String> = keys
        .iter()
        .flatten()
        .map(|key| {
            let name = names
                .get(key)
                .and_then(|n| n.iter().max_by_key(|(_, count)| **count))
                .map(|(name, _)| name.to_string())
                .unwrap_or_else(|| key.0.replace("Dataset", ""));
            (key, name)
        })
        .collect();
    for (row, key) in rows.iter_mut().zip(keys) {
        if row.dataset.is_none() {
            row.dataset = key.as_ref().and_then(|k| chosen.get(k).cloned());
        }
    }
}

impl Shared<'_> {
    /// `config` on every GPU, in turn (its later GPUs replay the traces the
    /// first one took), each row from the row cache where nothing changed.
    fn rows_of(&self, root: &Path, config: &Path) -> ConfigRows {
        let names = names(root, config);
        let found = self.published.get(&names.1);
        let resolved = crate::config::resolve(config, &self.search.cfg_options).ok();
        let model_key = resolved
            .as_ref()
            .map(|cfg| dump::hash_text(&dump::to_json(&Value::Dict(cfg.clone()))));
        let mut out = ConfigRows {
            rows: Vec::with_capacity(self.budgets.len()),
            reused: 0,
            with_result: found.and_then(|p| p.miou).is_some(),
            evaluated_on: resolved.as_ref().and_then(evaluated_on),
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
                .and_then(|k| self.rows_cache.lock().ok().and_then(|c| c.get(k).cloned()));
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
                    let row = searched_row(
                        self.request,
                        self.search,
                        self.worker,
                        config,
                        gpu,
                        self.cache,
                        base,
                    );
                    let stored = match (key, self.rows_cache.lock()) {
                        (Some(key), Ok(mut c)) => c.put(key, &row),
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
    let configs = configs_of(request)?;
    let budgets: Vec<(AtlasGpu, Budget)> = request
        .gpus
        .iter()
        .map(|g| {
            g.budget(request.search.settings.margin)
                .map(|b| (g.clone(), b))
        })
        .collect::<Result<_>>()?;
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
        .trace_cache
        .clone()
        .unwrap_or_else(|| Arc::new(TraceCache::new(request.out.join("trace-cache"))));
    let rows_cache = Mutex::new(RowCache::open(&request.out));
    let settings_key = settings_key(&request.search, worker);
    let total = configs.len() * budgets.len();
    let jobs = request.jobs.clamp(1, configs.len().max(1));
    // Each search of a parallel atlas traces one step at a time: the
    // atlas's own threads fill the cores.
    let mut search = request.search.clone();
    if jobs > 1 {
        search.placement.local_traces = Some(1);
        if let Some(slurm) = &mut search.placement.slurm {
            slurm.max_parallel = 1;
        }
    }
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
                let rows = shared.rows_of(root, config);
                if let Ok(mut slot) = per_config[i].lock() {
                    *slot = Some(rows);
                }
            });
        }
    });
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
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misnamed_metafile_entry_is_matched_to_its_config_by_its_name_parts() {
        let entry = |metafile: &str, miou: f64| Published {
            dataset: Some("Cityscapes".into()),
            miou: Some(miou),
            other_metric: None,
            memory_gb: None,
            metafile: metafile.into(),
        };
        let mut published: BTreeMap<String, Published> = [
            (
                "eemanet_r50-d8_4xb2-80k_cityscapes-512x1024",
                entry("x/emanet/metafile.yaml", 77.59),
            ),
            (
                "emanet_r101-d8_4xb2-80k_cityscapes-512x1024",
                entry("x/emanet/metafile.yaml", 78.0),
            ),
            (
                "fpn_poolformer_s36_8xb4-40k_ade20k-512x512",
                entry("x/poolformer/metafile.yaml", 41.61),
            ),
            (
                "fpn_poolformer_s24_8xb4-40k_ade20k-512x512",
                entry("x/poolformer/metafile.yaml", 40.0),
            ),
            // Far from every config of its directory: no match.
            (
                "pspnet_r18-d8_4xb2-80k_cityscapes-512x1024",
                entry("x/pspnet/metafile.yaml", 1.0),
            ),
        ]
        .into_iter()
        .map(|(n, p)| (n.to_string(), p))
        .collect();
        let configs: Vec<(String, String)> = [
            ("emanet_r50-d8_4xb2-80k_cityscapes-512x1024", "emanet"),
            ("emanet_r101-d8_4xb2-80k_cityscapes-512x1024", "emanet"),
            ("fpn_poolformer_s36_8x4_512x512_40k_ade20k", "poolformer"),
            ("fpn_poolformer_s24_8xb4-40k_ade20k-512x512", "poolformer"),
            ("pspnet_r50-d8_4xb4-80k_pascal-context-480x480", "pspnet"),
            // Same parts, another directory.
            ("eemanet_r50-d8_4xb2-80k_cityscapes-512x1024x", "other"),
        ]
        .into_iter()
        .map(|(n, f)| (n.to_string(), f.to_string()))
        .collect();
        match_misnamed_entries(&mut published, &configs);
        let miou = |name: &str| published.get(name).and_then(|p| p.miou);
        assert_eq!(
            miou("emanet_r50-d8_4xb2-80k_cityscapes-512x1024"),
            Some(77.59)
        );
        assert_eq!(
            miou("emanet_r101-d8_4xb2-80k_cityscapes-512x1024"),
            Some(78.0)
        );
        assert_eq!(
            miou("fpn_poolformer_s36_8x4_512x512_40k_ade20k"),
            Some(41.61)
        );
        assert_eq!(
            miou("fpn_poolformer_s24_8xb4-40k_ade20k-512x512"),
            Some(40.0)
        );
        assert_eq!(miou("pspnet_r50-d8_4xb4-80k_pascal-context-480x480"), None);
        assert_eq!(miou("eemanet_r50-d8_4xb2-80k_cityscapes-512x1024x"), None);
    }

    #[test]
    fn a_row_without_a_published_dataset_gets_the_one_its_config_evaluates_on() {
        let cfg = |json: serde_json::Value| match dump::from_json(&json) {
            Value::Dict(d) => d,
            _ => unreachable!(),
        };
        // VOC with its augmented set: a ConcatDataset to train, VOC to validate.
        let voc = cfg(serde_json::json!({
            "val_dataloader": {"dataset": {"type": "PascalVOCDataset", "data_root": "data/VOCdevkit/VOC2012"}},
        }));
        let voc_key = (
            "PascalVOCDataset".to_string(),
            "data/VOCdevkit/VOC2012".to_string(),
        );
        assert_eq!(evaluated_on(&voc), Some(voc_key.clone()));
        let repeated = cfg(serde_json::json!({
            "test_dataloader": {"dataset": {"type": "RepeatDataset", "times": 2,
                "dataset": {"type": "ConcatDataset", "datasets": [
                    {"type": "CityscapesDataset", "data_root": "data/cityscapes/"}]}}},
        }));
        let city = (
            "CityscapesDataset".to_string(),
            "data/cityscapes/".to_string(),
        );
        assert_eq!(evaluated_on(&repeated), Some(city.clone()));

        let row = |dataset: Option<&str>| AtlasRow {
            dataset: dataset.map(str::to_string),
            ..base_row(
                &("a.py".into(), "a".into(), "f".into()),
                None,
                &AtlasGpu::preset("rtx3050ti"),
                &AtlasGpu::preset("rtx3050ti").budget(None).unwrap(),
            )
        };
        let dark = (
            "DarkZurichDataset".to_string(),
            "data/dark_zurich/".to_string(),
        );
        let mut rows = vec![
            row(Some("Cityscapes")),
            row(None),
            row(Some("Pascal VOC 2012 + Aug")),
            row(None),
            row(None),
            row(None),
        ];
        let keys = [
            Some(city.clone()),
            Some(city),
            Some(voc_key.clone()),
            Some(voc_key),
            Some(dark),
            None,
        ];
        fill_datasets(&mut rows, &keys);
        let names: Vec<Option<&str>> = rows.iter().map(|r| r.dataset.as_deref()).collect();
        assert_eq!(
            names,
            [
                Some("Cityscapes"),
                Some("Cityscapes"),
                Some("Pascal VOC 2012 + Aug"),
                Some("Pascal VOC 2012 + Aug"),
                Some("DarkZurich"),
                None
            ]
        );
    }

    #[test]
    fn configs_are_found_below_the_directories_without_bases() {
        let dir = tempfile::tempdir().unwrap();
        for f in [
            "pspnet/pspnet_r18.py",
            "pspnet/_helper.py",
            "_base_/models/pspnet_r50-d8.py",
            ".git/x.py",
            "segformer/b0.rhai",
            "segformer/README.md",
        ] {
            let p = dir.path().join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "x = 1\n").unwrap();
        }
        let found: Vec<String> = configs_under(&[dir.path().to_path_buf()])
            .into_iter()
            .map(|(root, c)| names(&root, &c).0)
            .collect();
        assert_eq!(found, vec!["pspnet/pspnet_r18.py", "segformer/b0.rhai"]);
        let (relative, stem, family) = names(dir.path(), &dir.path().join("pspnet/pspnet_r18.py"));
        assert_eq!(
            (relative.as_str(), stem.as_str(), family.as_str()),
            ("pspnet/pspnet_r18.py", "pspnet_r18", "pspnet")
        );
    }

    #[test]
    fn gpus_are_labelled_by_preset_or_size() {
        assert_eq!(AtlasGpu::preset("rtx3090").label(), "rtx3090");
        let vram = AtlasGpu {
            preset: None,
            vram: Some("6G".into()),
            compute_capability: None,
        };
        assert_eq!(vram.label(), "vram-6G");
        assert!(vram.budget(None).unwrap().vram_bytes == 6 << 30);
    }
}
