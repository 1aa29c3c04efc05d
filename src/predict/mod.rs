//! Predicting a training step's GPU memory without the GPU: an exact CPU
//! allocation trace of the step (from a trial), replayed through a model of
//! PyTorch's CUDA caching allocator, plus what the CPU does not show (the
//! CUDA context, cuBLAS workspaces, the input batch's device copies).

pub mod allocator;
pub mod cli;
pub mod estimate;
pub mod extrapolate;
pub mod replay;
pub mod trace;
