//! One trial in this process: build the model, then warm-up and measured
//! training steps as mmengine's `train_step` runs them, with the counting
//! allocator's (or CUDA's) peaks per phase.

use super::batch::Batch;
use super::memory::{self, CpuCounter, Phase, TraceEvent};
use super::optim::{Amp, OptimCfg, OptimWrapper};
use super::report::{StepRecord, TrialReport, TrialStatus};
use super::trace::phase_code;
use super::{ddp, RunMode, Switch, TorchVersion, TrialRequest};
use crate::config::Dict;
use crate::models::EncoderDecoder;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// Runs a trial of the resolved config `cfg`. Memory figures are relative
/// to the CPU allocator's count before the model is built.
///
/// A CPU trial without `--cpu-cap` runs under a cap of the host's available
/// RAM (less a reserve): a step that needs more fails as `host_oom`, saying
/// how much it needed, instead of growing until the kernel kills it (and
/// perhaps other processes with it). A meta trace's tensors take no host
/// memory and are not capped so.
///
/// The same trial runs under an OS limit on its data memory
/// (`RLIMIT_DATA`: the heap and private writable mappings, what tensors and
/// the kernels' scratch live in) of what it uses now plus the host's
/// available RAM, so that memory the count does not see cannot grow
/// without bound either: an allocation past it fails (`host_oom`) instead
/// of the kernel killing the worker. The meta trace's address reservation
/// (never writable) is not data and does not count.
pub fn run(cfg: &Dict, request: &TrialRequest, device: Device) -> TrialReport {
    // A given cap (--cpu-cap, or --vram on the CUDA stand-in) is the
    // trial's own: the host's RAM does not bound it too.
    let capped =
        request.cpu_cap_bytes.is_some() || (request.as_cuda && request.vram_budget_bytes.is_some());
    let host = (device == Device::Cpu && !capped)
        .then(host_available)
        .flatten();
    // A meta trace counts the storages its ops would allocate, which take
    // no host memory: that ledger is not capped by the host's RAM (the data
    // limit below still bounds what the worker really allocates).
    let host_budget = host
        .filter(|_| request.op_trace != memory::OpTrace::Meta)
        .map(host_tensor_budget);
    let data_limit = host.map(|available| {
        std::env::var("SEGTUNE_WORKER_DATA_LIMIT")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(available)
    });
    if let Some(extra) = data_limit {
        limit_data_memory(extra);
    }
    let report = run_capped(cfg, request, device, host_budget);
    match host {
        Some(available) if report.status == TrialStatus::Oom => {
            let budget = host_budget.unwrap_or(available);
            let doing = if request.trace_out.is_some() {
                "while tracing"
            } else {
                "in the CPU step"
            };
            host_out_of_memory(report, budget, data_limit.unwrap_or(budget), doing)
        }
        _ => report,
    }
}

/// `--vram`: on CUDA, caps the caching allocator before the first tensor
/// (it reads its fraction when it first serves the device); on the CUDA
/// stand-in, caps the counted tensors at the budget (it has no context);
/// refused on a plain CPU trial.
fn apply_vram_budget(
    report: &mut TrialReport,
    request: &TrialRequest,
    device: Device,
    budget: u64,
    counter: &memory::CpuCounter,
    base: i64,
) -> Result<(), String> {
    match device {
        Device::Cuda(i) => {
            let (context, fraction) = cap_cuda_allocator(i, budget)?;
            report.cuda_context_measured_bytes = Some(context);
            report.cuda_memory_fraction = fraction;
            Ok(())
        }
        _ if request.as_cuda => {
            counter.set_cap(base + budget as i64);
            Ok(())
        }
        _ => Err("--vram caps a CUDA device's memory (or, with --as-cuda, the CPU stand-in's); a plain CPU trial takes --cpu-cap".into()),
    }
}

/// `torch.backends.cudnn.benchmark`/`.deterministic` as MMEngine sets them
/// before training (from `env_cfg` and `randomness`; `--cudnn-benchmark`
/// overrides), recorded in the report.
fn set_cudnn_from_config(
    report: &mut TrialReport,
    cfg: &Dict,
    request: &TrialRequest,
) -> Result<(), String> {
    let deterministic = super::setup::cudnn_deterministic(cfg);
    let benchmark = request
        .cudnn_benchmark
        .unwrap_or_else(|| super::setup::cudnn_benchmark(cfg));
    memory::set_cudnn_flags(benchmark, deterministic)?;
    report.cudnn_benchmark = Some(benchmark);
    report.cudnn_deterministic = Some(deterministic);
    Ok(())
}

