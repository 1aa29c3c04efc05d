//! The step time of a traced step on a card, predicted kernel by kernel:
//! every op of the trace's measured step ([`StepWork::from_trace`]) timed
//! by its class ([`rules`]), the host's dispatch of each op running ahead
//! of the GPU, and the GPU waiting where the host is slower (what bounds
//! small models: a SegFormer-B0 step is thousands of small kernels), the
//! optimizer's for-each kernels, and DDP's all-reduce of the gradient
//! buckets over the card's link, overlapping the backward.
//!
//! The few efficiencies are fitted on public MMSeg training logs
//! (`scripts/speed-fit`, `docs/speed.md`); a figure from here is a
//! prediction, and says so wherever it is shown.

pub mod card;
pub mod rules;

pub use card::Card;
use rules::{Efficiencies, KernelClass, FOREACH_MAX_ELEMENTS, FOREACH_MAX_TENSORS};

use super::kernels::conv::{conv_call, DataType};
use super::step_trace::TracedStep;
use crate::kinds::{Amp, RunMode};
use crate::trial::kernel_calls::KernelCall;
use crate::trial::op_work::OpWork;
use crate::trial::trace::{phase_of, Phase};

/// The part of the step a kernel belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Part {
    Forward,
    Backward,
    Optimizer,
}

/// One kernel (or one op's kernels) of a step, as the model times it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Kernel {
    pub part: Part,
    pub class: KernelClass,
    /// FLOPs (GEMMs and convolutions).
    pub flops: f64,
    /// Bytes through memory.
    pub bytes: f64,
    /// The data type of a GEMM or convolution.
    pub dtype: Option<DataType>,
    /// Device launches.
    pub launches: u32,
    /// Host dispatches (ops) before it.
    pub dispatches: u32,
    /// Host dispatches of views and allocations before it (no kernel).
    pub view_dispatches: u32,
    /// A 3x3, stride-1, undilated, ungrouped convolution: cuDNN's Winograd
    /// kernels run it on CUDA cores with fewer multiplies.
    #[serde(default)]
    pub winograd: bool,
}

/// A traced step's kernels, in order: what [`StepWork::time`] times.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepWork {
    pub kernels: Vec<Kernel>,
    /// Bytes of one copy of the parameters' gradients (fp32): what DDP
    /// all-reduces.
    pub gradient_bytes: f64,
}

/// What the step is run with, beyond its trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeedSetup {
    pub mode: RunMode,
    /// The precision (a traced half tensor is fp16 under `--amp fp16`).
    pub amp: Amp,
    /// GPUs of data-parallel training (all-reduce over the card's link).
    pub gpus: i64,
    /// Micro-steps per optimizer step (`accumulative_counts`).
    pub accumulation: i64,
    /// Bytes of the batch copied from the host (uint8 images and labels).
    pub input_bytes: f64,
}

impl SpeedSetup {
    /// The setup of a step of `batch` images of `crop`: its input is the
    /// uint8 images and, for training, the int64 label maps (MMSeg's
    /// `PackSegInputs`) copied from the host.
    pub fn of_step(
        mode: RunMode,
        amp: Amp,
        gpus: i64,
        accumulation: i64,
        batch: i64,
        crop: (i64, i64),
    ) -> SpeedSetup {
        let bytes_per_pixel = if mode == RunMode::Train { 11.0 } else { 3.0 };
        SpeedSetup {
            mode,
            amp,
            gpus: gpus.max(1),
            accumulation,
            input_bytes: (batch * crop.0 * crop.1) as f64 * bytes_per_pixel,
        }
    }
}

/// A predicted step time and its parts (seconds).
#[derive(
    Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct StepTime {
    /// One iteration as MMEngine logs it (`time - data_time`): a micro-step
    /// and its share of the optimizer step.
    pub step_s: f64,
    /// The likely range of `step_s` (the fitted model's spread on held-out
    /// logs).
    pub low_s: f64,
    pub high_s: f64,
    /// GPU time of the forward (the data preprocessor's included), the
    /// backward and the optimizer's share.
    pub forward_s: f64,
    pub backward_s: f64,
    pub optimizer_s: f64,
    /// DDP's all-reduce left exposed after the backward.
    pub communication_s: f64,
    /// Where the GPU waits: for the host's dispatch, the batch's copy, a
    /// synchronisation.
    pub overhead_s: f64,
    /// Kernels launched per iteration.
    pub kernels: u64,
}

