//! What a trial reports: the worker's reply, serialised by the worker and
//! read back by the parent (the text form is the `report` layer's).

use super::memory::{DeviceStats, TraceEvent};
use super::TrialRequest;
use crate::kinds::Amp;
use crate::models::layers::norm::ONE_VALUE_PER_CHANNEL;
use crate::models::EncoderDecoder;

pub use crate::status::TrialStatus;

/// One training step's figures (bytes relative to the allocator count
/// before the model was built).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StepRecord {
    pub step: usize,
    pub measured: bool,
    pub seconds: f64,
    pub bytes_before: i64,
    pub peak_bytes: i64,
    pub bytes_after: i64,
    pub forward_peak: i64,
    pub backward_peak: i64,
    pub optimizer_peak: i64,
    pub loss: Option<f64>,
    pub cuda: Option<DeviceStats>,
}

/// Parameter counts of one top-level module.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct PrefixCount {
    pub total: i64,
    pub trainable: i64,
}

/// Which worker ran a trial: segtune's own libtorch rebuild of the model
/// (`segtune-torch`), or MMSeg itself in the user's Python
/// (`python_worker.py`, for models with types segtune does not build).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerKind {
    #[default]
    Native,
    Python,
}

impl WorkerKind {
    pub fn is_native(&self) -> bool {
        *self == WorkerKind::Native
    }
}

/// The Python a Python-worker trial ran in, and its packages' versions.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PythonRuntime {
    pub executable: String,
    /// `torch.__version__` (`2.11.0+cu130`).
    pub torch: String,
    /// `mmseg.__version__`.
    pub mmseg: String,
}

/// A trial's result.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TrialReport {
    /// Which worker ran it (written only for the Python worker: reports
    /// without it are native).
    #[serde(default, skip_serializing_if = "WorkerKind::is_native")]
    pub worker: WorkerKind,
    /// The Python worker's interpreter and versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonRuntime>,
    pub status: TrialStatus,
    pub message: Option<String>,
    pub device: String,
    pub batch_size: i64,
    pub crop: [i64; 2],
    pub amp: Amp,
    pub accumulative_counts: i64,
    /// Training or inference steps.
    #[serde(default)]
    pub mode: crate::kinds::RunMode,
    /// The PyTorch release whose memory behaviour the trial reproduced.
    pub torch: crate::kinds::TorchVersion,
    /// GPUs of the data-parallel run it stands for (DDP's buckets held).
    pub gpus: i64,
    /// Whether a CPU trial stood in for a CUDA run (CUDA's autocast rules,
    /// GradScaler, foreach optimizers).
    pub as_cuda: bool,
    pub optimizer: String,
    pub params_total: i64,
    pub params_trainable: i64,
    pub params_by_prefix: indexmap::IndexMap<String, PrefixCount>,
    pub param_bytes: i64,
    pub buffer_bytes: i64,
    pub bytes_after_model_build: i64,
    pub batch_bytes: i64,
    pub bytes_before_step1: i64,
    /// CPU: the counting allocator's high-water mark over the measured
    /// steps (the oracle's `peak_steps2_3_bytes`).
    pub peak_bytes: Option<i64>,
    /// CUDA: `max_memory_allocated` over the measured steps.
    pub cuda_peak_allocated_bytes: Option<i64>,
    /// CUDA: `max_memory_reserved` over the measured steps.
    pub cuda_peak_reserved_bytes: Option<i64>,
    /// CUDA: `max_memory_allocated` of the first step (with cudnn_benchmark:
    /// its algorithm searches; what MMEngine's first log line holds), while
    /// `cuda_peak_allocated_bytes` is the steady state after it (its later
    /// lines: MMEngine resets the peak at each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_first_step_peak_allocated_bytes: Option<i64>,
    /// CUDA with `--vram`: the CUDA context measured at start
    /// (`cudaMemGetInfo`'s total less free before the first tensor) and the
    /// caching allocator's share of the device it was capped at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_context_measured_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_memory_fraction: Option<f64>,
    /// The cuDNN flags the trial ran with on CUDA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cudnn_benchmark: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cudnn_deterministic: Option<bool>,
    pub optimizer_state_bytes: i64,
    /// Forward FLOPs of one step (convolutions, linear layers, attention);
    /// a training step is about three times this.
    pub forward_flops: f64,
    /// FLOPs of the forwards that gradient checkpointing ran again in the
    /// backward (not in `forward_flops`).
    #[serde(default)]
    pub recompute_flops: f64,
    pub step_time_median_s: Option<f64>,
    pub images_per_s: Option<f64>,
    pub steps: Vec<StepRecord>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub trace: Option<Vec<TraceEvent>>,
    /// The kernel calls recorded with an op-level trace (written with it).
    #[serde(skip)]
    pub kernel_calls: Vec<super::kernel_calls::KernelCall>,
    /// Every op's work recorded with them (written with the trace).
    #[serde(skip)]
    pub op_work: Vec<super::op_work::OpWork>,
    /// The model parts a trace's events name (`TraceEvent::scope` ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_scopes: Vec<String>,
    /// What the trace counted (`off`: every CPU allocation).
    #[serde(default)]
    pub op_trace: super::OpTrace,
    /// Ops a meta trace ran on CPU stand-ins (no C++ meta kernel).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub meta_ops_on_cpu: Vec<String>,
    /// Data-dependent values (`.item()`) a meta trace stood in for with 0.
    #[serde(default)]
    pub meta_stand_ins: i64,
}

