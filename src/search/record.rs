//! What a search records: each evaluated candidate's outcome (as the
//! journal stores it) and the search's result (as `search --json` prints it).

use super::space::{Candidate, Recipe};
use super::spec::Objective;
use crate::predict::Budget;

/// How a candidate fared.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CandidateStatus {
    /// Within the budget.
    Fits,
    /// Above the budget, or out of memory.
    Oom,
    /// The trial failed for another reason (see the record's reason).
    Error,
    NonFiniteLoss,
    /// Cannot train at this setting whatever the memory (BatchNorm on one
    /// value per channel at batch 1); the reason says why.
    Infeasible,
    Timeout,
    /// The trial's process died without a report.
    Crash,
    /// The host refused the trial what it needed (RAM, address space, a
    /// temporary file, the worker itself): no answer about the candidate.
    Environment,
}

impl CandidateStatus {
    pub fn name(self) -> &'static str {
        match self {
            CandidateStatus::Fits => "fits",
            CandidateStatus::Oom => "oom",
            CandidateStatus::Error => "error",
            CandidateStatus::NonFiniteLoss => "non_finite_loss",
            CandidateStatus::Infeasible => "infeasible",
            CandidateStatus::Timeout => "timeout",
            CandidateStatus::Crash => "crash",
            CandidateStatus::Environment => "environment",
        }
    }

    /// The status of a trial that gave no verdict (see
    /// [`TrialStatus::is_environment`]).
    pub fn unanswered(status: crate::trial::TrialStatus) -> CandidateStatus {
        use crate::trial::TrialStatus;
        match status {
            TrialStatus::Timeout => CandidateStatus::Timeout,
            TrialStatus::Crash => CandidateStatus::Crash,
            _ => CandidateStatus::Environment,
        }
    }

    /// Whether the status is a property of the candidate (it fits, runs
    /// out of memory on the budget, cannot train, diverges, or its model
    /// fails), which a re-run may reuse from the journal; a crash, a missed
    /// deadline or a refusal of the host is not, and is tried again.
    pub fn is_verdict(self) -> bool {
        !matches!(
            self,
            CandidateStatus::Timeout | CandidateStatus::Crash | CandidateStatus::Environment
        )
    }
}

/// Whether a figure was measured on the GPU or predicted without it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A real CUDA trial.
    Measured,
    /// From CPU traces replayed through the caching allocator model.
    Predicted,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Measured => "measured",
            Mode::Predicted => "predicted",
        }
    }
}

/// One evaluated candidate.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct TrialRecord {
    pub status: CandidateStatus,
    pub reason: Option<String>,
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    /// Reserved + CUDA context, compared with the usable budget.
    pub device_bytes: Option<u64>,
    pub images_per_s: Option<f64>,
    /// The predicted step time and its parts, where the trace has every
    /// op's work (`images_per_s` is the batch over its `step_s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time: Option<crate::predict::speed::StepTime>,
    pub mode: Mode,
    /// With gradient checkpointing, the step time it adds, as a fraction
    /// of the step without it (predicted: the recomputed forward's FLOPs
    /// over three times the forward's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_cost: Option<f64>,
    /// A measured candidate's prediction, kept beside the measurement
    /// (predict-then-confirm on a GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<Prediction>,
    /// The `PYTORCH_CUDA_ALLOC_CONF` the candidate fits only with
    /// (predicted: it does not fit with the allocator's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_conf: Option<String>,
    /// Measured on CUDA: `max_memory_allocated` of the first step (with
    /// cudnn_benchmark, its algorithm searches: MMEngine's first log line),
    /// beside `peak_allocated_bytes`, the steady state after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_interval_allocated_bytes: Option<u64>,
}

/// What was predicted for a candidate that was then measured.
#[derive(
    Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Prediction {
    pub device_bytes: Option<u64>,
    pub images_per_s: Option<f64>,
}

impl TrialRecord {
    pub fn fits(&self) -> bool {
        self.status == CandidateStatus::Fits
    }

    /// An infeasible candidate without figures.
    pub fn failed(status: CandidateStatus, reason: String, mode: Mode) -> TrialRecord {
        TrialRecord {
            status,
            reason: Some(reason),
            peak_allocated_bytes: None,
            peak_reserved_bytes: None,
            device_bytes: None,
            images_per_s: None,
            step_time: None,
            mode,
            checkpoint_cost: None,
            predicted: None,
            alloc_conf: None,
            first_interval_allocated_bytes: None,
        }
    }

    /// The allocator settings the record's figures assume.
    pub fn allocator_settings(&self) -> crate::predict::allocator::AllocatorSettings {
        self.alloc_conf
            .as_deref()
            .and_then(|c| c.parse().ok())
            .unwrap_or_default()
    }
}

/// A candidate with its outcome.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Outcome {
    pub candidate: Candidate,
    pub record: TrialRecord,
    /// Whether this run evaluated it (false: from the journal).
    pub ran_now: bool,
}

/// What a search found.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SearchResult {
    pub config: String,
    /// Training settings, or inference settings (`search --mode infer`).
    #[serde(default)]
    pub run_mode: crate::kinds::RunMode,
    pub budget: Budget,
    /// GPUs training data-parallel; `budget` is per GPU.
    pub gpus: i64,
    /// The PyTorch release predicted for, and why that one.
    #[serde(default)]
    pub torch: crate::kinds::TorchVersion,
    #[serde(default)]
    pub torch_source: String,
    pub recipe: Recipe,
    pub objective: Objective,
    pub mode: Mode,
    /// Ranked feasible candidates, best first.
    pub feasible: Vec<Outcome>,
    pub infeasible: Vec<Outcome>,
    /// Candidates in the full grid.
    pub grid_size: usize,
    /// Candidates evaluated by this run (not from the journal).
    pub trials_run: usize,
    /// Candidates taken from the journal.
    pub trials_resumed: usize,
    /// CPU traces run for the predictions.
    pub traces_run: usize,
    /// On a GPU: candidates predicted before the real trials confirmed the
    /// best of them (0 when every candidate was measured or predicted only).
    #[serde(default)]
    pub predictions_confirmed_from: usize,
    pub winner: Option<Outcome>,
    /// Files written for the winner.
    pub emitted: Vec<String>,
    pub cfg_options: Option<String>,
    /// Set when no batch size keeps the recipe's effective batch.
    pub auto_scale_lr: bool,
    /// Every change the written config makes to the recipe, with its reason.
    #[serde(default)]
    pub changes: Vec<super::recipe::Change>,
    /// The schedule as the written config runs it (iterations, optimizer
    /// updates, images seen), for an iteration-based loop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// The written schedule's training time at the winner's predicted
    /// step time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training_time: Option<crate::predict::speed::ScheduleTime>,
    /// The user's own recipe as a candidate (its batch, crop, precision and
    /// the accumulation keeping its effective batch), judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe_outcome: Option<Outcome>,
    pub journal: String,
    /// Lines of the journal that were not trial records (a torn last line
    /// of a killed run, foreign text): skipped, not lost silently.
    #[serde(default)]
    pub journal_skipped_lines: usize,
    /// Journal rows not reused: recorded with other inputs (what differs),
    /// or failing their checksum; their candidates were evaluated again.
    #[serde(default, skip_serializing_if = "super::journal::NotReused::is_empty")]
    pub journal_not_reused: super::journal::NotReused,
    /// `DIR/report/report.html` when it was written for an earlier search
    /// (now out of date: `segtune report DIR` writes it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_report: Option<String>,
}
