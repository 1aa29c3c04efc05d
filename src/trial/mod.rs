//! Training trials: the model of a resolved config built in libtorch, a
//! synthetic batch shaped like the recipe's, warm-up steps, then measured
//! steps (data preprocessing, forward, loss, backward, optimizer step,
//! zero_grad, as mmengine's `train_step` does), with peak memory (the
//! counting CPU allocator, or the CUDA caching allocator's statistics) and
//! step times. Out-of-memory and other failures become a status, never a
//! crash.

pub mod ddp;
pub mod memory;
pub mod optim;
pub mod report;
pub mod worker;

use crate::config::Dict;
use crate::models::EncoderDecoder;
use crate::predict::trace::phase_code;
use memory::{CpuCounter, Phase, TraceEvent};
use optim::{Amp, OptimCfg, OptimWrapper};
pub use report::{StepRecord, TrialReport, TrialStatus};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// What to run.
#[derive(Debug, Clone)]
pub struct TrialSpec {
    pub batch_size: i64,
    pub crop: (i64, i64),
    pub amp: Amp,
    /// `accumulative_counts` (overrides the config's when set).
    pub accumulative_counts: Option<i64>,
    pub warmup_steps: usize,
    pub measured_steps: usize,
    pub device: Device,
    pub seed: i64,
    /// Fraction of label pixels set to `ignore_index`.
    pub ignore_fraction: f64,
    /// A CPU byte cap: allocations beyond it fail as out of memory.
    pub cpu_cap_bytes: Option<i64>,
    /// Record every CPU allocation and free of the measured steps.
    pub trace: bool,
    /// Threads for CPU ops (the oracle used 1).
    pub threads: Option<i32>,
    /// Whose memory behaviour to reproduce.
    pub stack: Stack,
    /// GPUs of a data-parallel (DDP) run: each holds DDP's gradient buckets.
    pub gpus: i64,
    /// The CPU trial stands in for a CUDA run: where CUDA's PyTorch does
    /// otherwise, do as it does (CUDA's autocast rules with half precision
    /// held as bf16, the same two bytes; fp16's GradScaler; the optimizers'
    /// foreach implementation). For traces that predict a GPU.
    pub as_cuda: bool,
}

/// The training software whose memory behaviour a trial reproduces.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
    schemars::JsonSchema,
)]
pub enum Stack {
    /// PyTorch 2.x with MMEngine (MMSeg 1.x): what segtune trains with.
    #[default]
    #[value(name = "current")]
    #[serde(rename = "current")]
    Current,
    /// PyTorch <= 1.10 with the mmcv 1.x runner (MMSeg 0.x), the stack that
    /// measured MMSeg's published model-zoo memory: softmax and log_softmax
    /// keep their input for backward (pytorch/pytorch#64000, fixed in 1.11),
    /// and `optimizer.zero_grad()` zeroes gradients instead of freeing them
    /// (`set_to_none=False` before PyTorch 2.0). CPU trials only.
    #[value(name = "zoo-2021")]
    #[serde(rename = "zoo-2021")]
    Zoo2021,
}

impl Stack {
    pub fn name(self) -> &'static str {
        match self {
            Stack::Current => "current",
            Stack::Zoo2021 => "zoo-2021",
        }
    }
}

impl Default for TrialSpec {
    fn default() -> TrialSpec {
        TrialSpec {
            batch_size: 2,
            crop: (512, 512),
            amp: Amp::Off,
            accumulative_counts: None,
            warmup_steps: 1,
            measured_steps: 2,
            device: Device::Cpu,
            seed: 0,
            ignore_fraction: 0.0,
            cpu_cap_bytes: None,
            trace: false,
            threads: None,
            stack: Stack::Current,
            gpus: 1,
            as_cuda: false,
        }
    }
}

/// One synthetic batch: `images` are `3 x H x W` float32 holding integers
/// 0..255 (BGR, as MMSeg's loader hands them over), `labels` are
/// `1 x H x W` int64 class maps, on the CPU.
pub struct Batch {
    pub images: Vec<Tensor>,
    pub labels: Vec<Tensor>,
}

impl Batch {
    pub fn synthetic(spec: &TrialSpec, num_classes: i64, ignore_index: i64) -> Batch {
        let (h, w) = spec.crop;
        let mut images = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..spec.batch_size {
            images.push(
                Tensor::randint(256, [3, h, w], (Kind::Int64, Device::Cpu)).to_kind(Kind::Float),
            );
            let mut label = Tensor::randint(num_classes, [1, h, w], (Kind::Int64, Device::Cpu));
            if spec.ignore_fraction > 0.0 {
                let mask =
                    Tensor::rand([1, h, w], (Kind::Float, Device::Cpu)).lt(spec.ignore_fraction);
                let _ = label.masked_fill_(&mask, ignore_index);
            }
            labels.push(label);
        }
        Batch { images, labels }
    }