impl StepTime {
    /// Every figure `factor` times slower (convolutions squeezed out of
    /// their fastest workspaces).
    pub fn scaled(self, factor: f64) -> StepTime {
        let f = factor.max(1.0);
        StepTime {
            step_s: self.step_s * f,
            low_s: self.low_s * f,
            high_s: self.high_s * f,
            forward_s: self.forward_s * f,
            backward_s: self.backward_s * f,
            optimizer_s: self.optimizer_s * f,
            communication_s: self.communication_s * f,
            overhead_s: self.overhead_s * f,
            kernels: self.kernels,
        }
    }

    /// Images per second of `batch` images per iteration.
    pub fn images_per_s(&self, batch: i64) -> f64 {
        batch as f64 / self.step_s.max(1e-9)
    }
}

/// A schedule's training time at a predicted step time.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ScheduleTime {
    /// Training iterations (`train_cfg.max_iters` as the run counts them).
    pub iterations: i64,
    /// Their GPU time, hours (validation and data loading apart).
    pub hours: f64,
    pub hours_low: f64,
    pub hours_high: f64,
}

impl ScheduleTime {
    pub fn of(iterations: i64, step: &StepTime) -> ScheduleTime {
        let hours = |s: f64| iterations as f64 * s / 3600.0;
        ScheduleTime {
            iterations,
            hours: hours(step.step_s),
            hours_low: hours(step.low_s),
            hours_high: hours(step.high_s),
        }
    }

    /// "160k iterations: about 7 h on this card (predicted, 5-9 h)".
    pub fn words(&self, card: &str) -> String {
        format!(
            "{} iterations: about {} on the {card} (predicted, {} to {}; validation and data loading apart)",
            iterations_words(self.iterations),
            duration_words(self.hours),
            duration_words(self.hours_low),
            duration_words(self.hours_high)
        )
    }
}

