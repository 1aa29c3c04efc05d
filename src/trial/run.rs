//! One trial in this process: build the model, then warm-up and measured
//! training steps as mmengine's `train_step` runs them, with the counting
//! allocator's (or CUDA's) peaks per phase.

use super::batch::Batch;
use super::error::TrialError;
use super::memory::{self, CpuCounter, Phase};
use super::optim::{Amp, OptimCfg, OptimWrapper};
use super::report::{StepRecord, TrialReport, TrialStatus};
use super::trace::phase_code;
use super::{ddp, TrialRequest};
use crate::config::Dict;
use crate::kinds::{MmcvSwitch, RunMode, Switch, TorchVersion};
use crate::models::EncoderDecoder;
use crate::shim::ffi::ShimError;
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
    switches: &super::emulation::Switches,
    base: i64,
) -> Result<(), TrialError> {
    match device {
        Device::Cuda(i) => {
            let (context, fraction) = cap_cuda_allocator(i, budget)?;
            report.cuda_context_measured_bytes = Some(context);
            report.cuda_memory_fraction = fraction;
            Ok(())
        }
        _ if request.as_cuda => {
            switches.cap(base + budget as i64);
            Ok(())
        }
        _ => Err(TrialError::VramOnPlainCpu),
    }
}

/// `torch.backends.cudnn.benchmark`/`.deterministic` as MMEngine sets them
/// before training (from `env_cfg` and `randomness`; `--cudnn-benchmark`
/// overrides), recorded in the report.
fn set_cudnn_from_config(
    report: &mut TrialReport,
    cfg: &Dict,
    request: &TrialRequest,
) -> Result<(), TrialError> {
    let deterministic = super::cudnn_flags::cudnn_deterministic(cfg);
    let benchmark = request
        .cudnn_benchmark
        .unwrap_or_else(|| super::cudnn_flags::cudnn_benchmark(cfg));
    memory::set_cudnn_flags(benchmark, deterministic)?;
    report.cudnn_benchmark = Some(benchmark);
    report.cudnn_deterministic = Some(deterministic);
    Ok(())
}

/// Caps CUDA device `index`'s caching allocator at `budget` less the CUDA
/// context measured now; returns the context and the fraction set (`None`
/// where the device has no more than the budget).
fn cap_cuda_allocator(index: usize, budget: u64) -> Result<(u64, Option<f64>), TrialError> {
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
            return Err(TrialError::VramCapIgnored {
                allocator_bytes: f * total as f64,
                device: index,
            });
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

/// Why a trial stopped before its end: a status and its message, or a
/// panic (tch turns libtorch's C++ exceptions into panics).
enum Stop {
    Failed(TrialStatus, String),
    Panicked(Box<dyn std::any::Any + Send>),
}

impl<E: Into<TrialError>> From<E> for Stop {
    fn from(error: E) -> Stop {
        Stop::Failed(TrialStatus::Error, error.into().to_string())
    }
}

/// A trial's model and what trains it.
struct Trainee {
    model: EncoderDecoder,
    optimizer: OptimWrapper,
}

/// The trial's setting once prepared: where the counter started, the CUDA
/// device (if any) and the switches to restore.
struct Bench<'a> {
    counter: &'a CpuCounter,
    base: i64,
    cuda_index: Option<usize>,
    switches: super::emulation::Switches<'a>,
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
    match run_phases(cfg, request, device, host_budget, &counter, &mut report) {
        Ok(()) => {
            report.finish();
            report
        }
        Err(Stop::Failed(status, message)) => report.failed(status, message),
        Err(Stop::Panicked(panic)) => report.failed_from_panic(panic),
    }
}

/// The trial's phases in order: prepare the process, build the model and
/// its optimizer, set up what the step emulates, run the steps, collect
/// the traces.
fn run_phases(
    cfg: &Dict,
    request: &TrialRequest,
    device: Device,
    host_budget: Option<u64>,
    counter: &CpuCounter,
    report: &mut TrialReport,
) -> Result<(), Stop> {
    let mut bench = prepare(request, device, host_budget, counter, report)?;
    crate::models::layers::norm::set_sync_bn_world_size(request.setup.gpus);
    let mut trainee = build(cfg, request, device, &bench, report)?;
    emulate_release(request, device, &mut trainee.optimizer)?;
    // DistributedDataParallel wraps the model before training starts.
    let ddp_buckets = ddp::allocate_buckets(&trainee.model.params, request.setup.gpus, device);
    if request.amp == Amp::Bf16 && device.is_cuda() && !bf16_supported(device) {
        return Err(TrialError::Bf16Unsupported.into());
    }
    if let Some(cap) = request.cpu_cap_bytes {
        bench.switches.cap(bench.base + cap as i64);
    }
    if bench.cuda_index.is_some() {
        set_cudnn_from_config(report, cfg, request)?;
    }
    if request.op_trace == memory::OpTrace::Meta {
        let classes = request.gt_segments.map_or(trainee.model.num_classes, |g| {
            g.min(trainee.model.num_classes)
        });
        let pixels = request.crop.0 * request.crop.1;
        bench.switches.shape_only(classes.min(pixels));
    }
    let last_items = run_steps(request, &mut trainee, &bench, report)?;
    drop(last_items);
    drop(ddp_buckets);
    collect_traces(request, trainee, bench, report)
}

