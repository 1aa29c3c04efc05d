//! Why a trial in this process could not run or finish: [`TrialError`],
//! each failure a variant of its own, displayed with the message the
//! trial's report carries (status `error`).

use super::kernel_calls::KernelCallParseError;
use super::memory::BudgetBelowContext;
use super::optim::OptimConfigError;
use crate::kinds::TorchVersion;
use crate::models::ModelError;
use crate::shim::ffi::ShimError;

/// A trial's failure before or during its steps (other than a panic, an
/// out-of-memory or a non-finite loss, which the run tells apart itself).
#[derive(Debug, thiserror::Error)]
pub enum TrialError {
    /// A call into the C++ shim failed.
    #[error(transparent)]
    Shim(#[from] ShimError),
    /// The model cannot be built or run as configured.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The `optim_wrapper` cannot be reproduced.
    #[error(transparent)]
    Optimizer(#[from] OptimConfigError),
    /// The shim recorded a kernel call this build cannot read back.
    #[error(transparent)]
    KernelCall(#[from] KernelCallParseError),
    /// `--vram` at or below the device's CUDA context.
    #[error(transparent)]
    VramBudget(#[from] BudgetBelowContext),
    #[error(
        "--vram caps a CUDA device's memory (or, with --as-cuda, the CPU stand-in's); a plain CPU trial takes --cpu-cap"
    )]
    VramOnPlainCpu,
    /// The caching allocator served an allocation past its fraction.
    #[error(
        "the --vram cap ({:.2} GiB for the allocator) did not take effect on cuda:{device}: this PyTorch ignores per_process_memory_fraction",
        .allocator_bytes / (1u64 << 30) as f64
    )]
    VramCapIgnored { allocator_bytes: f64, device: usize },
    #[error("this GPU does not support bf16")]
    Bf16Unsupported,
    #[error("--op-trace traces a CPU (or meta) step; leave it out on CUDA")]
    OpTraceOnCuda,
    #[error(
        "a trial on a GPU runs the PyTorch segtune links ({}); --torch {torch} is reproduced on the CPU only (estimate, predicted search)",
        TorchVersion::NEWEST
    )]
    OlderTorchOnGpu { torch: TorchVersion },
    #[error("--as-cuda makes a CPU trial stand in for a GPU; on CUDA, leave it out")]
    AsCudaOnCuda,
    /// The input batch alone would take more than half the host's RAM.
    #[error(
        "batch {batch_size} x {}x{}: the input batch alone is {:.1} GiB, more than half of this \
         host's {:.1} GiB of RAM; a training step needs many times that",
        .crop.0,
        .crop.1,
        gib(.input_bytes),
        gib(.host_bytes)
    )]
    BatchExceedsHost {
        batch_size: i64,
        crop: (i64, i64),
        input_bytes: u128,
        host_bytes: u128,
    },
}

fn gib(bytes: &u128) -> f64 {
    *bytes as f64 / (1u64 << 30) as f64
}