/// "160k" for 160000, else the number.
fn iterations_words(n: i64) -> String {
    if n >= 1000 && n % 1000 == 0 {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// Seconds in words: "39 ms", "1.24 s".
pub fn seconds_words(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{:.0} ms", seconds * 1e3)
    } else {
        format!("{seconds:.2} s")
    }
}

/// Hours in words: "7.2 h", "45 min", "3.1 days".
pub fn duration_words(hours: f64) -> String {
    if hours < 1.0 {
        format!("{:.0} min", (hours * 60.0).max(1.0))
    } else if hours < 48.0 {
        format!("{hours:.1} h")
    } else {
        format!("{:.1} days", hours / 24.0)
    }
}

/// The spread of held-out logs around the prediction (`docs/speed.md`):
/// the range shown is [`LOW`, `HIGH`] times the likeliest figure.
pub const LOW: f64 = 0.75;
pub const HIGH: f64 = 1.35;

/// The GEMM and convolution ops timed by their kernel calls.
const GEMM_OPS: &[&str] = &["aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"];

impl StepWork {
    /// The measured (last) step's kernels of `step` (`None`: the trace has
    /// no op work: the Python worker's, or a trace without op level).
    /// `amp`: the candidate's precision (a traced half tensor is fp16 under
    /// `--amp fp16`).
    pub fn from_trace(step: &TracedStep, amp: Amp) -> Option<StepWork> {
        if step.ops.is_empty() {
            return None;
        }
        let half_is_fp16 = amp == Amp::Fp16;
        let last = step.ops.iter().map(|o| phase_of(o.phase).0).max()?;
        let mut calls = step.kernel_calls.iter();
        let mut kernels = Vec::new();
        let mut foreach: Vec<ForeachGroup> = Vec::new();
        let (mut dispatches, mut views) = (0u32, 0u32);
        for op in &step.ops {
            // Kernel calls are recorded with the same ops, in the same order.
            let call = if is_recorded(&op.op) {
                next_call(&mut calls, &op.op)
            } else {
                None
            };
            let (index, phase) = phase_of(op.phase);
            if index != last {
                continue;
            }
            let part = match phase {
                Phase::Forward | Phase::Preprocess => Part::Forward,
                Phase::Backward => Part::Backward,
                Phase::Optimizer => Part::Optimizer,
                Phase::Setup | Phase::Data => continue,
            };
            let rule = rules::rule_of(&op.op);
            if op.view || rule.class == KernelClass::None {
                views += 1;
            } else if part == Part::Optimizer {
                if rule.class != KernelClass::Sync {
                    ForeachGroup::add(&mut foreach, op);
                }
            } else {
                dispatches += 1;
                let first = kernels.len();
                kernels.extend(op_kernels(op, call, part, rule, half_is_fp16));
                // The host's dispatches since the last kernel precede this
                // op's first.
                if let Some(k) = kernels.get_mut(first) {
                    k.dispatches = std::mem::take(&mut dispatches);
                    k.view_dispatches = std::mem::take(&mut views);
                }
            }
        }
        kernels.extend(foreach.iter().map(ForeachGroup::kernel));
        Some(StepWork {
            kernels,
            gradient_bytes: ForeachGroup::gradient_bytes(&foreach),
        })
    }

    /// The step's time on `card` (the likeliest figure and its range).
    pub fn time(&self, card: &Card, setup: &SpeedSetup) -> StepTime {
        self.time_with(card, setup, &Efficiencies::FITTED)
    }

    /// [`StepWork::time`] with other efficiencies (the fit's).
    pub fn time_with(&self, card: &Card, setup: &SpeedSetup, e: &Efficiencies) -> StepTime {
        let mut host = 0.0f64;
        // The batch's copy from the host opens the step.
        let mut device = setup.input_bytes / (card.host_link_gbs * 1e9);
        let copy = device;
        let mut busy = [0.0f64; 3];
        let mut launched = 0u64;
        let mut step_without_optimizer = None;
        for k in &self.kernels {
            if k.part == Part::Optimizer && step_without_optimizer.is_none() {
                step_without_optimizer = Some((host.max(device), host, device));
            }
            let per_op = match k.part {
                Part::Forward => e.forward_dispatch_s,
                Part::Backward | Part::Optimizer => e.backward_dispatch_s,
            };
            host +=
                f64::from(k.dispatches) * per_op + f64::from(k.view_dispatches) * e.view_dispatch_s;
            if k.class == KernelClass::Sync {
                host = host.max(device) + 10e-6;
                continue;
            }
            let t = kernel_seconds(k, card, e, setup.amp);
            device = device.max(host) + t;
            launched += u64::from(k.launches);
            busy[k.part as usize] += t;
        }
        if setup.amp == Amp::Fp16 && setup.mode == RunMode::Train && self.gradient_bytes > 0.0 {
            // GradScaler: `_amp_foreach_non_finite_check_and_unscale_` reads
            // and writes every gradient (one for-each pass), then `step`
            // reads `found_inf` back (a synchronisation) and
            // `_amp_update_scale_` is one tiny kernel.
            let before = host.max(device);
            step_without_optimizer.get_or_insert((before, host, device));
            let unscale = Kernel {
                part: Part::Optimizer,
                class: KernelClass::Memory,
                flops: 0.0,
                bytes: 2.0 * self.gradient_bytes,
                dtype: None,
                launches: 2,
                dispatches: 2,
                view_dispatches: 0,
                winograd: false,
            };
            host += 2.0 * e.backward_dispatch_s;
            let t = kernel_seconds(&unscale, card, e, setup.amp);
            device = device.max(host) + t;
            busy[Part::Optimizer as usize] += t;
            launched += 2;
            host = host.max(device) + 10e-6;
        }
        let end = host.max(device);
        let accumulation = setup.accumulation.max(1) as f64;
        // The optimizer runs once per `accumulation` micro-steps.
        let (step, optimizer_wall) = match step_without_optimizer {
            Some((before, _, _)) => {
                let optimizer = end - before;
                (before + optimizer / accumulation, optimizer / accumulation)
            }
            None => (end, 0.0),
        };
        let communication = if setup.mode == RunMode::Train && setup.gpus > 1 {
            let n = setup.gpus as f64;
            // Ring all-reduce of 25 MiB buckets (DDP's `bucket_cap_mb`),
            // overlapping the backward but for the last bucket.
            let wire = 2.0 * (n - 1.0) / n * self.gradient_bytes / (card.link_gbs * 1e9 * 0.8);
            let buckets = (self.gradient_bytes / (25.0 * 1048576.0)).ceil().max(1.0);
            let total = wire + buckets * 30e-6;
            (total - busy[Part::Backward as usize]).max(total / buckets) / accumulation.max(1.0)
        } else {
            0.0
        };
        let step = step + communication;
        let optimizer = busy[Part::Optimizer as usize] / accumulation;
        let forward = busy[Part::Forward as usize] + copy;
        let backward = busy[Part::Backward as usize];
        let overhead = (step - forward - backward - optimizer - communication).max(0.0);
        let _ = optimizer_wall;
        StepTime {
            step_s: step,
            low_s: step * LOW,
            high_s: step * HIGH,
            forward_s: forward,
            backward_s: backward,
            optimizer_s: optimizer,
            communication_s: communication,
            overhead_s: overhead,
            kernels: launched,
        }
    }

    /// The work at `batch` between two traced batches' (or beyond them),
    /// where both steps run the same kernels (their bytes and FLOPs grow
    /// with the batch); `None` where they differ.
    pub fn lerp(one: (i64, &StepWork), two: (i64, &StepWork), batch: i64) -> Option<StepWork> {
        let ((b1, w1), (b2, w2)) = (one, two);
        if w1.kernels.len() != w2.kernels.len() || b1 == b2 {
            return None;
        }
        let t = (batch - b1) as f64 / (b2 - b1) as f64;
        let at = |a: f64, b: f64| (a + (b - a) * t).max(0.0);
        let mut kernels = Vec::with_capacity(w1.kernels.len());
        for (a, b) in w1.kernels.iter().zip(&w2.kernels) {
            if a.class != b.class || a.part != b.part {
                return None;
            }
            kernels.push(Kernel {
                flops: at(a.flops, b.flops),
                bytes: at(a.bytes, b.bytes),
                ..a.clone()
            });
        }
        Some(StepWork {
            kernels,
            gradient_bytes: w2.gradient_bytes,
        })
    }
}

/// One kernel's device time.
fn kernel_seconds(k: &Kernel, card: &Card, e: &Efficiencies, amp: Amp) -> f64 {
    let latency = f64::from(k.launches) * e.kernel_latency_s;
    // The share of the bytes that fits in L2 streams at its bandwidth.
    let in_l2 = if k.bytes > 0.0 {
        (card.l2_bytes / k.bytes).min(1.0)
    } else {
        0.0
    };
    let memory = k.bytes * (in_l2 / e.l2.max(1.0) + (1.0 - in_l2))
        / (card.bandwidth_gbs * 1e9 * e.bandwidth);
    let work = match k.class {
        KernelClass::Gemm | KernelClass::Conv => {
            // One CPU trace (bf16 autocast) stands for fp16 and bf16.
            let dtype = match k.dtype.unwrap_or(DataType::F32) {
                DataType::Bf16 if amp == Amp::Fp16 => DataType::F16,
                d => d,
            };
            let (rate, tensor) = card.math_rate(k.class, dtype);
            let efficiency = if tensor { e.tensor_core } else { e.cuda_core };
            // cuDNN's backward-data and backward-filter kernels reach less
            // of the peak than its forward kernels.
            let mut slower = if k.class == KernelClass::Conv && k.part == Part::Backward {
                e.conv_backward
            } else {
                1.0
            };
            if k.winograd && !tensor {
                slower /= e.winograd;
            }
            (slower * k.flops / (rate * 1e12 * efficiency)).max(memory)
        }
        KernelClass::Atomic => memory * e.atomic_slowdown,
        KernelClass::DepthwiseConv | KernelClass::Memory => memory,
        KernelClass::None | KernelClass::Sync => 0.0,
    };
    latency + work
}

fn is_recorded(op: &str) -> bool {
    crate::trial::kernel_calls::RECORDED_OPS.contains(&op)
}

/// The next recorded call of `op` (calls of other ops recorded between
/// are the others' own: the sequences interleave in the same order).
fn next_call<'a>(calls: &mut std::slice::Iter<'a, KernelCall>, op: &str) -> Option<&'a KernelCall> {
    let rest = calls.clone();
    for (skipped, c) in rest.enumerate() {
        if c.op == op {
            // Advance past it.
            for _ in 0..=skipped {
                calls.next();
            }
            return Some(c);
        }
        if skipped > 4 {
            break;
        }
    }
    None
}