/// Before the model: the allocation trace, the host's guard, the op-level
/// trace, the caps and the seed. Returns the counter's base.
fn prepare<'a>(
    request: &TrialRequest,
    device: Device,
    host_budget: Option<u64>,
    counter: &'a CpuCounter,
    report: &mut TrialReport,
) -> Result<Bench<'a>, Stop> {
    if request.trace_out.is_some() {
        let _ = counter.take_trace();
        counter.set_phase_code(0);
        counter.tag_model_scopes();
        counter.trace(true);
    }
    check_host_memory(request)?;
    let mut switches = super::emulation::Switches::new(counter);
    if request.op_trace != memory::OpTrace::Off {
        if device != Device::Cpu {
            return Err(TrialError::OpTraceOnCuda.into());
        }
        switches.trace_ops(request.op_trace)?;
        if request.trace_out.is_some() {
            switches.record_kernel_calls()?;
        }
    }
    let base = counter.current();
    if let Some(budget) = host_budget {
        switches.cap(base + budget as i64);
    }
    if let Some(budget) = request.vram_budget_bytes {
        apply_vram_budget(report, request, device, budget, &switches, base)?;
    }
    tch::manual_seed(request.seed);
    Ok(Bench {
        counter,
        base,
        cuda_index: match device {
            Device::Cuda(i) => Some(i),
            _ => None,
        },
        switches,
    })
}

/// The model (after checking that an inference trial can infer with it)
/// and its optimizer wrapper, as the config and the request set them.
fn build(
    cfg: &Dict,
    request: &TrialRequest,
    device: Device,
    bench: &Bench,
    report: &mut TrialReport,
) -> Result<Trainee, Stop> {
    if request.mode == RunMode::Infer {
        let model = cfg.get("model").and_then(crate::config::Value::as_dict);
        model.map_or(
            Ok(()),
            crate::models::segmentors::inference::check_inference,
        )?;
    }
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        EncoderDecoder::build(cfg, device)
    }));
    let mut model = match built {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return Err(e.into()),
        Err(panic) => return Err(Stop::Panicked(panic)),
    };
    model.set_preprocessor_size(request.crop);
    report.set_params(&model);
    report.bytes_after_model_build = bench.counter.current() - bench.base;
    let mut optim_cfg = OptimCfg::from_cfg(cfg)?;
    if let Some(n) = request.accumulative_counts {
        optim_cfg.accumulative_counts = n;
    }
    report.optimizer = optim_cfg.type_name.clone();
    report.accumulative_counts = optim_cfg.accumulative_counts;
    let optimizer = OptimWrapper::new(optim_cfg, &model.params, request.amp);
    Ok(Trainee { model, optimizer })
}

/// What the PyTorch release and the CUDA stand-in change in the step: the
/// release's softmax and zero_grad, and on `--as-cuda` CUDA's autocast
/// rules, fp16's GradScaler, foreach optimizers and mmcv's CUDA ops.
fn emulate_release(
    request: &TrialRequest,
    device: Device,
    optimizer: &mut OptimWrapper,
) -> Result<(), Stop> {
    let torch = request.setup.torch;
    if torch != TorchVersion::NEWEST && device != Device::Cpu {
        return Err(TrialError::OlderTorchOnGpu { torch }.into());
    }
    if torch.has(Switch::SoftmaxKeepsInput) {
        crate::models::layers::emulate_softmax_saving_input(|input, output| {
            memory::hold_until_freed(input, output)
                .expect("softmax outputs are counted CPU tensors");
        });
    }
    if torch.has(Switch::InplaceHardtanhSavesResult) {
        crate::models::layers::emulate_hardtanh_saving_result();
    }
    if request.setup.mmcv.has(MmcvSwitch::HSwishComposite) {
        crate::models::layers::emulate_mmcv_hswish_composite();
    }
    if torch.has(Switch::ZeroGradKeepsGradients) {
        optimizer.zero_grad_in_place(true);
    }
    if request.amp != Amp::Off && !request.as_cuda {
        // The CPU's own autocast rules: a fork server registered CUDA's
        // ahead (`worker::fork_server`); without autocast it is never read.
        memory::autocast_cuda_policy(false)?;
    }
    if !request.as_cuda {
        return Ok(());
    }
    if device != Device::Cpu {
        return Err(TrialError::AsCudaOnCuda.into());
    }
    if request.amp != Amp::Off {
        memory::autocast_cuda_policy(true).and_then(|()| memory::autocast_cuda_release(torch))?;
    }
    if request.amp == Amp::Fp16 {
        optimizer.use_grad_scaler();
    }
    if torch.has(Switch::ForeachOptimizersOnCuda) {
        optimizer.use_foreach();
    }
    crate::models::layers::emulate_mmcv_cuda_ops();
    Ok(())
}

