//! What a trial is asked to run: one [`TrialRequest`], the one request
//! format of every worker. It travels as JSON ([`TrialRequest::to_json`]):
//! `segtune-torch run REQUEST` and the Python worker's `--request REQUEST`
//! read the same text, so no worker's command line is kept by hand beside
//! it. `segtune trial`'s flags (in `cli`) build the same request for people.

use crate::kinds::{Amp, DeviceChoice, RunMode, TrainingSetup};
use std::path::PathBuf;

/// One trial: the config, the candidate, the measurement and the setup.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrialRequest {
    /// The config (.py or .rhai) and its `--cfg-options`.
    pub config: PathBuf,
    pub cfg_options: Vec<String>,
    pub batch_size: i64,
    pub crop: (i64, i64),
    pub amp: Amp,
    /// `accumulative_counts` (default: the config's).
    pub accumulative_counts: Option<i64>,
    pub warmup_steps: usize,
    pub measured_steps: usize,
    pub device: DeviceChoice,
    pub seed: i64,
    /// Fraction of label pixels set to `ignore_index` in the synthetic batch.
    pub ignore_fraction: f64,
    /// Classes present in each synthetic label map (at most `num_classes`;
    /// `None`: all, uniform random labels as MMSeg's CPU oracle draws them;
    /// default [`DEFAULT_GT_SEGMENTS`]). Mask2Former makes one ground-truth
    /// segment per class present, so its memory grows with it; the memory
    /// of the other heads does not depend on label values.
    pub gt_segments: Option<i64>,
    /// CPU threads for libtorch (default: libtorch's choice).
    pub threads: Option<i32>,
    /// Cap on live CPU tensor bytes; an allocation beyond it fails as out of memory.
    pub cpu_cap_bytes: Option<u64>,
    /// `--vram`: the GPU memory the trial may use. On CUDA the caching
    /// allocator is capped at it less the CUDA context measured at start
    /// (`per_process_memory_fraction`), so an over-budget candidate really
    /// runs out of memory on a larger card; with `--as-cuda` on the CPU
    /// the counted tensors are capped at it.
    pub vram_budget_bytes: Option<u64>,
    /// Write every CPU allocation and free (from the model build on) here.
    pub trace_out: Option<PathBuf>,
    pub setup: TrainingSetup,
    /// The CPU trial stands in for a CUDA run: where CUDA's PyTorch does
    /// otherwise, do as it does (CUDA's autocast rules with half precision
    /// held as bf16, the same two bytes; fp16's GradScaler; the optimizers'
    /// foreach implementation). For traces that predict a GPU.
    pub as_cuda: bool,
    /// Count op outputs instead of allocations, with CPU or meta kernels
    /// (see [`super::memory::OpTrace`]).
    pub op_trace: super::memory::OpTrace,
    /// Training or inference steps (inference: `batch_size` is the test
    /// batch, `crop` the image size, `accumulative_counts` unused).
    pub mode: RunMode,
    /// `torch.backends.cudnn.benchmark` on CUDA (default: the config's
    /// `env_cfg.cudnn_benchmark`, off when `randomness.deterministic`).
    pub cudnn_benchmark: Option<bool>,
}

/// Classes per synthetic label map by default: 20, or all of a config's
/// classes when it has fewer (Cityscapes' 19). Not measured on a dataset:
/// with it, predictions of MMSeg's Mask2Former configs land within -5% to
/// -0.4% of the model zoo's published memory (ADE20K and Cityscapes, see
/// docs/prediction.md), and with all 150 ADE20K classes in every image
/// 32-55% above it.
pub const DEFAULT_GT_SEGMENTS: i64 = 20;

impl TrialRequest {
    /// A request with `segtune trial`'s defaults: batch 2 x 512x512, no AMP,
    /// one warm-up and two measured steps on the CPU, 5% ignored pixels.
    pub fn new(config: impl Into<PathBuf>) -> TrialRequest {
        TrialRequest {
            config: config.into(),
            cfg_options: Vec::new(),
            batch_size: 2,
            crop: (512, 512),
            amp: Amp::Off,
            accumulative_counts: None,
            warmup_steps: 1,
            measured_steps: 2,
            device: DeviceChoice::Cpu,
            seed: 0,
            ignore_fraction: 0.05,
            gt_segments: Some(DEFAULT_GT_SEGMENTS),
            threads: None,
            cpu_cap_bytes: None,
            vram_budget_bytes: None,
            trace_out: None,
            setup: TrainingSetup::default(),
            as_cuda: false,
            op_trace: super::memory::OpTrace::Off,
            mode: RunMode::Train,
            cudnn_benchmark: None,
        }
    }

    /// The request as the workers read it.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a request serialises")
    }

    /// The request a worker was sent (`to_json`'s text).
    pub fn from_json(text: &str) -> Result<TrialRequest, serde_json::Error> {
        serde_json::from_str(text)
    }
}
