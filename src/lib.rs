//! segtune: find the MMSegmentation training config (batch size, crop,
//! gradient accumulation, AMP) that fits a GPU, by measurement.
//!
//! Data flows one way, each layer using only those before it:
//! [`config`] (load and resolve MMSeg/Rhai configs) → [`models`] (the same
//! modules in libtorch) → [`trial`] (training steps measured in a worker
//! process) → [`predict`] (GPU memory from CPU traces) → [`search`] (the best
//! feasible candidate) → [`report`] (text and tables) → [`cli`] (the command
//! lines). [`error`] is the one error type after the config layer; [`ffi`] is
//! the one seam to the C++ shim. See `docs/architecture.md`.

pub mod cli;
pub mod config;
pub mod error;
pub mod ffi;
pub mod models;
pub mod named;
pub mod predict;
pub mod report;
pub mod search;
pub mod status;
pub mod trial;

pub use error::{Error, Result};

/// Counts what a config's evaluation holds, so that it can be bounded
/// ([`config::budget`]).
#[global_allocator]
static ALLOCATOR: config::budget::Metered = config::budget::Metered;