/// The warm-up and measured steps, each recorded in `report`; returns the
/// last step's log items (mmengine keeps them alive into the next step).
fn run_steps(
    request: &TrialRequest,
    trainee: &mut Trainee,
    bench: &Bench,
    report: &mut TrialReport,
) -> Result<Vec<(String, Tensor)>, Stop> {
    let (counter, base) = (bench.counter, bench.base);
    let mut previous_items: Vec<(String, Tensor)> = Vec::new();
    for step in 0..request.warmup_steps + request.measured_steps {
        counter.set_phase_code(phase_code(step + 1, Phase::Data));
        let batch = Batch::synthetic(
            request,
            trainee.model.num_classes,
            trainee.model.ignore_index,
            trainee.model.takes_pixel_values(),
            // GenerateEdge is a step of the training pipeline only.
            trainee
                .model
                .edge_maps
                .filter(|_| request.mode == RunMode::Train),
        );
        counter.set_phase_code(phase_code(step + 1, Phase::Setup));
        if step == 0 {
            report.batch_bytes = batch.bytes();
            report.bytes_before_step1 = counter.current() - base;
        }
        let (record, items) = one_step(request, trainee, bench, batch, step, report)?;
        previous_items = items;
        let loss = record.loss;
        report.push_step(record);
        if request.mode == RunMode::Train && loss.is_none_or(|l| !l.is_finite()) {
            return Err(Stop::Failed(
                TrialStatus::NonFiniteLoss,
                format!("the loss is {loss:?} at step {}", step + 1),
            ));
        }
    }
    Ok(previous_items)
}

/// One step (`step` counts from 0): its peaks per phase, time and loss;
/// its FLOPs go into `report`.
fn one_step(
    request: &TrialRequest,
    trainee: &mut Trainee,
    bench: &Bench,
    batch: Batch,
    step: usize,
    report: &mut TrialReport,
) -> Result<(StepRecord, Vec<(String, Tensor)>), Stop> {
    let (counter, base) = (bench.counter, bench.base);
    let before = counter.current() - base;
    if let Some(i) = bench.cuda_index {
        let _ = memory::device_synchronize(i);
        let _ = memory::device_reset_peak(i);
    }
    counter.reset_peak();
    let _ = crate::models::layers::take_forward_flops();
    let _ = crate::models::layers::checkpoint::take_recompute_flops();
    let started = Instant::now();
    let clock = StepClock::new(counter, base, step + 1);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match request.mode {
        RunMode::Train => train_step(
            &trainee.model,
            &mut trainee.optimizer,
            batch,
            request,
            clock,
        ),
        RunMode::Infer => super::infer::infer_step(&trainee.model, batch, request, clock),
    }));
    if let Some(i) = bench.cuda_index {
        let _ = memory::device_synchronize(i);
    }
    report.forward_flops = crate::models::layers::take_forward_flops();
    report.recompute_flops = crate::models::layers::checkpoint::take_recompute_flops();
    let seconds = started.elapsed().as_secs_f64();
    counter.set_phase_code(phase_code(step + 1, Phase::Setup));
    let (peaks, items) = match result {
        Ok(Ok(v)) => v,
        Ok(Err(error)) => return Err(error.into()),
        Err(panic) => {
            bench.switches.cap(0);
            return Err(Stop::Panicked(panic));
        }
    };
    let loss = items
        .iter()
        .find(|(n, _)| n.contains("loss"))
        .map(|(_, v)| v.double_value(&[]));
    let mut record = StepRecord {
        step: step + 1,
        measured: step >= request.warmup_steps,
        seconds,
        bytes_before: before,
        peak_bytes: peaks.max(),
        bytes_after: counter.current() - base,
        forward_peak: peaks.forward,
        backward_peak: peaks.backward,
        optimizer_peak: peaks.optimizer,
        loss,
        cuda: None,
    };
    if let Some(i) = bench.cuda_index {
        record.cuda = memory::device_stats(i).ok();
    }
    Ok((record, items))
}

