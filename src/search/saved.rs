//! What a finished search leaves beside its journal for `segtune report`:
//! `DIR/search.json`, the result with what reproduces its predictions (the
//! config's hash, the `--cfg-options`, the segments setting), written
//! whole (a temporary file renamed over it). The journal's rows of the
//! same config are read back with it.

use super::journal::{JournalRow, MAX_JOURNAL_BYTES};
use super::record::SearchResult;
use super::space::Candidate;
use crate::error::{Error, Result};
use crate::kinds::TrainingSetup;
use crate::predict::allocator::AllocatorSettings;
use crate::predict::breakdown::PeakBreakdown;
use crate::predict::{estimate_config, EstimateRequest, Gpu, TraceKind};
use crate::worker::Worker;
use std::io::{Read, Write};
use std::path::Path;

/// The file in a search's `--out` directory.
pub const SEARCH_FILE: &str = "search.json";

/// A finished search, as saved.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SavedSearch {
    pub result: SearchResult,
    /// The config searched, as an absolute path.
    pub config: std::path::PathBuf,
    /// The resolved config's hash (the journal's key).
    pub config_hash: String,
    pub cfg_options: Vec<String>,
    pub gt_segments: Option<i64>,
    /// The inputs its journal rows were recorded under: the report shows
    /// those rows, not another search's in the same journal (absent in
    /// searches of older segtunes: rows of the config's hash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<super::journal::Inputs>,
}

/// The mode a new file gets from the process's umask, as `open(2)` with
/// 0666 gives it (0644 under the usual umask 022).
pub fn file_mode() -> u32 {
    static MODE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| {
        // umask can only be read by setting it: set and restore at once,
        // before any file is created.
        // SAFETY: umask has no preconditions; it only swaps the mask.
        let mask = unsafe {
            let mask = libc::umask(0o022);
            libc::umask(mask);
            mask
        };
        0o666 & !(mask as u32)
    })
}

/// Writes `bytes` to `path` whole: into a temporary file beside it, synced,
/// then renamed over it; with the mode the umask gives a new file (a
/// temporary file alone would be 0600).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let fail = |e: std::io::Error| Error::io(format!("cannot write {}", path.display()), e);
    let mut tmp = tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(file_mode()))
        .tempfile_in(dir)
        .map_err(fail)?;
    tmp.write_all(bytes).map_err(fail)?;
    tmp.as_file().sync_data().map_err(fail)?;
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

/// Saves a finished search of `request` into its `--out` directory.
pub fn save_result(
    request: &super::SearchRequest,
    result: &SearchResult,
    config_hash: String,
    inputs: &super::journal::Inputs,
) -> Result<()> {
    save(
        &request.out,
        &SavedSearch {
            result: result.clone(),
            config: crate::config::absolute(&request.config),
            config_hash,
            cfg_options: request.cfg_options.clone(),
            gt_segments: request.run.gt_segments,
            inputs: Some(inputs.clone()),
        },
    )
}

/// Saves a finished search into its `--out` directory.
pub fn save(dir: &Path, saved: &SavedSearch) -> Result<()> {
    let text = serde_json::to_string_pretty(saved).expect("results serialise");
    write_atomically(&dir.join(SEARCH_FILE), text.as_bytes())
}

/// The report page in `dir`, if there is one: written for the search
/// that was saved there before, it is out of date once another is.
pub fn stale_report(dir: &Path) -> Option<String> {
    let page = dir.join("report").join("report.html");
    page.is_file().then(|| page.display().to_string())
}

/// Whether the search saved in `dir` wrote `path` (its `search.json` lists
/// a file of that name in `dir` among the emitted ones).
pub fn listed_as_emitted(dir: &Path, path: &Path) -> bool {
    let mut text = String::new();
    let read = std::fs::File::open(dir.join(SEARCH_FILE))
        .and_then(|f| f.take(MAX_JOURNAL_BYTES).read_to_string(&mut text));
    let Ok(saved) = read
        .map_err(|_| ())
        .and_then(|_| serde_json::from_str::<SavedSearch>(&text).map_err(|_| ()))
    else {
        return false;
    };
    saved.result.emitted.iter().any(|e| {
        let e = Path::new(e);
        e.file_name() == path.file_name()
            && e.parent().and_then(|p| p.canonicalize().ok()) == dir.canonicalize().ok()
    })
}