impl TrialReport {
    /// An empty report of `request` running on `device` (its name in reports).
    pub fn new(request: &TrialRequest, device: String) -> TrialReport {
        TrialReport {
            worker: WorkerKind::Native,
            python: None,
            status: TrialStatus::Ok,
            message: None,
            device,
            batch_size: request.batch_size,
            crop: [request.crop.0, request.crop.1],
            amp: request.amp,
            accumulative_counts: request.accumulative_counts.unwrap_or(1),
            mode: request.mode,
            torch: request.setup.torch,
            gpus: request.setup.gpus,
            as_cuda: request.as_cuda,
            optimizer: String::new(),
            params_total: 0,
            params_trainable: 0,
            params_by_prefix: indexmap::IndexMap::new(),
            param_bytes: 0,
            buffer_bytes: 0,
            bytes_after_model_build: 0,
            batch_bytes: 0,
            bytes_before_step1: 0,
            peak_bytes: None,
            cuda_peak_allocated_bytes: None,
            cuda_peak_reserved_bytes: None,
            cuda_first_step_peak_allocated_bytes: None,
            cuda_context_measured_bytes: None,
            cuda_memory_fraction: None,
            cudnn_benchmark: None,
            cudnn_deterministic: None,
            optimizer_state_bytes: 0,
            forward_flops: 0.0,
            recompute_flops: 0.0,
            step_time_median_s: None,
            images_per_s: None,
            steps: Vec::new(),
            trace: None,
            kernel_calls: Vec::new(),
            op_work: Vec::new(),
            model_scopes: Vec::new(),
            op_trace: request.op_trace,
            meta_ops_on_cpu: Vec::new(),
            meta_stand_ins: 0,
        }
    }

    /// The report of a request the worker never answered (see
    /// [`super::worker::Worker::trial`]): no figures, only the request.
    pub fn unanswered(request: &TrialRequest, status: TrialStatus, message: String) -> TrialReport {
        TrialReport::new(request, request.device.to_string()).failed(status, message)
    }

    pub fn set_params(&mut self, model: &EncoderDecoder) {
        self.params_total = model.params.total();
        self.params_trainable = model.params.trainable();
        self.params_by_prefix = model
            .params
            .by_prefix()
            .into_iter()
            .map(|(k, total, trainable)| (k, PrefixCount { total, trainable }))
            .collect();
        self.param_bytes = model.params.param_bytes();
        self.buffer_bytes = model.params.buffer_bytes();
    }

    pub fn failed(mut self, status: TrialStatus, message: String) -> TrialReport {
        let message = without_backtrace(&message);
        self.status = if status == TrialStatus::Error && is_host_refusal(&message) {
            TrialStatus::HostOom
        } else {
            status
        };
        self.message = Some(message);
        self.finish();
        self
    }

    /// A failure that libtorch raised (tch turns C++ exceptions into panics).
    pub fn failed_from_panic(self, panic: Box<dyn std::any::Any + Send>) -> TrialReport {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "libtorch failed".into());
        let status = if message.contains(ONE_VALUE_PER_CHANNEL) {
            TrialStatus::Infeasible
        } else if is_out_of_memory(&message) {
            TrialStatus::Oom
        } else {
            TrialStatus::Error
        };
        self.failed(status, one_line_reason(&message))
    }

    pub fn push_step(&mut self, record: StepRecord) {
        self.steps.push(record);
    }

    /// Aggregates the measured steps.
    pub fn finish(&mut self) {
        self.cuda_first_step_peak_allocated_bytes = self
            .steps
            .first()
            .and_then(|s| s.cuda.map(|c| c.allocated_peak));
        let measured: Vec<&StepRecord> = self.steps.iter().filter(|s| s.measured).collect();
        if measured.is_empty() {
            return;
        }
        self.peak_bytes = measured.iter().map(|s| s.peak_bytes).max();
        self.cuda_peak_allocated_bytes = measured
            .iter()
            .filter_map(|s| s.cuda.map(|c| c.allocated_peak))
            .max();
        self.cuda_peak_reserved_bytes = measured
            .iter()
            .filter_map(|s| s.cuda.map(|c| c.reserved_peak))
            .max();
        let mut times: Vec<f64> = measured.iter().map(|s| s.seconds).collect();
        times.sort_by(f64::total_cmp);
        let median = if times.len() % 2 == 1 {
            times[times.len() / 2]
        } else {
            (times[times.len() / 2 - 1] + times[times.len() / 2]) / 2.0
        };
        self.step_time_median_s = Some(median);
        self.images_per_s = Some(self.batch_size as f64 / median);
    }
}