/// After the steps: the switches restored, the op-level trace's notes, the
/// allocation trace and kernel calls, the optimizer's state.
fn collect_traces(
    request: &TrialRequest,
    trainee: Trainee,
    bench: Bench,
    report: &mut TrialReport,
) -> Result<(), Stop> {
    let Bench {
        counter, switches, ..
    } = bench;
    let recorded_calls = (request.trace_out.is_some() && request.op_trace != memory::OpTrace::Off)
        .then(super::kernel_calls::take)
        .transpose()?;
    drop(switches);
    if request.op_trace == memory::OpTrace::Meta {
        report.meta_ops_on_cpu = memory::op_trace_unsupported()
            .map(|names| names.split(',').map(str::to_string).collect())
            .unwrap_or_default();
        report.meta_stand_ins = memory::op_trace_stand_ins();
    }
    if request.trace_out.is_some() {
        counter.trace(false);
        report.trace = Some(counter.take_trace());
        report.model_scopes = crate::models::scope::names();
    }
    if let Some((calls, work)) = recorded_calls {
        report.kernel_calls = calls;
        report.op_work = work;
    }
    report.optimizer_state_bytes = trainee.optimizer.state_bytes();
    Ok(())
}

fn bf16_supported(device: Device) -> bool {
    // bf16 autocast on CUDA needs compute capability >= 8.0; probe it by a tiny matmul.
    std::panic::catch_unwind(|| {
        let a = Tensor::ones([2, 2], (Kind::BFloat16, device));
        let _ = a.matmul(&a);
    })
    .is_ok()
}

/// The counter as one step sees it: its phase codes and its peak over the
/// counter's base.
pub(super) struct StepClock<'a> {
    counter: &'a CpuCounter,
    base: i64,
    step: usize,
}

impl<'a> StepClock<'a> {
    pub fn new(counter: &'a CpuCounter, base: i64, step: usize) -> StepClock<'a> {
        StepClock {
            counter,
            base,
            step,
        }
    }

    /// Marks the allocations from here on as the step's `phase`.
    pub fn enter(&self, phase: Phase) {
        self.counter.set_phase_code(phase_code(self.step, phase));
    }

    /// The peak since the last reset, over the base.
    pub fn peak(&self) -> i64 {
        self.counter.peak() - self.base
    }

    pub fn reset_peak(&self) {
        self.counter.reset_peak();
    }
}

/// A step's peak (bytes over the counter's base) in each of its phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhasePeaks {
    pub forward: i64,
    pub backward: i64,
    pub optimizer: i64,
}

impl PhasePeaks {
    /// The step's peak: the largest of its phases'.
    pub fn max(&self) -> i64 {
        self.forward.max(self.backward).max(self.optimizer)
    }
}

/// The step's autocast, if it runs in half precision (on the CPU standing
/// in for CUDA, half precision is held as bf16: the same two bytes).
pub(super) fn autocast(
    request: &TrialRequest,
    device: Device,
) -> Result<Option<memory::AutocastGuard>, ShimError> {
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
    clock: StepClock,
) -> Result<(PhasePeaks, Vec<(String, Tensor)>), TrialError> {
    let Batch {
        images,
        labels,
        edges,
    } = batch;
    let device = model.device();
    clock.enter(Phase::Forward);
    let (inputs, padded_labels, padded_edges, losses) = {
        let _autocast = autocast(request, device)?;
        clock.enter(Phase::Preprocess);
        let (inputs, padded_labels, padded_edges) =
            model.preprocess_with_edges(&images, &labels, &edges);
        clock.enter(Phase::Forward);
        let items = model.loss_with_edges(&inputs, &padded_labels, &padded_edges);
        (inputs, padded_labels, padded_edges, items)
    };
    let losses = crate::models::parse_losses(losses);
    let forward_peak = clock.peak();
    clock.reset_peak();
    clock.enter(Phase::Backward);
    optimizer.backward(&losses.loss);
    let backward_peak = clock.peak();
    clock.reset_peak();
    clock.enter(Phase::Optimizer);
    optimizer.step_if_due()?;
    let optimizer_peak = clock.peak();
    let items = losses.items;
    drop(losses.loss);
    drop(inputs);
    drop(padded_labels);
    drop(padded_edges);
    drop(images);
    drop(labels);
    drop(edges);
    Ok((
        PhasePeaks {
            forward: forward_peak,
            backward: backward_peak,
            optimizer: optimizer_peak,
        },
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
fn check_host_memory(request: &TrialRequest) -> Result<(), TrialError> {
    let (h, w) = request.crop;
    let pixels = (request.batch_size as u128) * (h as u128) * (w as u128);
    // 3 fp32 channels + one int64 label per pixel.
    let input_bytes = pixels * (3 * 4 + 8);
    let Some((total, _)) = host_memory() else {
        return Ok(());
    };
    if input_bytes > total as u128 / 2 {
        return Err(TrialError::BatchExceedsHost {
            batch_size: request.batch_size,
            crop: (h, w),
            input_bytes,
            host_bytes: total as u128,
        });
    }
    Ok(())
}
