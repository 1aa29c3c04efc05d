//! `segtune estimate`: a training step's GPU memory predicted from an exact
//! CPU trace of it, plus the terms a CPU cannot show. Every figure is a
//! prediction and is labelled so.

use super::allocator::AllocatorSettings;
use super::breakdown::{breakdown, PeakBreakdown};
use super::budget::Gpu;
use super::kernels::cudnn::{CudnnSettings, Figure};
use super::kernels::cudnn_speed::GpuMath;
use super::kernels::workspace_table::WorkspaceTable;
use super::kernels::{KernelModel, ScratchSummary};
use super::replay::{replay_kernels, Kernels, ReplayInputs, ReplayResult};
use crate::config::{Dict, Value};
use crate::kinds::{Amp, RunMode, Switch, TorchVersion};
use crate::trial::kernel_calls::KernelCall;
use crate::trial::trace::TraceEvent;

/// One fixed term of the estimate and where its figure comes from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FixedTerm {
    pub name: &'static str,
    pub bytes: u64,
    /// Whether `max_memory_allocated` includes it.
    pub in_allocated: bool,
    pub source: &'static str,
}

/// How the predicted run drives the GPU's kernels: the PyTorch release
/// (cuDNN's API, cuBLAS's workspace), the precision and cuDNN's flags.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelSetup {
    pub torch: TorchVersion,
    pub amp: Amp,
    /// `torch.backends.cudnn.benchmark` (`env_cfg.cudnn_benchmark`).
    pub cudnn_benchmark: bool,
    /// `torch.backends.cudnn.deterministic` (`randomness.deterministic`).
    pub cudnn_deterministic: bool,
}

impl KernelSetup {
    /// The newest PyTorch, fp32, cuDNN's flags off (PyTorch's defaults).
    pub fn newest() -> KernelSetup {
        KernelSetup {
            torch: TorchVersion::NEWEST,
            amp: Amp::Off,
            cudnn_benchmark: false,
            cudnn_deterministic: false,
        }
    }

    /// The model of a GPU's kernels (its compute capability and rates)
    /// that a replay for `figure` uses.
    pub fn model(
        &self,
        compute_capability: &str,
        cublas_workspace_bytes: u64,
        math: GpuMath,
        figure: Figure,
    ) -> KernelModel {
        KernelModel {
            cudnn: CudnnSettings {
                benchmark: self.cudnn_benchmark,
                deterministic: self.cudnn_deterministic,
                allow_tf32: true,
                v8_api: self.torch.has(Switch::CudnnV8Api),
                gpu: math,
                table: WorkspaceTable::for_compute_capability(compute_capability),
            },
            figure,
            half_is_fp16: self.amp == Amp::Fp16,
            cublas_workspace: self.cublas_workspace(cublas_workspace_bytes),
            bce_with_logits_four_temporaries: self.torch.has(Switch::BceWithLogitsFourTemporaries),
        }
    }

    /// cuBLAS's workspace per handle in the caching allocator: the card's
    /// `per_handle` (0 before PyTorch 1.13, which took it outside).
    pub fn cublas_workspace(&self, per_handle: u64) -> u64 {
        if self.torch.has(Switch::CublasWorkspaceInAllocator) {
            per_handle
        } else {
            0
        }
    }

    /// `cudnn v7` or `cudnn v8`, for the output.
    pub fn cudnn_api(&self) -> &'static str {
        if self.torch.has(Switch::CudnnV8Api) {
            "v8"
        } else {
            "v7"
        }
    }
}