/// An op's kernels, before the host's dispatch counts are set: one per
/// direction of a GEMM or convolution (its bytes shared between them),
/// else the op's rule.
fn op_kernels(
    op: &OpWork,
    call: Option<&KernelCall>,
    part: Part,
    rule: rules::OpRule,
    half_is_fp16: bool,
) -> Vec<Kernel> {
    let bytes = (op.in_bytes + op.out_bytes) as f64;
    let kernel = |class, flops, dtype, bytes, launches, winograd| Kernel {
        part,
        class,
        flops,
        bytes,
        dtype,
        launches,
        dispatches: 0,
        view_dispatches: 0,
        winograd,
    };
    match call.and_then(|c| gemm_or_conv(c, half_is_fp16)) {
        Some(g) => {
            let n = g.directions.max(1) as f64;
            (0..g.directions)
                .map(|_| kernel(g.class, g.flops, Some(g.dtype), bytes / n, 1, g.winograd))
                .collect()
        }
        None => vec![kernel(
            rule.class,
            0.0,
            None,
            bytes * rule.passes,
            rule.launches,
            false,
        )],
    }
}

/// The optimizer's per-parameter ops of one kind, which PyTorch runs as one
/// for-each op.
struct ForeachGroup {
    op: String,
    tensors: usize,
    bytes: f64,
}