    pub fn bytes(&self) -> i64 {
        self.images
            .iter()
            .chain(&self.labels)
            .map(|t| t.numel() as i64 * t.kind().elt_size_in_bytes() as i64)
            .sum()
    }
}

/// Runs a trial of the resolved config `cfg`. Memory figures are relative
/// to the CPU allocator's count before the model is built.
pub fn run(cfg: &Dict, spec: &TrialSpec) -> TrialReport {
    let counter = CpuCounter::install();
    if let Some(n) = spec.threads {
        tch::set_num_threads(n);
    }
    let mut report = TrialReport::new(spec);
    if spec.trace {
        let _ = counter.take_trace();
        counter.set_phase_code(0);
        counter.trace(true);
    }
    let base = counter.current();
    tch::manual_seed(spec.seed);
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        EncoderDecoder::build(cfg, spec.device)
    }));
    let mut model = match built {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return report.failed(TrialStatus::Error, e.to_string()),
        Err(panic) => return report.failed_from_panic(panic),
    };
    model.set_preprocessor_size(spec.crop);
    report.set_params(&model);
    report.bytes_after_model_build = counter.current() - base;
    let mut optim_cfg = match OptimCfg::from_cfg(cfg) {
        Ok(c) => c,
        Err(e) => return report.failed(TrialStatus::Error, e),
    };
    if let Some(n) = spec.accumulative_counts {
        optim_cfg.accumulative_counts = n;
    }
    report.optimizer = optim_cfg.type_name.clone();
    report.accumulative_counts = optim_cfg.accumulative_counts;
    let mut optimizer = OptimWrapper::new(optim_cfg, &model.params, spec.amp);
    if spec.stack == Stack::Zoo2021 {
        if spec.device != Device::Cpu {
            return report.failed(
                TrialStatus::Error,
                "--stack zoo-2021 is reproduced on the CPU only (for `segtune estimate`)".into(),
            );
        }
        crate::models::layers::emulate_softmax_saving_input(|input, output| {
            memory::hold_until_freed(input, output)
                .expect("softmax outputs are counted CPU tensors");
        });
        optimizer.zero_grad_in_place(true);
    }
    if spec.as_cuda {
        if spec.device != Device::Cpu {
            return report.failed(
                TrialStatus::Error,
                "--as-cuda makes a CPU trial stand in for a GPU; on CUDA, leave it out".into(),
            );
        }
        if spec.amp != Amp::Off {
            if let Err(e) = memory::autocast_cuda_policy(true) {
                return report.failed(TrialStatus::Error, e);
            }
        }
        if spec.amp == Amp::Fp16 {
            optimizer.use_grad_scaler();
        }
        optimizer.use_foreach();
    }
    // DistributedDataParallel wraps the model before training starts.
    let ddp_buckets = ddp::allocate_buckets(&model.params, spec.gpus, spec.device);
    if spec.amp == Amp::Bf16 && spec.device.is_cuda() && !bf16_supported(spec.device) {
        return report.failed(TrialStatus::Error, "this GPU does not support bf16".into());
    }
    if let Some(cap) = spec.cpu_cap_bytes {
        counter.set_cap(base + cap);
    }
    let cuda_index = match spec.device {
        Device::Cuda(i) => Some(i),
        _ => None,
    };
    let total_steps = spec.warmup_steps + spec.measured_steps;
    // mmengine keeps the last step's log_vars alive into the next step.
    let mut previous_items: Vec<(String, Tensor)> = Vec::new();
    let mut trace: Vec<TraceEvent> = Vec::new();
    for step in 0..total_steps {
        let measured = step >= spec.warmup_steps;
        counter.set_phase_code(phase_code(step + 1, Phase::Data));
        let batch = Batch::synthetic(spec, model.num_classes, model.ignore_index);
        counter.set_phase_code(phase_code(step + 1, Phase::Setup));
        if step == 0 {
            report.batch_bytes = batch.bytes();
            report.bytes_before_step1 = counter.current() - base;
        }
        let before = counter.current() - base;
        if let Some(i) = cuda_index {
            let _ = memory::device_synchronize(i);
            let _ = memory::device_reset_peak(i);
        }
        counter.reset_peak();
        let _ = crate::models::layers::take_forward_flops();
        let started = Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            train_step(
                &model,
                &mut optimizer,
                batch,
                spec,
                &counter,
                base,
                step + 1,
            )
        }));
        if let Some(i) = cuda_index {
            let _ = memory::device_synchronize(i);
        }
        report.forward_flops = crate::models::layers::take_forward_flops();
        let seconds = started.elapsed().as_secs_f64();
        counter.set_phase_code(phase_code(step + 1, Phase::Setup));
        let (phases, items) = match result {
            Ok(Ok(v)) => v,
            Ok(Err(message)) => return report.failed(TrialStatus::Error, message),
            Err(panic) => {
                counter.set_cap(0);
                return report.failed_from_panic(panic);
            }
        };
        previous_items = items;
        let loss = previous_items
            .iter()
            .find(|(n, _)| n.contains("loss"))
            .map(|(_, v)| v.double_value(&[]));
        let mut record = StepRecord {
            step: step + 1,
            measured,
            seconds,
            bytes_before: before,
            peak_bytes: phases.iter().map(|p| p.1).max().unwrap_or(0),
            bytes_after: counter.current() - base,
            forward_peak: phases[0].1,
            backward_peak: phases[1].1,
            optimizer_peak: phases[2].1,
            loss,
            cuda: None,
        };
        if let Some(i) = cuda_index {
            record.cuda = memory::device_stats(i).ok();
        }
        if loss.is_none_or(|l| !l.is_finite()) {
            report.push_step(record);
            return report.failed(
                TrialStatus::NonFiniteLoss,
                format!("the loss is {loss:?} at step {}", step + 1),
            );
        }
        report.push_step(record);
    }
    drop(previous_items);
    drop(ddp_buckets);
    counter.set_cap(0);
    if spec.trace {
        counter.trace(false);
        trace.extend(counter.take_trace());
    }
    report.optimizer_state_bytes = optimizer.state_bytes();
    if spec.trace {
        report.trace = Some(trace);
    }
    report.finish();
    report
}