/// The estimate's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Estimate {
    pub gpu: String,
    pub vram_bytes: u64,
    pub batch_size: i64,
    pub crop: [i64; 2],
    pub amp: Amp,
    pub cudnn_benchmark: bool,
    pub cudnn_deterministic: bool,
    /// The cuDNN API the PyTorch release uses (`v7`, `v8`).
    pub cudnn_api: &'static str,
    /// The least the step needs (every tensor, the kernels' scratch, the
    /// smallest workspace each convolution can run with): what decides an
    /// out-of-memory; the same on every card (predicted).
    pub predicted_min_peak_allocated_bytes: u64,
    /// What `torch.cuda.max_memory_allocated()` would report on this card
    /// after the first log interval, the likeliest figure (predicted).
    pub predicted_peak_allocated_bytes: u64,
    /// The range of it where cuDNN picks algorithms by timing or by
    /// heuristics the model cannot settle (predicted).
    pub predicted_peak_allocated_low_bytes: u64,
    pub predicted_peak_allocated_high_bytes: u64,
    /// The first step's peak (with benchmark on: its algorithm searches,
    /// what MMEngine's first log line shows; predicted).
    pub predicted_first_interval_peak_allocated_bytes: u64,
    /// What `torch.cuda.max_memory_reserved()` would report (predicted).
    pub predicted_peak_reserved_bytes: u64,
    /// Reserved + CUDA context: what nvidia-smi would show at the peak (predicted).
    pub predicted_device_bytes: u64,
    pub predicted_peak_phase: String,
    pub fixed_terms: Vec<FixedTerm>,
    pub fits: bool,
    /// The step time on this card and the schedule's (predicted; empty
    /// for a trace without every op's work: the Python worker's).
    #[serde(flatten)]
    pub speed: PredictedSpeed,
    /// What the kernels' calls did in the likeliest replay (none for a
    /// trace without kernel calls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<ScratchSummary>,
    /// The traced CPU step's peak (absent when the batch was extrapolated).
    pub cpu_trace_peak_bytes: Option<i64>,
    /// `PYTORCH_CUDA_ALLOC_CONF` the prediction assumes (empty: defaults).
    pub alloc_conf: String,
    /// With other allocator settings: the peak reserved with the defaults.
    pub default_peak_reserved_bytes: Option<u64>,
    pub notes: Vec<String>,
    /// The predicted peak split into what it holds (`segtune explain`).
    pub breakdown: PeakBreakdown,
    /// The least needed peak split the same way: what decides an OOM, and
    /// so what `search --why` sets beside the budget.
    #[serde(skip)]
    pub least_breakdown: PeakBreakdown,
}

/// What `estimate` predicts of the step's time (flattened into its JSON).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PredictedSpeed {
    /// One iteration's GPU time (what MMEngine logs as `time` less
    /// `data_time`), seconds, from the trace kernel by kernel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_step_seconds: Option<f64>,
    /// Its likely range (the fitted model's spread on held-out logs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_step_seconds_low: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_step_seconds_high: Option<f64>,
    /// Images per second per GPU at that step time (predicted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_images_per_s: Option<f64>,
    /// The step time split into forward, backward, optimizer,
    /// communication and overhead (predicted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_step_time: Option<crate::predict::speed::StepTime>,
    /// The recipe's schedule at that step time (predicted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_schedule: Option<crate::predict::speed::ScheduleTime>,
}

/// A traced step to predict from.
#[derive(Debug, Clone, Copy)]
pub struct TracedInput<'a> {
    /// From the model build through a warm-up and a measured step.
    pub events: &'a [TraceEvent],
    /// The kernel calls recorded with it (empty for a trace without them).
    pub calls: &'a [KernelCall],
    pub model_scopes: &'a [String],
    /// The traced CPU step's peak.
    pub cpu_trace_peak_bytes: Option<i64>,
}

/// The likeliest replay and its two ends, on a card's capacity.
struct CardFigures {
    likely: ReplayResult,
    low: ReplayResult,
    high: ReplayResult,
}

/// The replays of one trace on one card: the trace, its kernel calls and
/// the batch's device copies, run through the caching allocator's model for
/// a capacity, allocator settings and figure.
struct Replayer<'a> {
    trace: &'a [TraceEvent],
    calls: &'a [KernelCall],
    batch_copies: Vec<u64>,
    /// cuBLAS's workspace placed at the step's start: without kernel calls
    /// (a trace of every CPU allocation) nothing else places it.
    injected_workspace: u64,
    kernels: KernelSetup,
    target: &'a Gpu,
}

impl Replayer<'_> {
    fn inputs(&self, capacity: Option<u64>, settings: AllocatorSettings) -> ReplayInputs {
        ReplayInputs {
            batch_copies: self.batch_copies.clone(),
            cublas_workspace: self.injected_workspace,
            capacity,
            settings,
        }
    }

    fn run(
        &self,
        capacity: Option<u64>,
        settings: AllocatorSettings,
        figure: Figure,
    ) -> ReplayResult {
        let model = self.kernels.model(
            &self.target.compute_capability,
            self.target.overheads.cublas_workspace_bytes,
            self.target.conv_math(),
            figure,
        );
        replay_kernels(
            self.trace,
            &self.inputs(capacity, settings),
            (!self.calls.is_empty()).then_some(Kernels {
                calls: self.calls,
                model: &model,
            }),
        )
    }
}

