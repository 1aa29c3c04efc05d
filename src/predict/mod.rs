//! Predicting a training step's GPU memory without the GPU: an exact CPU
//! allocation trace of the step (from a trial), replayed through a model of
//! PyTorch's CUDA caching allocator, plus what the CPU does not show (the
//! CUDA context, cuBLAS workspaces, the input batch's device copies).
//!
//! - `budget.rs`: the GPU (preset or `--vram`) and its memory budget.
//! - `step_trace.rs`: a step traced on the CPU by the worker.
//! - `extrapolate.rs`: larger batches from traces at batch 2 and 3.
//! - `allocator.rs`, `expandable.rs`, `replay.rs`: the caching allocator
//!   model (default and expandable segments, `max_split_size_mb`) and the replay.
//! - `kernels/`: what CUDA kernels allocate at their calls (cuDNN's
//!   convolution workspaces, ATen kernels' scratch, cuBLAS workspaces).
//! - `breakdown.rs`: the predicted peak split into what it holds.
//! - `speed/`: the step time on a card, kernel by kernel from the trace.
//! - `estimate.rs`: the estimate with its fixed terms; `from_config.rs`:
//!   `segtune estimate` as a library call.

pub mod allocator;
pub mod breakdown;
pub mod budget;
pub mod doctor;
pub mod estimate;
pub mod expandable;
pub mod extrapolate;
pub mod from_config;
pub mod kernels;
pub mod local_gpu;
pub mod replay;
pub mod speed;
pub mod step_trace;
pub mod trace_cache;
pub mod unexplained;

pub use budget::{Budget, Gpu};
pub use estimate::Estimate;
pub use from_config::{estimate_config, step_work, EstimateRequest};
pub use step_trace::{trace_step, trace_step_cached, StepToTrace, TraceKind, TracedStep};
pub use trace_cache::TraceCache;
