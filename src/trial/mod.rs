//! Training trials: the model of a resolved config built in libtorch, a
//! synthetic batch shaped like the recipe's, warm-up steps, then measured
//! steps (data preprocessing, forward, loss, backward, optimizer step,
//! zero_grad, as mmengine's `train_step` does), with peak memory (the
//! counting CPU allocator, or the CUDA caching allocator's statistics) and
//! step times. Out-of-memory and other failures become a status, never a
//! crash.
//!
//! One trial in this process. It runs in the `segtune-torch` worker
//! (libtorch loads there, and a process-wide allocator count starts clean);
//! moving its [`TrialRequest`] and [`TrialReport`] between processes is
//! [`crate::worker`]'s.
//!
//! - `request.rs`, `report.rs`: what a trial is asked and what it answers.
//! - `run.rs`, `batch.rs`, `cudnn_flags.rs`: one trial (`error.rs`: why it
//!   could not run); `autocast_lists.rs`, `emulation.rs`: the PyTorch
//!   release it reproduces (the releases themselves are
//!   [`crate::kinds`]'s); `infer.rs`: its step in inference mode.
//! - `optim/`, `ddp.rs`: what the optimizer wrapper and DDP hold.
//! - `memory.rs`, `trace.rs`: measuring and tracing memory through the shim
//!   ([`crate::shim`]); `kernel_calls.rs`: the calls whose CUDA kernels take
//!   scratch memory, recorded with a trace; `op_work.rs`: every op's bytes.

pub mod autocast_lists;
pub mod batch;
pub mod cudnn_flags;
pub mod ddp;
pub mod emulation;
pub mod error;
pub mod infer;
pub mod kernel_calls;
pub mod memory;
pub mod op_work;
pub mod optim;
pub mod report;
pub mod request;
pub mod run;
pub mod trace;

pub use error::TrialError;
pub use memory::OpTrace;
pub use report::{PythonRuntime, StepRecord, TrialReport, TrialStatus, WorkerKind};
pub use request::{TrialRequest, DEFAULT_GT_SEGMENTS};
pub use run::run;

/// The machine's cores (at least 1).
pub fn host_cores() -> i32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as i32)
}