/// Predicts from a trace of a trial.
#[allow(clippy::too_many_arguments)]
pub fn estimate(
    traced: TracedInput,
    target: &Gpu,
    batch_size: i64,
    crop: (i64, i64),
    kernels: KernelSetup,
    alloc_conf: AllocatorSettings,
    batch: &DeviceBatch,
) -> Estimate {
    let amp = kernels.amp;
    let with_calls = !traced.calls.is_empty();
    let per_handle = kernels.cublas_workspace(target.overheads.cublas_workspace_bytes);
    let replayer = Replayer {
        trace: traced.events,
        calls: traced.calls,
        batch_copies: batch.tensors.clone(),
        injected_workspace: if with_calls { 0 } else { per_handle },
        kernels,
        target,
    };
    let injected_workspace = replayer.injected_workspace;
    let context = target.overheads.cuda_context_bytes;
    let capacity = target.vram_bytes.saturating_sub(context);
    let least = replayer.run(None, alloc_conf, Figure::Least);
    let least_on_card = replayer.run(Some(capacity), alloc_conf, Figure::Least);
    let card = CardFigures {
        likely: replayer.run(Some(capacity), alloc_conf, Figure::Likely),
        low: replayer.run(Some(capacity), alloc_conf, Figure::Low),
        high: replayer.run(Some(capacity), alloc_conf, Figure::High),
    };
    // A card too small for the likeliest workspaces still shows the least.
    let on_card = |r: &ReplayResult| if r.out_of_memory { least } else { *r };
    let likely = on_card(&card.likely);
    let (low, high) = (on_card(&card.low), on_card(&card.high));
    let inputs = replayer.inputs(Some(capacity), alloc_conf);
    let split = |figure: &ReplayResult| {
        breakdown(traced.events, traced.model_scopes, &inputs, figure, context)
    };
    let (likely_breakdown, least_breakdown) = (split(&likely), split(&on_card(&least_on_card)));
    let cublas_kept = if with_calls {
        likely.cublas_at_peak
    } else {
        injected_workspace
    };
    let fixed_terms = fixed_terms(
        context,
        CublasTerm {
            per_handle,
            kept: cublas_kept,
            with_calls,
        },
        &likely,
        kernels.cudnn_benchmark,
        batch,
    );
    let notes = notes(
        amp,
        &likely,
        card.likely.out_of_memory && !least_on_card.out_of_memory,
    );
    // What nvidia-smi shows is the run's own (the likeliest workspaces),
    // within the card.
    let predicted_device_bytes = likely.peak_reserved.min(capacity) + context;
    Estimate {
        gpu: target.name.clone(),
        vram_bytes: target.vram_bytes,
        batch_size,
        crop: [crop.0, crop.1],
        amp,
        cudnn_benchmark: kernels.cudnn_benchmark,
        cudnn_deterministic: kernels.cudnn_deterministic,
        cudnn_api: kernels.cudnn_api(),
        predicted_min_peak_allocated_bytes: least.peak_allocated,
        predicted_peak_allocated_bytes: likely.peak_allocated,
        predicted_peak_allocated_low_bytes: low.peak_allocated.min(likely.peak_allocated),
        predicted_peak_allocated_high_bytes: high.peak_allocated.max(likely.peak_allocated),
        predicted_first_interval_peak_allocated_bytes: likely
            .first_step_peak_allocated
            .max(likely.peak_allocated),
        predicted_peak_reserved_bytes: likely.peak_reserved,
        predicted_device_bytes,
        predicted_peak_phase: format!("{:?}", likely.peak_phase).to_lowercase(),
        fixed_terms,
        fits: !least_on_card.out_of_memory,
        speed: PredictedSpeed::default(),
        kernels: likely.kernels,
        cpu_trace_peak_bytes: traced.cpu_trace_peak_bytes,
        alloc_conf: alloc_conf.env_value(),
        default_peak_reserved_bytes: (alloc_conf != AllocatorSettings::default()).then(|| {
            replayer
                .run(Some(capacity), AllocatorSettings::default(), Figure::Likely)
                .peak_reserved
        }),
        notes,
        breakdown: likely_breakdown,
        least_breakdown,
    }
}

/// cuBLAS's term: its workspace per handle for the release, what the peak
/// holds, and whether the trace's calls placed it.
struct CublasTerm {
    per_handle: u64,
    kept: u64,
    with_calls: bool,
}

