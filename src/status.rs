//! How a trial ended: the one kind of the trial layer that the crate's
//! error type (`error.rs`) names too, kept on the ground floor so that no
//! module imports one above it (`crate::trial` re-exports it).

/// How a trial ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialStatus {
    Ok,
    /// Out of memory (CUDA's, or the CPU cap's).
    Oom,
    /// A CPU step needed more RAM than the host had available: no answer
    /// about the model, a limit of this machine.
    HostOom,
    /// libtorch or the config refused the step.
    Error,
    /// The loss was NaN or infinite.
    NonFiniteLoss,
    /// The setting cannot train at all, whatever the memory: BatchNorm in
    /// training on one value per channel (batch 1 after global pooling).
    Infeasible,
    /// No report within the time allowed; the worker was stopped.
    Timeout,
    /// The worker died without a report (a signal, an abort).
    Crash,
}

impl TrialStatus {
    /// The name in reports (`ok`, `oom`, `error`, `non_finite_loss`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TrialStatus::Ok => "ok",
            TrialStatus::Oom => "oom",
            TrialStatus::HostOom => "host_oom",
            TrialStatus::Error => "error",
            TrialStatus::NonFiniteLoss => "non_finite_loss",
            TrialStatus::Infeasible => "infeasible",
            TrialStatus::Timeout => "timeout",
            TrialStatus::Crash => "crash",
        }
    }

    /// Whether the trial failed for a reason of the host or the moment (its
    /// RAM or address space, a kill from outside, a hang) rather than of the
    /// setting it tried: such a failure says nothing about the candidate and
    /// is tried again, never kept as its verdict.
    pub fn is_environment(self) -> bool {
        matches!(
            self,
            TrialStatus::HostOom | TrialStatus::Timeout | TrialStatus::Crash
        )
    }
}