/// A libtorch message without the C++ backtrace that `c10::Error` appends
/// ("Exception raised from ... frame #0: ..."), which says nothing to a user.
pub fn without_backtrace(message: &str) -> String {
    let cut = ["\nException raised from", "\\nException raised from"]
        .iter()
        .filter_map(|marker| message.find(marker))
        .min()
        .unwrap_or(message.len());
    message[..cut].trim_end().to_string()
}

/// Whether an error is the host refusing the worker a resource it asked
/// for (address space under `ulimit -v`, a thread, C++'s `bad_alloc`), not
/// the step's own failure.
pub fn is_host_refusal(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("cannot reserve address space")
        || m.contains("std::bad_alloc")
        || m.contains("resource temporarily unavailable")
}

/// Whether a libtorch error message is an out-of-memory error.
pub fn is_out_of_memory(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("out of memory")
        || m.contains("outofmemoryerror")
        || m.contains("can't allocate memory")
        || m.contains("failed to allocate")
}

/// The reason of a panic in one line: libtorch's own message without the
/// `unwrap()` wrapper, the escaped C++ backtrace or the source location
/// (`called Result::unwrap() on an Err value: Torch("Trying to create tensor
/// with negative dimension -3: ...\nException raised from ...")` becomes
/// `Trying to create tensor with negative dimension -3: ...`).
pub fn one_line_reason(message: &str) -> String {
    // tch's error, Debug-formatted: its newlines are the two characters `\n`.
    let torch = message.find("Torch(\"").map(|at| {
        let inner = &message[at + "Torch(\"".len()..];
        let inner = inner.split("\\n").next().unwrap_or(inner);
        inner.strip_suffix("\")").unwrap_or(inner)
    });
    let line = torch
        .unwrap_or(message)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("libtorch failed");
    const MAX: usize = 300;
    if line.len() > MAX {
        let cut = (0..=MAX)
            .rev()
            .find(|&i| line.is_char_boundary(i))
            .unwrap_or(0);
        format!("{}...", &line[..cut])
    } else {
        line.to_string()
    }
}

#[cfg(test)]
mod reason_tests {
    use super::{is_host_refusal, one_line_reason, without_backtrace};

    #[test]
    fn a_libtorch_error_is_one_line_without_the_backtrace() {
        let panic = "called `Result::unwrap()` on an `Err` value: Torch(\"Trying to create tensor \
                     with negative dimension -3: [-3, 256, 1, 1]\\nException raised from \
                     check_size_nonnegative at /pytorch/aten/src/ATen/EmptyTensor.h:8 (most \
                     recent call first):\\nframe #0: c10::Error::Error\")";
        assert_eq!(
            one_line_reason(panic),
            "Trying to create tensor with negative dimension -3: [-3, 256, 1, 1]"
        );
        assert_eq!(
            one_line_reason("Expected more than 1 value per channel when training, got input size torch.Size([1, 512, 1, 1])\nmore"),
            "Expected more than 1 value per channel when training, got input size torch.Size([1, 512, 1, 1])"
        );
        assert_eq!(
            one_line_reason("index out of bounds: the len is 0 but the index is 0"),
            "index out of bounds: the len is 0 but the index is 0"
        );
    }

    #[test]
    fn a_failure_message_loses_the_cpp_backtrace() {
        let raw = "segtune: cannot reserve address space for a meta trace\n\
                   Exception raised from operator() at src/shim/shim.cpp:845 (most recent call first):\n\
                   frame #0: c10::Error::Error(...)";
        assert_eq!(
            without_backtrace(raw),
            "segtune: cannot reserve address space for a meta trace"
        );
        assert!(is_host_refusal(&without_backtrace(raw)));
        assert_eq!(without_backtrace("no backtrace here"), "no backtrace here");
    }
}