/// The estimate's fixed terms, each with where its figure comes from.
fn fixed_terms(
    context: u64,
    cublas: CublasTerm,
    likely: &ReplayResult,
    cudnn_benchmark: bool,
    batch: &DeviceBatch,
) -> Vec<FixedTerm> {
    vec![
        FixedTerm {
            name: "cuda_context",
            bytes: context,
            in_allocated: false,
            source: "assumed per architecture (CUDA lazy module loading); calibrate with scripts/gpu-validate.sh",
        },
        FixedTerm {
            name: "cublas_workspace",
            bytes: cublas.kept,
            in_allocated: true,
            source: if cublas.per_handle == 0 {
                "before PyTorch 1.13 cuBLAS kept its workspace itself, outside the caching allocator (pytorch/pytorch#83461)"
            } else if cublas.with_calls {
                "one per thread that runs a matrix product (the forward's, autograd's backward thread's): CUBLAS_WORKSPACE_CONFIG default :4096:2:16:8 (sm_90: :4096:8), from the caching allocator, kept"
            } else {
                "PyTorch CUBLAS_WORKSPACE_CONFIG default :4096:2:16:8 (sm_90: :4096:8), taken from the caching allocator"
            },
        },
        FixedTerm {
            name: "cudnn_workspace",
            bytes: likely.cudnn_workspace_at_peak,
            in_allocated: true,
            source: match (cublas.with_calls, cudnn_benchmark) {
                (false, _) => "not predicted: this trace has no kernel calls (use --trace meta or cpu)",
                (true, true) => "at the peak: the workspace of the convolution running then, its algorithm the fastest of a benchmark search that fit the free memory (modelled)",
                (true, false) => "at the peak: the workspace of the convolution running then, its algorithm cuDNN's heuristic choice (modelled as the fastest that fits)",
            },
        },
        FixedTerm {
            name: "kernel_scratch",
            bytes: likely.kernel_scratch_at_peak,
            in_allocated: true,
            source: "at the peak: ATen CUDA kernels' own temporaries (reduction staging buffers, softmax backward)",
        },
        FixedTerm {
            name: "batch_on_device",
            bytes: batch.tensors.iter().sum(),
            in_allocated: true,
            source: batch.source,
        },
    ]
}

/// The estimate's notes: how it was made, AMP, squeezed convolutions.
/// `likeliest_off_card`: the likeliest workspaces do not fit the card.
fn notes(amp: Amp, likely: &ReplayResult, likeliest_off_card: bool) -> Vec<String> {
    let mut notes = vec!["activations, gradients and optimizer state come from an exact CPU trace of the same step, replayed through a model of PyTorch's CUDA caching allocator".to_string()];
    if amp != Amp::Off {
        notes.push(format!(
            "amp={amp}: the traced step casts by CUDA's autocast rules (which ops run in half precision, which in fp32, the cached half copies of weights{}); half precision is held as bf16 on the CPU (the same two bytes)",
            if amp == Amp::Fp16 { ", fp16's GradScaler" } else { "" }
        ));
    }
    if let Some(k) = likely.kernels {
        if k.squeezed > 0 {
            notes.push(format!(
                "{} of {} convolutions cannot have their fastest algorithm's workspace on this card and run a slower one: convolutions about {:.2}x slower (modelled)",
                k.squeezed, k.conv_runs, k.conv_slowdown
            ));
        }
        if likeliest_off_card {
            notes.push("the likeliest workspaces do not fit this card; cuDNN falls back to smaller ones (the least figure)".into());
        }
    }
    notes
}

/// The batch tensors on the device during a step and what they are.
#[derive(Debug, Clone)]
pub struct DeviceBatch {
    /// In allocation order (see [`ReplayInputs::batch_copies`]).
    pub tensors: Vec<u64>,
    pub source: &'static str,
}

/// How a step's batch arrives on the device: decided once from the resolved
/// config, read by every prediction of it and by what a search emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchLayout {
    /// MMSeg's: `cast_data` copies per image and label map, then the
    /// preprocessor's stacked images (and padded labels in training).
    MmSeg,
    /// transformers': one `pixel_values` and one `labels` tensor (the
    /// `PixelValues` preprocessor of a Hugging Face model).
    PixelValues,
}

impl BatchLayout {
    pub fn of(cfg: &Dict) -> BatchLayout {
        let preprocessor = cfg
            .get("model")
            .and_then(|m| m.get_path("data_preprocessor.type"))
            .and_then(Value::as_str);
        if preprocessor == Some("PixelValues") {
            BatchLayout::PixelValues
        } else {
            BatchLayout::MmSeg
        }
    }

