//! What the parent asks the `segtune-torch` worker to run: one
//! [`TrialRequest`], turned into the worker's argv here and only here. The
//! worker's command line (`segtune trial`'s, in `cli`) parses it back into
//! the same request.

use crate::kinds::{Amp, DeviceChoice, RunMode, TrainingSetup};
use std::ffi::OsString;
use std::path::PathBuf;

/// One trial: the config, the candidate, the measurement and the setup.

#[derive(Debug, Clone, PartialEq)]
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

/// `on` or `off`, as `--cudnn-benchmark` takes it.
pub fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

fn flag_after(name: &str, value: String, argv: &mut Vec<OsString>) {
    argv.push(format!("--{name}").into());
    argv.push(value.into());
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

    /// The worker's argv for this request (after the program name), asking
    /// for the JSON report.
    pub fn to_argv(&self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec!["trial".into(), self.config.clone().into()];
        let mut flag = |name: &str, value: String| {
            argv.push(format!("--{name}").into());
            argv.push(value.into());
        };
        flag("batch-size", self.batch_size.to_string());
        flag("crop", format!("{}x{}", self.crop.0, self.crop.1));
        flag("amp", self.amp.to_string());
        if let Some(n) = self.accumulative_counts {
            flag("accum", n.to_string());
        }
        flag("warmup", self.warmup_steps.to_string());
        flag("steps", self.measured_steps.to_string());
        flag("device", self.device.to_string());
        flag("seed", self.seed.to_string());
        flag("ignore-fraction", self.ignore_fraction.to_string());
        flag(
            "gt-segments",
            self.gt_segments.map_or("all".into(), |n| n.to_string()),
        );
        if let Some(n) = self.threads {
            flag("threads", n.to_string());
        }
        if let Some(n) = self.cpu_cap_bytes {
            flag("cpu-cap", n.to_string());
        }
        if let Some(n) = self.vram_budget_bytes {
            flag("vram", n.to_string());
        }
        flag("gpus", self.setup.gpus.to_string());
        flag("torch", self.setup.torch.to_string());
        flag("mmcv", self.setup.mmcv.to_string());
        if let Some(path) = &self.trace_out {
            argv.push("--trace-out".into());
            argv.push(path.clone().into());
        }
        if self.as_cuda {
            argv.push("--as-cuda".into());
        }
        if self.op_trace != super::memory::OpTrace::Off {
            flag_after("op-trace", self.op_trace.to_string(), &mut argv);
        }
        if self.mode != RunMode::Train {
            flag_after("mode", self.mode.to_string(), &mut argv);
        }
        if let Some(on) = self.cudnn_benchmark {
            flag_after("cudnn-benchmark", on_off(on).into(), &mut argv);
        }
        argv.push("--json".into());
        if !self.cfg_options.is_empty() {
            argv.push("--cfg-options".into());
            argv.extend(self.cfg_options.iter().map(OsString::from));
        }
        argv
    }
}
