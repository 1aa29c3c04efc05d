//! `segtune estimate`: a training step's GPU memory predicted from an exact
//! CPU trace of it, plus the terms a CPU cannot show. Every figure is a
//! prediction and is labelled so.

use super::allocator::AllocatorSettings;
use super::breakdown::{breakdown, PeakBreakdown};
use super::budget::Gpu;
use super::replay::{replay, ReplayInputs, ReplayResult};
use crate::config::{Dict, Value};
use crate::trial::trace::TraceEvent;
use crate::trial::{Amp, RunMode};

/// One fixed term of the estimate and where its figure comes from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FixedTerm {
    pub name: &'static str,
    pub bytes: u64,
    /// Whether `max_memory_allocated` includes it.
    pub in_allocated: bool,
    pub source: &'static str,
}

/// cuBLAS workspace PyTorch takes from the caching allocator (one handle,
/// one stream): `CUBLAS_WORKSPACE_CONFIG` defaults to `:4096:2:16:8`
/// (8 MiB + 128 KiB), and to `:4096:8` (32 MiB) on Hopper (sm_90).
pub fn cublas_workspace_bytes(compute_capability: &str) -> u64 {
    if compute_capability.starts_with('9') {
        4096 * 1024 * 8
    } else {
        4096 * 1024 * 2 + 16 * 1024 * 8
    }
}

/// The CUDA context (driver, kernels of libtorch/cuDNN/cuBLAS loaded lazily,
/// as CUDA 12/13 does by default): device memory nvidia-smi shows that the
/// caching allocator never reports. An assumption per architecture, to be
/// calibrated by `scripts/gpu-validate.sh` on real cards.
pub fn cuda_context_bytes(compute_capability: &str) -> u64 {
    let mib: u64 = match compute_capability {
        cc if cc.starts_with('9') => 520,
        "8.9" => 330,
        cc if cc.starts_with('8') => 310,
        _ => 290,
    };
    mib << 20
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
    /// What `torch.cuda.max_memory_allocated()` would report (predicted).
    pub predicted_peak_allocated_bytes: u64,
    /// What `torch.cuda.max_memory_reserved()` would report (predicted).
    pub predicted_peak_reserved_bytes: u64,
    /// Reserved + CUDA context: what nvidia-smi would show at the peak (predicted).
    pub predicted_device_bytes: u64,
    pub predicted_peak_phase: String,
    pub fixed_terms: Vec<FixedTerm>,
    pub fits: bool,
    /// The traced CPU step's peak (absent when the batch was extrapolated).
    pub cpu_trace_peak_bytes: Option<i64>,
    /// `PYTORCH_CUDA_ALLOC_CONF` the prediction assumes (empty: defaults).
    pub alloc_conf: String,
    /// With other allocator settings: the peak reserved with the defaults.
    pub default_peak_reserved_bytes: Option<u64>,
    pub notes: Vec<String>,
    /// The predicted peak split into what it holds (`segtune explain`).
    pub breakdown: PeakBreakdown,
}