fn bf16_supported(device: Device) -> bool {
    // bf16 autocast on CUDA needs compute capability >= 8.0; probe it by a tiny matmul.
    std::panic::catch_unwind(|| {
        let a = Tensor::ones([2, 2], (Kind::BFloat16, device));
        let _ = a.matmul(&a);
    })
    .is_ok()
}

type Phases = [(Phase, i64); 3];

/// mmengine's `BaseModel.train_step`: data preprocessing + forward + loss
/// under the optimizer wrapper's context (autocast for AMP), then
/// `update_params` (backward, step, zero_grad). Returns each phase's peak.
fn train_step(
    model: &EncoderDecoder,
    optimizer: &mut OptimWrapper,
    batch: Batch,
    spec: &TrialSpec,
    counter: &CpuCounter,
    base: i64,
    step: usize,
) -> Result<(Phases, Vec<(String, Tensor)>), String> {
    let Batch { images, labels } = batch;
    counter.set_phase_code(phase_code(step, Phase::Forward));
    let (inputs, padded_labels, losses) = {
        let _autocast = match spec.amp.kind() {
            // Half precision stands in as bf16 (same size) under CUDA's rules on the CPU.
            Some(_) if spec.as_cuda => {
                Some(memory::AutocastGuard::new(spec.device, Kind::BFloat16)?)
            }
            Some(kind) => Some(memory::AutocastGuard::new(spec.device, kind)?),
            None => None,
        };
        counter.set_phase_code(phase_code(step, Phase::Preprocess));
        let (inputs, padded_labels) = model.preprocess(&images, &labels);
        counter.set_phase_code(phase_code(step, Phase::Forward));
        let items = model.loss(&inputs, &padded_labels);
        (inputs, padded_labels, items)
    };
    let losses = crate::models::parse_losses(losses);
    let forward_peak = counter.peak() - base;
    counter.reset_peak();
    counter.set_phase_code(phase_code(step, Phase::Backward));
    optimizer.backward(&losses.loss);
    let backward_peak = counter.peak() - base;
    counter.reset_peak();
    counter.set_phase_code(phase_code(step, Phase::Optimizer));
    optimizer.step_if_due()?;
    let optimizer_peak = counter.peak() - base;
    let items = losses.items;
    drop(losses.loss);
    drop(inputs);
    drop(padded_labels);
    drop(images);
    drop(labels);
    Ok((
        [
            (Phase::Forward, forward_peak),
            (Phase::Backward, backward_peak),
            (Phase::Optimizer, optimizer_peak),
        ],
        items,
    ))
}
