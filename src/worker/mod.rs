//! Trials in other processes: the parent side of the worker protocol
//! (`process.rs`: spawn, timeout, crash, reply; `child.rs`: one worker
//! process, its group killed whole, the live registry), the worker side
//! (`execute.rs`: resolve, check, run, inspect), CPU requests forked from
//! one loaded worker (`fork_server.rs`), the launchers (local, and
//! `launcher.rs`: the worker run as a Slurm job step, `srun`, `scancel`),
//! what the machine gives a worker (`machine.rs`: libtorch, the driver, the
//! CUDA check, the Python's torch), and the Python worker
//! (`python_worker.rs` + `python_worker.py`: the same request answered by
//! MMSeg itself in the user's Python). One step in a process is
//! [`crate::trial`]'s; this layer only moves requests and reports.

mod child;
pub mod execute;
pub mod fork_server;
pub mod launcher;
pub mod machine;
mod process;
pub mod python_worker;

pub use execute::{execute, inspect, ModelSummary};
pub use process::*;
