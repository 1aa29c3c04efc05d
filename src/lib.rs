//! segtune: find the MMSegmentation training config (batch size, crop,
//! gradient accumulation, AMP) that fits a GPU, by measurement.
//!
//! Data flows one way, each layer using only those before it:
//! [`config`] (load and resolve MMSeg/Rhai configs) → [`models`] (the same
//! modules in libtorch) → [`trial`] (one training step measured in this
//! process) → [`worker`] (trials in worker processes: the protocol, the
//! launchers, the Python worker) → [`predict`] (GPU memory from CPU traces)
//! → [`search`] (the best feasible candidate) → [`report`] (text and
//! tables) → [`cli`] (the command lines). Under them all, the ground floor:
//! [`kinds`] (the settings every layer names), [`named`], [`status`],
//! [`error`] (the one error type after the config layer) and [`shim`] (the
//! C++ shim and its one Rust seam). See `docs/architecture.md`.

pub mod cli;
pub mod config;
pub mod error;
pub mod kinds;
pub mod models;
pub mod named;
pub mod predict;
pub mod report;
pub mod search;
pub mod shim;
pub mod status;
pub mod trial;
pub mod worker;

pub use error::{Error, Result};

/// Counts what a config's evaluation holds, so that it can be bounded
/// ([`config::eval_meter`]).
#[global_allocator]
static ALLOCATOR: config::eval_meter::Metered = config::eval_meter::Metered;
