//! What a resolved config's training loop counts: iterations
//! (`IterBasedTrainLoop`) or epochs, and how many.

use super::{Dict, Value};

/// Whether the training loop counts iterations (`IterBasedTrainLoop`, or a
/// `train_cfg` with `max_iters` and no type).
pub fn iteration_based(cfg: &Dict) -> bool {
    let Some(t) = cfg.get("train_cfg") else {
        return false;
    };
    match t.get_path("type").and_then(Value::as_str) {
        Some(ty) => ty == "IterBasedTrainLoop",
        None => {
            t.get_path("max_iters").is_some() || t.get_path("by_epoch") == Some(&Value::Bool(false))
        }
    }
}

/// The recipe's `train_cfg.max_iters`, where its loop counts iterations.
pub fn max_iters(cfg: &Dict) -> Option<i64> {
    iteration_based(cfg)
        .then(|| cfg.get("train_cfg")?.get_path("max_iters")?.as_i64())
        .flatten()
}

/// The optim wrapper's `accumulative_counts` as the recipe writes it
/// (`None` when absent): the one reader of it, for the trial (which
/// refuses one below 1) and the search ([`accumulation`]).
pub fn accumulative_counts(cfg: &Dict) -> Option<i64> {
    cfg.get("optim_wrapper")
        .and_then(|o| o.get_path("accumulative_counts"))
        .and_then(Value::as_i64)
}

/// The optim wrapper's gradient accumulation (`accumulative_counts`, 1
/// when absent).
pub fn accumulation(cfg: &Dict) -> i64 {
    accumulative_counts(cfg).unwrap_or(1).max(1)
}