impl ForeachGroup {
    fn add(groups: &mut Vec<ForeachGroup>, op: &OpWork) {
        let bytes = (op.in_bytes + op.out_bytes) as f64;
        match groups.iter_mut().find(|g| g.op == op.op) {
            Some(g) => {
                g.tensors += 1;
                g.bytes += bytes;
            }
            None => groups.push(ForeachGroup {
                op: op.op.clone(),
                tensors: 1,
                bytes,
            }),
        }
    }

    /// One launch per `multi_tensor_apply` chunk, one dispatch.
    fn kernel(&self) -> Kernel {
        let chunks_by_tensors = self.tensors.div_ceil(FOREACH_MAX_TENSORS);
        let chunks_by_size = (self.bytes / 4.0 / FOREACH_MAX_ELEMENTS).ceil() as usize;
        Kernel {
            part: Part::Optimizer,
            class: KernelClass::Memory,
            flops: 0.0,
            bytes: self.bytes,
            dtype: None,
            launches: chunks_by_tensors.max(chunks_by_size).max(1) as u32,
            dispatches: 1,
            view_dispatches: 0,
            winograd: false,
        }
    }

    /// One copy of the gradients: the cheapest op over every parameter
    /// reads and writes each once.
    fn gradient_bytes(groups: &[ForeachGroup]) -> f64 {
        let most = groups.iter().map(|g| g.tensors).max().unwrap_or(0);
        groups
            .iter()
            .filter(|g| g.tensors == most)
            .map(|g| g.bytes / 2.0)
            .reduce(f64::min)
            .unwrap_or(0.0)
    }
}

/// A GEMM's or convolution's kernels, as [`gemm_or_conv`] reads them.
struct GemmOrConv {
    class: KernelClass,
    /// FLOPs of each direction.
    flops: f64,
    dtype: DataType,
    /// Directions computed (a convolution's backward: one or two).
    directions: usize,
    /// A 3x3, stride-1, undilated, ungrouped convolution.
    winograd: bool,
}

/// A GEMM's or convolution's kernels (`None` for another op or arguments
/// it cannot read).
fn gemm_or_conv(call: &KernelCall, half_is_fp16: bool) -> Option<GemmOrConv> {
    if GEMM_OPS.contains(&call.op.as_str()) {
        let at = usize::from(matches!(call.op.as_str(), "aten::addmm" | "aten::baddbmm"));
        let (dtype, a, _) = call.tensor(at)?;
        let (_, b, _) = call.tensor(at + 1)?;
        let dtype = DataType::of_traced(dtype, half_is_fp16)?;
        let flops = match (a, b) {
            ([m, k], [_, n]) => 2.0 * (m * k * n) as f64,
            ([batch, m, k], [_, _, n]) => 2.0 * (batch * m * k * n) as f64,
            _ => return None,
        };
        return Some(GemmOrConv {
            class: KernelClass::Gemm,
            flops,
            dtype,
            directions: 1,
            winograd: false,
        });
    }
    let conv = conv_call(call, half_is_fp16)?;
    let p = conv.problem;
    Some(GemmOrConv {
        class: if p.is_depthwise() {
            KernelClass::DepthwiseConv
        } else {
            KernelClass::Conv
        },
        flops: p.flops(),
        dtype: p.dtype,
        directions: conv.directions.len(),
        winograd: (p.r, p.s) == (3, 3)
            && !p.is_strided()
            && !p.is_dilated()
            && p.groups == 1
            && p.c >= 16
            && p.k >= 16,
    })
}

#[cfg(test)]
mod tests;
