//! What a search refuses, and says why, rather than answer wrongly: before
//! any trial, an `--out` that cannot take the winner, a model segtune cannot
//! build, what the Python worker cannot predict; after them, a table with
//! no verdict (every candidate failed for a reason of the host) or none on
//! memory (every one failed for a reason of the config).

use super::emit;
use super::journal::hash_text;
use super::run::SearchRequest;
use super::space::{Amp, Recipe};
use super::spec::SearchSpec;
use crate::config::{dump, Value};
use crate::error::{Error, Result};
use crate::kinds::TorchVersion;
use crate::predict::estimate::BatchLayout;
use crate::worker::Worker;

/// Refuses, before any trial, an `--out` that cannot take the winner: a
/// file where the directory should be, the input itself, or a file of the
/// user's where segtune would write its config.
pub(super) fn check_outputs(
    request: &SearchRequest,
    layout: BatchLayout,
    suffix: &str,
) -> Result<()> {
    super::journal::check_out_dir(&request.out)?;
    super::owned::check_replaceable(&request.out, &super::owned::search_outputs(&request.out))?;
    if layout == BatchLayout::PixelValues {
        return super::emit_hf::check_out(&request.config, &request.out);
    }
    let targets = emit::targets(&request.config, &request.out, suffix);
    emit::check_targets(&request.config, &request.out, &targets)
}

/// Refuses a search none of whose candidates got a verdict: each failed
/// twice for a reason of this machine or the moment (killed, out of the
/// host's memory or address space, past its deadline), so the table would
/// say "nothing fits" of candidates nobody judged. The journal keeps their
/// records but never reuses them: a re-run tries them again.
pub(super) fn some_verdict(outcomes: &[super::record::Outcome]) -> Result<()> {
    if outcomes.is_empty() || outcomes.iter().any(|o| o.record.status.is_verdict()) {
        return Ok(());
    }
    let first = &outcomes[0].record;
    Err(Error::environment(format!(
        "no candidate could be judged: the {} tried all failed for a reason of this machine, \
         not of the candidates (the first: {}: {}); nothing is kept as their result: \
         re-run the search once the cause is gone",
        outcomes.len(),
        first.status.name(),
        first.reason.as_deref().unwrap_or("no reason given")
    )))
}

/// Refuses a search where no candidate was judged on memory (none fits,
/// none is out of memory): each failed for a reason of the config, so
/// "nothing fits" would be a verdict nobody made.
pub(super) fn some_memory_verdict(
    config: &std::path::Path,
    outcomes: &[super::record::Outcome],
) -> Result<()> {
    use super::record::CandidateStatus;
    if outcomes.is_empty()
        || outcomes.iter().any(|o| {
            matches!(
                o.record.status,
                CandidateStatus::Fits | CandidateStatus::Oom
            )
        })
    {
        return Ok(());
    }
    let first = &outcomes[0];
    Err(Error::Input(format!(
        "no candidate could be judged on memory: the {} tried all failed for a reason of the config {}          (the first, batch {} x {}x{} {}: {}: {}); fix the config and search again",
        outcomes.len(),
        config.display(),
        first.candidate.batch_size,
        first.candidate.crop.0,
        first.candidate.crop.1,
        first.candidate.amp,
        first.record.status.name(),
        first.record.reason.as_deref().unwrap_or("no reason given")
    )))
}

/// Before any trial: a model segtune cannot build would fail every one. The
/// registry check reads the component types; the worker then builds the
/// model once on the CPU, which also checks every component's settings.
pub(super) fn check_buildable(
    cfg: &crate::config::Dict,
    request: &SearchRequest,
    worker: &Worker,
) -> Result<()> {
    let unbuildable = |source| Error::Model {
        source,
        config: request.config.clone(),
    };
    // MMSeg itself builds the model: its first trace says what it refuses.
    if request.run.python.is_some() {
        return Ok(());
    }
    crate::models::check_supported(cfg).map_err(unbuildable)?;
    // An atlas searches one config for several GPUs: its model is built
    // once per process.
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let key = format!(
        "{}|{}",
        worker.stamp(),
        hash_text(&dump::to_json(&Value::Dict(cfg.clone())))
    );
    if BUILT.lock().is_ok_and(|b| b.contains(&key)) {
        return Ok(());
    }
    let summary = worker.inspect(&request.config, &request.cfg_options)?;
    if summary.supported {
        if let Ok(mut built) = BUILT.lock() {
            built.push(key);
        }
        return Ok(());
    }
    match summary.error {
        Some(error) => Err(unbuildable(error)),
        // Only a worker of another segtune answers without the error.
        None => Err(Error::Trial(format!(
            "the inspection refused the model without naming the error ({})",
            summary.reason.as_deref().unwrap_or("no reason given")
        ))),
    }
}

/// What a search through the Python worker can predict: MMSeg's step
/// traced on the CPU, for one GPU, the PyTorch segtune links, in fp32 (the
/// CPU's autocast is not CUDA's). A recipe in mixed precision is not
/// switched to fp32 unless `--amp off` allows it.
pub(super) fn python_worker_limits(
    recipe: &Recipe,
    precisions: &[Amp],
    gpus: i64,
    torch: TorchVersion,
    spec: &SearchSpec,
) -> Result<Vec<Amp>> {
    let refuse = |what: String| {
        Err(Error::Input(format!(
            "--python-worker traces MMSeg's own training step on the CPU, for one GPU, in fp32, \
             with PyTorch {}: {what}",
            TorchVersion::NEWEST
        )))
    };
    if gpus != 1 {
        return refuse(format!(
            "--gpus {gpus} is not predicted that way (DDP's buckets)"
        ));
    }
    if torch != TorchVersion::NEWEST {
        return refuse(format!("--torch {torch} is not"));
    }
    if matches!(spec.device.as_deref(), Some(d) if d.starts_with("cuda")) {
        return refuse(
            "it predicts, it does not measure on a GPU (leave out --device; `segtune trial \
             --python-worker --device cuda:N` measures one setting)"
                .into(),
        );
    }
    if !precisions.contains(&Amp::Off) {
        return refuse(format!(
            "fp16 and bf16 are not predicted that way (--amp {})",
            precisions
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    if recipe.amp != Amp::Off && !precisions.iter().all(|a| *a == Amp::Off) {
        return refuse(format!(
            "the recipe trains in {} (AmpOptimWrapper); `--amp off` lets the search predict \
             and write it in fp32 (a change listed with the others), or `segtune trial \
             --python-worker --device cuda:N --amp {}` measures the recipe on a GPU",
            recipe.amp.precision_name(),
            recipe.amp
        ));
    }
    Ok(vec![Amp::Off])
}
