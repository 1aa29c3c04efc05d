//! The cuDNN flags MMEngine sets from the config (`env_cfg.cudnn_benchmark`,
//! `randomness.deterministic`), which a CUDA trial sets before its steps and
//! a prediction reads for its convolutions' algorithms.

use crate::config::{Dict, Value};

/// `env_cfg.cudnn_benchmark` (MMSeg's default runtime sets True), unless
/// `randomness.deterministic`, which MMEngine's `set_random_seed` makes turn
/// benchmark off.
pub fn cudnn_benchmark(cfg: &Dict) -> bool {
    cfg.get("env_cfg")
        .and_then(|e| e.get_path("cudnn_benchmark"))
        .is_some_and(Value::truthy)
        && !cudnn_deterministic(cfg)
}

/// `randomness.deterministic` (MMEngine: `torch.backends.cudnn.deterministic`).
pub fn cudnn_deterministic(cfg: &Dict) -> bool {
    cfg.get("randomness")
        .and_then(|r| r.get_path("deterministic"))
        .is_some_and(Value::truthy)
}