    /// The batch tensors on the device, in allocation order (see
    /// [`ReplayInputs::batch_copies`]).
    pub fn tensors(self, batch_size: i64, crop: (i64, i64), mode: RunMode) -> Vec<u64> {
        match self {
            BatchLayout::MmSeg => batch_tensors(batch_size, crop, mode),
            BatchLayout::PixelValues => pixel_values_batch(batch_size, crop),
        }
    }

    pub fn device_batch(self, batch_size: i64, crop: (i64, i64), mode: RunMode) -> DeviceBatch {
        DeviceBatch {
            tensors: self.tensors(batch_size, crop, mode),
            source: self.source(),
        }
    }

    fn source(self) -> &'static str {
        match self {
            BatchLayout::MmSeg => "cast_data's device copies of the images (float32) and label maps (int64), and the preprocessor's stacked images and padded labels",
            BatchLayout::PixelValues => "Trainer._prepare_inputs' device copies of pixel_values (float32) and labels (int64)",
        }
    }
}

/// The batch of a Hugging Face step on the device: `pixel_values`
/// `[B, 3, H, W]` float32 and `labels` `[B, H, W]` int64.
pub fn pixel_values_batch(batch_size: i64, crop: (i64, i64)) -> Vec<u64> {
    let (h, w) = crop;
    vec![
        (batch_size * 3 * h * w * 4) as u64,
        (batch_size * h * w * 8) as u64,
    ]
}

/// The batch tensors alive on the device during a step, in allocation
/// order (see [`ReplayInputs::batch_copies`]): the images and labels
/// `cast_data` copies, the preprocessor's stacked images, and in training
/// its padded labels.
pub fn batch_tensors(batch_size: i64, crop: (i64, i64), mode: RunMode) -> Vec<u64> {
    let (h, w) = crop;
    let image = (3 * h * w * 4) as u64;
    let label = (h * w * 8) as u64;
    let n = batch_size as usize;
    let mut out = vec![image; n];
    out.extend(std::iter::repeat_n(label, n));
    out.push(image * n as u64);
    if mode == RunMode::Train {
        out.extend(std::iter::repeat_n(label, n));
    }
    out
}

/// The recipe's training batch size per GPU (`train_dataloader.batch_size`).
pub fn recipe_batch_size(cfg: &Dict) -> Option<i64> {
    cfg.get("train_dataloader")
        .and_then(|d| d.get_path("batch_size"))
        .and_then(Value::as_i64)
}

/// The recipe's network input: the training crop (`crop_size`, else the
/// `RandomCrop` of the train pipeline, else `data_preprocessor.size`),
/// padded to `model.data_preprocessor.size` where that is larger on a side
/// (MMSeg's `SegDataPreProcessor` pads every batch to it).
pub fn recipe_crop(cfg: &Dict) -> Option<(i64, i64)> {
    let padded = cfg
        .get("model")
        .and_then(|m| m.get_path("data_preprocessor.size"))
        .and_then(pair);
    let crop = training_crop(cfg).or(padded)?;
    Some(match padded {
        Some((h, w)) => (crop.0.max(h), crop.1.max(w)),
        None => crop,
    })
}

fn pair(v: &Value) -> Option<(i64, i64)> {
    match v.as_seq() {
        Some([h, w]) => h.as_i64().zip(w.as_i64()),
        _ => None,
    }
}

/// The recipe's training crop as the data pipeline cuts it: `crop_size`,
/// else the `RandomCrop` of the train pipeline (under dataset wrappers such
/// as `RepeatDataset` too).
pub fn training_crop(cfg: &Dict) -> Option<(i64, i64)> {
    if let Some(c) = cfg.get("crop_size").and_then(pair) {
        return Some(c);
    }
    let pipeline = cfg.get("train_pipeline").or_else(|| {
        cfg.get("train_dataloader")
            .and_then(crate::config::dataloader_pipeline)
    });
    if let Some(steps) = pipeline.and_then(Value::as_seq) {
        for step in steps {
            if step.get_path("type").and_then(Value::as_str) == Some("RandomCrop") {
                if let Some(c) = step.get_path("crop_size").and_then(pair) {
                    return Some(c);
                }
            }
        }
    }
    None
}

pub use crate::trial::cudnn_flags::{cudnn_benchmark, cudnn_deterministic};
