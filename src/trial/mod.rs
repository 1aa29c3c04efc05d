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
//! - `worker.rs`: the parent side (spawn, timeout, crash, reply); `child.rs`:
//!   one worker process, its group killed whole, the live registry;
//!   `launcher.rs`: the worker run as a Slurm job step (`srun`, `scancel`).
//! - `execute.rs`: the worker side (resolve, check, run, inspect).
//! - `run.rs`, `batch.rs`, `setup.rs`: one trial in this process
//!   (`error.rs`: why it could not run);
//!   `torch_version.rs`, `autocast_lists.rs`: the PyTorch release it
//!   reproduces;
//!   `infer.rs`: its step in inference mode.
//! - `python_worker.rs` + `python_worker.py`: the same request answered by
//!   MMSeg itself in the user's Python (models with types segtune does not
//!   build: a custom backbone from `custom_imports`).
//! - `optim/`, `amp.rs`, `ddp.rs`: what the optimizer wrapper and DDP hold.
//! - `memory.rs` + `shim.cpp`, `trace.rs`: measuring and tracing memory
//!   (every shim function is declared in `crate::ffi` and `segtune_ffi.h`);
//!   `kernel_calls.rs` + `shim_kernel_calls.cpp`: the calls whose CUDA
//!   kernels take scratch memory, recorded with a trace.

pub mod amp;
pub mod autocast_lists;
pub mod batch;
mod child;
pub mod ddp;
pub mod emulation;
pub mod error;
pub mod execute;
pub mod fork_server;
pub mod infer;
pub mod kernel_calls;
pub mod launcher;
pub mod machine;
pub mod memory;
pub mod mmcv_version;
pub mod op_work;
pub mod optim;
pub mod python_worker;
pub mod report;
pub mod request;
pub mod run;
pub mod setup;
pub mod torch_version;
pub mod trace;
pub mod worker;

pub use amp::Amp;
pub use error::TrialError;
pub use execute::{execute, inspect, ModelSummary};
pub use memory::OpTrace;
pub use mmcv_version::{MmcvSwitch, MmcvVersion};
pub use report::{PythonRuntime, StepRecord, TrialReport, TrialStatus, WorkerKind};
pub use request::{DeviceChoice, RunMode, TrialRequest, DEFAULT_GT_SEGMENTS};
pub use run::run;
pub use setup::{Stack, TrainingSetup};
pub use torch_version::{Switch, TorchVersion};

/// The machine's cores (at least 1).
pub fn host_cores() -> i32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as i32)
}

#[cfg(test)]
mod tests {
    /// `meta_by_rule` looks an op's name up in one set before its rules:
    /// a rule whose name is missing there would never run (its op would go
    /// to CPU stand-ins).
    #[test]
    fn every_meta_shape_rule_is_in_the_lookup_set() {
        let source = include_str!("shim_meta_rules.cpp");
        let (set, rules) = source
            .split_once("if (!kRuled.count(name)) return false;")
            .expect("the lookup comes before the rules");
        let listed: std::collections::BTreeSet<&str> = set
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|n| n.starts_with("aten::"))
            .collect();
        let ruled: std::collections::BTreeSet<&str> = rules
            .split("name == \"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap())
            .collect();
        assert!(!ruled.is_empty());
        let missing: Vec<_> = ruled.difference(&listed).collect();
        assert!(missing.is_empty(), "add to kRuled: {missing:?}");
    }
}
