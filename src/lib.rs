//! segtune: find the MMSegmentation training config (batch size, crop,
//! gradient accumulation, AMP) that fits a GPU, by measurement.
//!
//! Data flows one way: [`config`] (load and resolve MMSeg/Rhai configs) →
//! model spec → trial → search → report. The command line ([`cli`]) is a thin
//! layer over these modules.

pub mod cli;
pub mod config;
pub mod models;
pub mod predict;
pub mod search;
pub mod trial;
