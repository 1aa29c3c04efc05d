//! Training trials: the model of a resolved config built in libtorch, a
//! synthetic batch shaped like the recipe's, warm-up steps, then measured
//! steps (data preprocessing, forward, loss, backward, optimizer step,
//! zero_grad, as mmengine's `train_step` does), with peak memory (the
//! counting CPU allocator, or the CUDA caching allocator's statistics) and
//! step times. Out-of-memory and other failures become a status, never a
//! crash.
//!
//! A trial runs in the `segtune-torch` worker process (libtorch loads
//! there, and a process-wide allocator count starts clean). The protocol:
//! the parent sends a [`TrialRequest`] as the worker's argv
//! ([`TrialRequest::to_argv`]), the worker answers with a [`TrialReport`]
//! as JSON ([`worker::Worker`] on the parent side, [`execute`] on the
//! worker side).
//!
//! - `request.rs`, `report.rs`: the protocol's two types.
//! - `worker.rs`: the parent side (spawn, timeout, crash, reply).
//! - `execute.rs`: the worker side (resolve, check, run, inspect).
//! - `run.rs`, `batch.rs`, `setup.rs`: one trial in this process.
//! - `optim/`, `amp.rs`, `ddp.rs`: what the optimizer wrapper and DDP hold.
//! - `memory.rs` + `shim.cpp`, `trace.rs`: measuring and tracing memory.

pub mod amp;
pub mod batch;
pub mod ddp;
pub mod execute;
pub mod memory;
pub mod optim;
pub mod report;
pub mod request;
pub mod run;
pub mod setup;
pub mod trace;
pub mod worker;

pub use amp::Amp;
pub use execute::{execute, inspect, ModelSummary};
pub use report::{StepRecord, TrialReport, TrialStatus};
pub use request::{DeviceChoice, TrialRequest};
pub use run::run;
pub use setup::{Stack, TrainingSetup};
use tch::Device;

/// The machine's cores (at least 1).
pub fn host_cores() -> i32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as i32)
}

/// What to run.
#[derive(Debug, Clone)]
pub struct TrialSpec {
    pub batch_size: i64,
    pub crop: (i64, i64),
    pub amp: Amp,
    /// `accumulative_counts` (overrides the config's when set).
    pub accumulative_counts: Option<i64>,
    pub warmup_steps: usize,
    pub measured_steps: usize,
    pub device: Device,
    pub seed: i64,
    /// Fraction of label pixels set to `ignore_index`.
    pub ignore_fraction: f64,
    /// A CPU byte cap: allocations beyond it fail as out of memory.
    pub cpu_cap_bytes: Option<i64>,
    /// Record every CPU allocation and free of the measured steps.
    pub trace: bool,
    /// Threads for CPU ops (the oracle used 1).
    pub threads: Option<i32>,
    /// Whose memory behaviour to reproduce.
    pub stack: Stack,
    /// GPUs of a data-parallel (DDP) run: each holds DDP's gradient buckets.
    pub gpus: i64,
    /// The CPU trial stands in for a CUDA run: where CUDA's PyTorch does
    /// otherwise, do as it does (CUDA's autocast rules with half precision
    /// held as bf16, the same two bytes; fp16's GradScaler; the optimizers'
    /// foreach implementation). For traces that predict a GPU.
    pub as_cuda: bool,
}

impl Default for TrialSpec {
    fn default() -> TrialSpec {
        TrialSpec {
            batch_size: 2,
            crop: (512, 512),
            amp: Amp::Off,
            accumulative_counts: None,
            warmup_steps: 1,
            measured_steps: 2,
            device: Device::Cpu,
            seed: 0,
            ignore_fraction: 0.0,
            cpu_cap_bytes: None,
            trace: false,
            threads: None,
            stack: Stack::Current,
            gpus: 1,
            as_cuda: false,
        }
    }
}