/// Caps CUDA device `index`'s caching allocator at `budget` less the CUDA
/// context measured now; returns the context and the fraction set (`None`
/// where the device has no more than the budget).
fn cap_cuda_allocator(index: usize, budget: u64) -> Result<(u64, Option<f64>), String> {
    let (free, total) = memory::cuda_mem_info(index)?;
    let context = total.saturating_sub(free);
    let fraction = memory::memory_fraction(budget, total, context)?;
    if let Some(f) = fraction {
        memory::set_cuda_allocator_settings(&format!("per_process_memory_fraction:{f:.6}"))?;
        // The cap must hold: one allocation just past it has to fail (the
        // allocator refuses it without touching the device), or the trial
        // would measure an uncapped card and say nothing.
        let past = (f * total as f64) as i64 + (2 << 20);
        if let Ok(t) = Tensor::f_empty([past], (Kind::Uint8, Device::Cuda(index))) {
            drop(t);
            return Err(format!(
                "the --vram cap ({:.2} GiB for the allocator) did not take effect on cuda:{index}: this PyTorch ignores per_process_memory_fraction",
                (f * total as f64) / (1u64 << 30) as f64
            ));
        }
    }
    Ok((context, fraction))
}

/// What a CPU trial's tensors may hold at once on this host: the RAM
/// available now, less 1/16 of it (at least 512 MiB) for the rest of the
/// process and the system.
///
/// `SEGTUNE_HOST_MEMORY` (bytes) stands in for the available RAM: to
/// keep traces small on a shared machine, and for tests.
fn host_tensor_budget(available: u64) -> u64 {
    let reserve = (available / 16).max(512 << 20);
    available.saturating_sub(reserve).max(64 << 20)
}

/// The RAM available to a trial (`SEGTUNE_HOST_MEMORY` or `MemAvailable`).
fn host_available() -> Option<u64> {
    match std::env::var("SEGTUNE_HOST_MEMORY") {
        Ok(v) => v.trim().parse().ok(),
        Err(_) => Some(host_memory()?.1),
    }
}

/// Lowers this process's `RLIMIT_DATA` to its data size now (`VmData`)
/// plus `extra` bytes (`SEGTUNE_WORKER_DATA_LIMIT` sets `extra`, for tests).
fn limit_data_memory(extra: u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(now) = kb_field(&status, "VmData:") else {
        return;
    };
    let soft = now.saturating_add(extra);
    // SAFETY: getrlimit/setrlimit on this process with valid pointers.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_DATA, &mut limit) != 0 {
            return;
        }
        if limit.rlim_cur == libc::RLIM_INFINITY || (soft as libc::rlim_t) < limit.rlim_cur {
            limit.rlim_cur = (soft as libc::rlim_t).min(limit.rlim_max);
            let _ = libc::setrlimit(libc::RLIMIT_DATA, &limit);
        }
    }
}