/// Loads a search's `search.json` and its journal's rows of that config.
pub fn load(dir: &Path) -> Result<(SavedSearch, Vec<JournalRow>)> {
    let path = dir.join(SEARCH_FILE);
    let mut text = String::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(MAX_JOURNAL_BYTES).read_to_string(&mut text))
        .map_err(|e| {
            Error::Input(format!(
                "{}: {e}; give the --out directory of a finished `segtune search`",
                path.display()
            ))
        })?;
    let saved: SavedSearch = serde_json::from_str(&text).map_err(|e| {
        Error::Input(format!(
            "{} is not a segtune search result ({e}); run `segtune search` into that directory again",
            path.display()
        ))
    })?;
    let rows = super::journal::rows(dir)?
        .into_iter()
        .filter(|r| r.config_hash == saved.config_hash)
        .filter(|r| saved.inputs.as_ref().is_none_or(|i| i.recorded(r)))
        .collect();
    Ok((saved, rows))
}

/// The winner's predicted peak split into parts (a meta trace of its step),
/// `None` without a winner.
pub fn winner_breakdown(saved: &SavedSearch, worker: &Worker) -> Result<Option<PeakBreakdown>> {
    match &saved.result.winner {
        None => Ok(None),
        Some(w) => {
            breakdown_of(saved, &w.candidate, w.record.allocator_settings(), worker).map(Some)
        }
    }
}

/// A candidate's least needed peak (what decides an OOM) split into parts (a meta trace of its step)
/// under the allocator settings `alloc_conf`.
pub fn breakdown_of(
    saved: &SavedSearch,
    c: &Candidate,
    alloc_conf: AllocatorSettings,
    worker: &Worker,
) -> Result<PeakBreakdown> {
    let r = &saved.result;
    let mut cfg_options = super::space::options_with_knobs(&saved.cfg_options, c.knobs());
    // The step as the search traced it: its accumulation changes what the
    // step holds (gradients accumulated across micro-steps).
    cfg_options.push(format!(
        "optim_wrapper.accumulative_counts={}",
        c.accumulation
    ));
    // The search's card where it was a preset (its rates choose cuDNN's
    // algorithms and their workspaces), else the same memory and capability.
    let mut gpu = match Gpu::preset(&r.budget.gpu) {
        Ok(gpu) if r.budget.gpu != "custom" => gpu,
        _ => Gpu::custom(r.budget.vram_bytes, &r.budget.compute_capability)?,
    };
    // The search replays each step within the usable memory (the margin
    // kept free): where memory is tight the allocator frees its cache and
    // retries, as PyTorch's does, so the figure depends on that capacity.
    gpu.vram_bytes = r.budget.usable_bytes;
    let request = EstimateRequest {
        config: saved.config.clone(),
        cfg_options,
        gpu,
        batch_size: Some(c.batch_size),
        crop: Some(c.crop),
        amp: Some(c.amp),
        threads: None,
        gt_segments: saved.gt_segments,
        setup: TrainingSetup::new(r.gpus, r.torch),
        torch_source: r.torch_source.clone(),
        trace: TraceKind::Meta,
        alloc_conf,
        mode: r.run_mode,
        cudnn_benchmark: None,
        trace_timeout: None,
        python: None,
    };
    Ok(estimate_config(&request, worker)?.least_breakdown)
}

/// The smallest candidate above the winner (same crop, precision and
/// knobs) that does not fit: what `--why` compares the winner with.
pub fn next_that_does_not_fit(r: &SearchResult) -> Option<Candidate> {
    let w = r.winner.as_ref()?.candidate;
    r.infeasible
        .iter()
        .map(|o| o.candidate)
        .filter(|c| {
            c.crop == w.crop
                && c.amp == w.amp
                && c.knobs() == w.knobs()
                && c.batch_size > w.batch_size
        })
        .min_by_key(|c| c.batch_size)
}