/// Predicts from a trace of a trial (`trace`: from the model build through
/// a warm-up and a measured step).
#[allow(clippy::too_many_arguments)]
pub fn estimate(
    trace: &[TraceEvent],
    model_scopes: &[String],
    target: &Gpu,
    batch_size: i64,
    crop: (i64, i64),
    amp: Amp,
    cudnn_benchmark: bool,
    cpu_trace_peak_bytes: Option<i64>,
    alloc_conf: AllocatorSettings,
    batch: &DeviceBatch,
) -> Estimate {
    let (h, w) = crop;
    let batch_copies = batch.tensors.clone();
    let workspace = cublas_workspace_bytes(&target.compute_capability);
    let context = cuda_context_bytes(&target.compute_capability);
    let unlimited_inputs = ReplayInputs {
        batch_copies: batch_copies.clone(),
        cublas_workspace: workspace,
        capacity: None,
        settings: alloc_conf,
    };
    let unlimited = replay(trace, &unlimited_inputs);
    let breakdown = breakdown(trace, model_scopes, &unlimited_inputs, &unlimited, context);
    let capacity = target.vram_bytes.saturating_sub(context);
    let limited: ReplayResult = replay(
        trace,
        &ReplayInputs {
            batch_copies,
            cublas_workspace: workspace,
            capacity: Some(capacity),
            settings: alloc_conf,
        },
    );
    let fixed_terms = vec![
        FixedTerm {
            name: "cuda_context",
            bytes: context,
            in_allocated: false,
            source: "assumed per architecture (CUDA lazy module loading); calibrate with scripts/gpu-validate.sh",
        },
        FixedTerm {
            name: "cublas_workspace",
            bytes: workspace,
            in_allocated: true,
            source: "PyTorch CUBLAS_WORKSPACE_CONFIG default :4096:2:16:8 (sm_90: :4096:8), taken from the caching allocator",
        },
        FixedTerm {
            name: "cudnn_workspace",
            bytes: 0,
            in_allocated: true,
            source: if cudnn_benchmark {
                "cudnn_benchmark=True: algorithm search may briefly take workspace up to the free memory; not predicted"
            } else {
                "cudnn_benchmark=False: heuristic algorithms; their transient workspaces are not predicted"
            },
        },
        FixedTerm {
            name: "batch_on_device",
            bytes: batch.tensors.iter().sum(),
            in_allocated: true,
            source: batch.source,
        },
    ];
    let mut notes = vec!["activations, gradients and optimizer state come from an exact CPU trace of the same step, replayed through a model of PyTorch's CUDA caching allocator".to_string()];
    if amp != Amp::Off {
        notes.push(format!(
            "amp={amp}: the traced step casts by CUDA's autocast rules (which ops run in half precision, which in fp32, the cached half copies of weights{}); half precision is held as bf16 on the CPU (the same two bytes). Not in the trace: temporaries inside CUDA's half-precision kernels",
            if amp == Amp::Fp16 { ", fp16's GradScaler" } else { "" }
        ));
    }
    let predicted_device_bytes = limited
        .peak_reserved
        .max(unlimited.peak_reserved.min(capacity))
        + context;
    Estimate {
        gpu: target.name.clone(),
        vram_bytes: target.vram_bytes,
        batch_size,
        crop: [h, w],
        amp,
        cudnn_benchmark,
        predicted_peak_allocated_bytes: unlimited.peak_allocated,
        predicted_peak_reserved_bytes: unlimited.peak_reserved,
        predicted_device_bytes,
        predicted_peak_phase: format!("{:?}", unlimited.peak_phase).to_lowercase(),
        fixed_terms,
        fits: !limited.out_of_memory,
        cpu_trace_peak_bytes,
        alloc_conf: alloc_conf.env_value(),
        default_peak_reserved_bytes: (alloc_conf != AllocatorSettings::default()).then(|| {
            replay(
                trace,
                &ReplayInputs {
                    settings: AllocatorSettings::default(),
                    ..unlimited_inputs.clone()
                },
            )
            .peak_reserved
        }),
        notes,
        breakdown,
    }
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

/// The recipe's training crop: `crop_size`, else the `RandomCrop` of the
/// train pipeline, else `data_preprocessor.size`.
pub fn recipe_crop(cfg: &Dict) -> Option<(i64, i64)> {
    let pair = |v: &Value| match v.as_seq() {
        Some([h, w]) => h.as_i64().zip(w.as_i64()),
        _ => None,
    };
    if let Some(c) = cfg.get("crop_size").and_then(pair) {
        return Some(c);
    }
    let pipeline = cfg.get("train_pipeline").or_else(|| {
        cfg.get("train_dataloader")
            .and_then(|d| d.get_path("dataset.pipeline"))
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
    cfg.get("model")
        .and_then(|m| m.get_path("data_preprocessor.size"))
        .and_then(pair)
}

/// `env_cfg.cudnn_benchmark` (MMSeg's default runtime sets True).
pub fn cudnn_benchmark(cfg: &Dict) -> bool {
    cfg.get("env_cfg")
        .and_then(|e| e.get_path("cudnn_benchmark"))
        .is_some_and(Value::truthy)
}