/// Turns the host cap's out-of-memory into `host_oom` with the bytes the
/// step had asked for when it stopped (a lower bound of what it needs).
fn host_out_of_memory(
    mut report: TrialReport,
    budget: u64,
    data_limit: u64,
    doing: &str,
) -> TrialReport {
    let gb = |b: u64| b as f64 / 1e9;
    let message = report.message.clone().unwrap_or_default();
    report.status = TrialStatus::HostOom;
    let Some(asked) = memory::cap_failure_bytes(&message) else {
        // Not the tensor count's cap: the OS refused memory at the
        // worker's data limit (or the host had none left).
        let tried = message
            .split("you tried to allocate ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .map(|n| format!(" (an allocation of {n} bytes failed)"))
            .unwrap_or_default();
        report.message = Some(format!(
            "host out of memory {doing}: the worker reached its memory limit of {:.1} GB \
             over its start (this host's available RAM){tried}; free memory, use a host with \
             more RAM, or a smaller batch or crop",
            gb(data_limit)
        ));
        return report;
    };
    report.message = Some(format!(
        "host out of memory {doing}: the step needs more than {:.1} GB of tensors at \
         once, and this host had {:.1} GB to give it; free memory, use a host with more RAM, \
         or a smaller batch or crop",
        gb(asked),
        gb(budget)
    ));
    report
}

fn run_capped(
    cfg: &Dict,
    request: &TrialRequest,
    device: Device,
    host_budget: Option<u64>,
) -> TrialReport {
    let counter = CpuCounter::install();
    if let Some(n) = request.threads {
        tch::set_num_threads(n);
    }
    let mut report = TrialReport::new(request, format!("{device:?}").to_lowercase());
    if request.trace_out.is_some() {
        let _ = counter.take_trace();
        counter.set_phase_code(0);
        counter.tag_model_scopes();
        counter.trace(true);
    }
    if let Err(why) = check_host_memory(request) {
        return report.failed(TrialStatus::Error, why);
    }
    if request.op_trace != memory::OpTrace::Off {
        if device != Device::Cpu {
            return report.failed(
                TrialStatus::Error,
                "--op-trace traces a CPU (or meta) step; leave it out on CUDA".into(),
            );
        }
        if let Err(e) = memory::set_op_trace(request.op_trace) {
            return report.failed(TrialStatus::Error, e);
        }
        if request.trace_out.is_some() {
            if let Err(e) = super::kernel_calls::record(true) {
                return report.failed(TrialStatus::Error, e);
            }
        }
    }
    let base = counter.current();
    if let Some(budget) = host_budget {
        counter.set_cap(base + budget as i64);
    }
    if let Some(budget) = request.vram_budget_bytes {
        if let Err(e) = apply_vram_budget(&mut report, request, device, budget, &counter, base) {
            return report.failed(TrialStatus::Error, e);
        }
    }
    tch::manual_seed(request.seed);
    if request.mode == RunMode::Infer {
        let model = cfg.get("model").and_then(crate::config::Value::as_dict);
        if let Err(e) = model.map_or(
            Ok(()),
            crate::models::segmentors::inference::check_inference,
        ) {
            return report.failed(TrialStatus::Error, e.to_string());
        }
    }
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        EncoderDecoder::build(cfg, device)
    }));
    let mut model = match built {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return report.failed(TrialStatus::Error, e.to_string()),
        Err(panic) => return report.failed_from_panic(panic),
    };
    model.set_preprocessor_size(request.crop);
    report.set_params(&model);
    report.bytes_after_model_build = counter.current() - base;
    let mut optim_cfg = match OptimCfg::from_cfg(cfg) {
        Ok(c) => c,
        Err(e) => return report.failed(TrialStatus::Error, e),
    };
    if let Some(n) = request.accumulative_counts {
        optim_cfg.accumulative_counts = n;
    }
    report.optimizer = optim_cfg.type_name.clone();
    report.accumulative_counts = optim_cfg.accumulative_counts;
    let mut optimizer = OptimWrapper::new(optim_cfg, &model.params, request.amp);
    let torch = request.setup.torch;
    if torch != TorchVersion::NEWEST && device != Device::Cpu {
        return report.failed(
            TrialStatus::Error,
            format!(
                "a trial on a GPU runs the PyTorch segtune links ({}); --torch {torch} is reproduced on the CPU only (estimate, predicted search)",
                TorchVersion::NEWEST
            ),
        );
    }
    if torch.has(Switch::SoftmaxKeepsInput) {
        crate::models::layers::emulate_softmax_saving_input(|input, output| {
            memory::hold_until_freed(input, output)
                .expect("softmax outputs are counted CPU tensors");
        });
    }
    if torch.has(Switch::ZeroGradKeepsGradients) {
        optimizer.zero_grad_in_place(true);
    }
    if request.as_cuda {
        if device != Device::Cpu {
            return report.failed(
                TrialStatus::Error,
                "--as-cuda makes a CPU trial stand in for a GPU; on CUDA, leave it out".into(),
            );
        }
        if request.amp != Amp::Off {
            if let Err(e) = memory::autocast_cuda_policy(true)
                .and_then(|()| memory::autocast_cuda_release(torch))
            {
                return report.failed(TrialStatus::Error, e);
            }
        }
        if request.amp == Amp::Fp16 {
            optimizer.use_grad_scaler();
        }
        if torch.has(Switch::ForeachOptimizersOnCuda) {
            optimizer.use_foreach();
        }
        crate::models::layers::emulate_mmcv_cuda_ops();
    }
    // DistributedDataParallel wraps the model before training starts.
    let ddp_buckets = ddp::allocate_buckets(&model.params, request.setup.gpus, device);
    if request.amp == Amp::Bf16 && device.is_cuda() && !bf16_supported(device) {
        return report.failed(TrialStatus::Error, "this GPU does not support bf16".into());
    }
    if let Some(cap) = request.cpu_cap_bytes {
        counter.set_cap(base + cap as i64);
    }
    let cuda_index = match device {
        Device::Cuda(i) => Some(i),
        _ => None,
    };
    if cuda_index.is_some() {
        if let Err(e) = set_cudnn_from_config(&mut report, cfg, request) {
            return report.failed(TrialStatus::Error, e);
        }
    }
    let total_steps = request.warmup_steps + request.measured_steps;
    if request.op_trace == memory::OpTrace::Meta {
        let classes = request
            .gt_segments
            .map_or(model.num_classes, |g| g.min(model.num_classes));
        let pixels = request.crop.0 * request.crop.1;
        crate::models::layers::host::set_shape_only_segments(Some(classes.min(pixels)));
    }
    // mmengine keeps the last step's log_vars alive into the next step.
    let mut previous_items: Vec<(String, Tensor)> = Vec::new();
    let mut trace: Vec<TraceEvent> = Vec::new();
    for step in 0..total_steps {
        let measured = step >= request.warmup_steps;
        counter.set_phase_code(phase_code(step + 1, Phase::Data));
        let batch = Batch::synthetic(
            request,
            model.num_classes,
            model.ignore_index,
            model.takes_pixel_values(),
        );
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
        let _ = crate::models::layers::checkpoint::take_recompute_flops();
        let started = Instant::now();
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match request.mode {
                RunMode::Train => train_step(
                    &model,
                    &mut optimizer,
                    batch,
                    request,
                    &counter,
                    base,
                    step + 1,
                ),
                RunMode::Infer => {
                    super::infer::infer_step(&model, batch, request, &counter, base, step + 1)
                }
            }));
        if let Some(i) = cuda_index {
            let _ = memory::device_synchronize(i);
        }
        report.forward_flops = crate::models::layers::take_forward_flops();
        report.recompute_flops = crate::models::layers::checkpoint::take_recompute_flops();
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
        if request.mode == RunMode::Train && loss.is_none_or(|l| !l.is_finite()) {
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
    crate::models::layers::host::set_shape_only_segments(None);
    if request.op_trace != memory::OpTrace::Off {
        let _ = memory::set_op_trace(memory::OpTrace::Off);
        if request.op_trace == memory::OpTrace::Meta {
            report.meta_ops_on_cpu = memory::op_trace_unsupported()
                .map(|names| names.split(',').map(str::to_string).collect())
                .unwrap_or_default();
            report.meta_stand_ins = memory::op_trace_stand_ins();
        }
    }
    if request.trace_out.is_some() {
        counter.trace(false);
        trace.extend(counter.take_trace());
        if request.op_trace != memory::OpTrace::Off {
            match super::kernel_calls::take() {
                Ok(calls) => report.kernel_calls = calls,
                Err(e) => return report.failed(TrialStatus::Error, e),
            }
            let _ = super::kernel_calls::record(false);
        }
    }
    report.optimizer_state_bytes = optimizer.state_bytes();
    if request.trace_out.is_some() {
        report.trace = Some(trace);
        report.model_scopes = crate::models::scope::names();
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

pub(super) type Phases = [(Phase, i64); 3];

/// The step's autocast, if it runs in half precision (on the CPU standing
/// in for CUDA, half precision is held as bf16: the same two bytes).
pub(super) fn autocast(
    request: &TrialRequest,
    device: Device,
) -> Result<Option<memory::AutocastGuard>, String> {
    Ok(match request.amp.kind() {
        Some(_) if request.as_cuda => Some(memory::AutocastGuard::new(device, Kind::BFloat16)?),
        Some(kind) => Some(memory::AutocastGuard::new(device, kind)?),
        None => None,
    })
}

/// mmengine's `BaseModel.train_step`: data preprocessing + forward + loss
/// under the optimizer wrapper's context (autocast for AMP), then
/// `update_params` (backward, step, zero_grad). Returns each phase's peak.
fn train_step(
    model: &EncoderDecoder,
    optimizer: &mut OptimWrapper,
    batch: Batch,
    request: &TrialRequest,
    counter: &CpuCounter,
    base: i64,
    step: usize,
) -> Result<(Phases, Vec<(String, Tensor)>), String> {
    let Batch { images, labels } = batch;
    let device = model.device();
    counter.set_phase_code(phase_code(step, Phase::Forward));
    let (inputs, padded_labels, losses) = {
        let _autocast = autocast(request, device)?;
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

/// `(MemTotal, MemAvailable)` of this host in bytes, from `/proc/meminfo`.
pub fn host_memory() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    Some((
        kb_field(&text, "MemTotal:")?,
        kb_field(&text, "MemAvailable:")?,
    ))
}

/// A `NAME: N kB` line of a /proc file's `text`, in bytes.
fn kb_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// Refuses a request whose input batch alone (fp32 images and int64
/// labels, before any activation) would not fit in this host's RAM: on the
/// CPU every activation of the step is host memory too, and a typo such as
/// `--batch-size 1000000000` must not grow until the kernel kills it.
fn check_host_memory(request: &TrialRequest) -> Result<(), String> {
    let (h, w) = request.crop;
    let pixels = (request.batch_size as u128) * (h as u128) * (w as u128);
    // 3 fp32 channels + one int64 label per pixel.
    let input_bytes = pixels * (3 * 4 + 8);
    let Some((total, _)) = host_memory() else {
        return Ok(());
    };
    if input_bytes > total as u128 / 2 {
        let gib = |b: u128| b as f64 / (1u64 << 30) as f64;
        return Err(format!(
            "batch {} x {h}x{w}: the input batch alone is {:.1} GiB, more than half of this \
             host's {:.1} GiB of RAM; a training step needs many times that",
            request.batch_size,
            gib(input_bytes),
            gib(total as u128)
        ));
    }
    Ok(())
}
