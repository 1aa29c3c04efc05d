//! Candidates measured by real CUDA trials, each in its own worker process.

use super::Evaluator;
use crate::kinds::{DeviceChoice, TrainingSetup};
use crate::predict::Budget;
use crate::search::record::{CandidateStatus, Mode, TrialRecord};
use crate::search::space::Candidate;
use crate::trial::{TrialRequest, TrialStatus};
use crate::worker::Worker;
use std::path::PathBuf;
use std::time::Duration;

/// Measures candidates with real CUDA trials.
pub struct MeasuredEvaluator {
    pub worker: Worker,
    pub config: PathBuf,
    pub cfg_options: Vec<String>,
    pub device: usize,
    pub budget: Budget,
    pub timeout: Duration,
    /// GPUs of the data-parallel run the trial stands for (DDP's buckets).
    pub gpus: i64,
    /// Classes per synthetic label map (see `TrialRequest::gt_segments`).
    pub gt_segments: Option<i64>,
    /// Training or inference trials.
    pub mode: crate::kinds::RunMode,
    /// `--cudnn-benchmark` (default: the config's).
    pub cudnn_benchmark: Option<bool>,
}

/// The candidate status of a trial that did not end `ok`.
fn status_of(status: TrialStatus) -> CandidateStatus {
    match status {
        TrialStatus::Ok => CandidateStatus::Fits,
        TrialStatus::Oom => CandidateStatus::Oom,
        // The host's RAM ran out beside the GPU: no answer about the card.
        TrialStatus::HostOom => CandidateStatus::Environment,
        TrialStatus::Error => CandidateStatus::Error,
        TrialStatus::NonFiniteLoss => CandidateStatus::NonFiniteLoss,
        TrialStatus::Infeasible => CandidateStatus::Infeasible,
        TrialStatus::Timeout => CandidateStatus::Timeout,
        TrialStatus::Crash => CandidateStatus::Crash,
    }
}

impl Evaluator for MeasuredEvaluator {
    fn mode(&self) -> Mode {
        Mode::Measured
    }

    fn evaluate(&mut self, c: &Candidate) -> TrialRecord {
        let request = TrialRequest {
            cfg_options: crate::search::space::options_with_knobs(&self.cfg_options, c.knobs()),
            batch_size: c.batch_size,
            crop: c.crop,
            amp: c.amp,
            accumulative_counts: Some(c.accumulation),
            // A whole accumulation cycle after the first optimizer step
            // (the optimizer state exists; the cycle's last micro-step
            // holds its gradients through the forward): 1 + 2 without.
            warmup_steps: if c.accumulation > 1 {
                c.accumulation as usize
            } else {
                1
            },
            measured_steps: if c.accumulation > 1 {
                c.accumulation as usize
            } else {
                2
            },
            device: DeviceChoice::Cuda(self.device),
            setup: TrainingSetup {
                gpus: self.gpus,
                ..TrainingSetup::default()
            },
            gt_segments: self.gt_segments,
            mode: self.mode,
            cudnn_benchmark: self.cudnn_benchmark,
            // The budget is a real limit on the card: a larger GPU stands
            // in for the one searched for.
            vram_budget_bytes: Some(self.budget.usable_bytes),
            ..TrialRequest::new(&self.config)
        };
        let report = match self.worker.trial(&request, Some(self.timeout)) {
            Ok(r) => r,
            Err(e) => {
                // An input error is the candidate's (its config or model);
                // a worker that cannot start is the host's.
                let status = if matches!(e, crate::error::Error::Environment { .. }) {
                    CandidateStatus::Environment
                } else {
                    CandidateStatus::Error
                };
                return TrialRecord::failed(status, e.to_string(), Mode::Measured);
            }
        };
        if report.status != TrialStatus::Ok {
            return TrialRecord::failed(
                status_of(report.status),
                report.message.unwrap_or_default(),
                Mode::Measured,
            );
        }
        let reserved = report.cuda_peak_reserved_bytes.unwrap_or(0).max(0) as u64;
        let device = reserved + self.budget.cuda_context_bytes;
        let mut record = TrialRecord {
            status: CandidateStatus::Fits,
            reason: None,
            peak_allocated_bytes: report.cuda_peak_allocated_bytes.map(|b| b.max(0) as u64),
            peak_reserved_bytes: Some(reserved),
            device_bytes: Some(device),
            images_per_s: report.images_per_s,
            step_time: None,
            mode: Mode::Measured,
            checkpoint_cost: None,
            predicted: None,
            alloc_conf: None,
            first_interval_allocated_bytes: report
                .cuda_first_step_peak_allocated_bytes
                .map(|b| b.max(0) as u64),
        };
        if device > self.budget.usable_bytes {
            record.status = CandidateStatus::Oom;
            record.reason = Some("ran, but above the usable budget (VRAM minus the margin)".into());
        }
        record
    }
}
