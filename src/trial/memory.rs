//! Memory measurement through the C++ shim (`shim.cpp`): a counting CPU
//! allocator installed in libtorch (current and peak bytes, an optional trace
//! of every allocation and free, an optional cap that raises out-of-memory),
//! and the CUDA caching allocator's statistics via `at::accelerator`: the
//! safe side of `crate::shim::ffi`'s declarations.

pub use crate::shim::ffi::DeviceStats;
use crate::shim::ffi::{self, check, ShimError};
use std::os::raw::c_int;

pub use crate::trial::trace::{Phase, TraceEvent};

/// What a trace counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpTrace {
    /// Every allocation of the CPU allocator, kernel scratch included.
    #[default]
    Off,
    /// The storages each ATen op returns (below autograd), CPU kernels.
    Cpu,
    /// The same, with meta kernels: no compute, no host memory for tensors.
    Meta,
}

crate::named::named_enum!(OpTrace, "a trace level", {
    Off => "off",
    Cpu => "cpu",
    Meta => "meta",
});

/// Switches op-level tracing (see `shim.cpp`) on this thread.
pub fn set_op_trace(mode: OpTrace) -> Result<(), ShimError> {
    let code = match mode {
        OpTrace::Off => 0,
        OpTrace::Cpu => 1,
        OpTrace::Meta => 2,
    };
    // SAFETY: plain call into the shim.
    check(unsafe { ffi::segtune_op_trace(code) }, "segtune_op_trace")
}

/// Sets `torch.backends.cudnn.benchmark` and `.deterministic`.
pub fn set_cudnn_flags(benchmark: bool, deterministic: bool) -> Result<(), ShimError> {
    // SAFETY: plain call into the shim.
    check(
        unsafe { ffi::segtune_cudnn_set_flags(benchmark, deterministic) },
        "segtune_cudnn_set_flags",
    )
}

/// `cudaMemGetInfo` of a CUDA device: (free, total) bytes.
pub fn cuda_mem_info(device: usize) -> Result<(u64, u64), ShimError> {
    let (mut free, mut total) = (0u64, 0u64);
    // SAFETY: the shim writes the two counts through the pointers.
    check(
        unsafe { ffi::segtune_cuda_mem_info(device as c_int, &mut free, &mut total) },
        "segtune_cuda_mem_info",
    )?;
    Ok((free, total))
}

/// Applies caching-allocator settings (`PYTORCH_CUDA_ALLOC_CONF` syntax)
/// at run time, as `torch._C._accelerator_setAllocatorSettings` does.
pub fn set_cuda_allocator_settings(settings: &str) -> Result<(), ShimError> {
    const CALL: &str = "segtune_cuda_allocator_settings";
    let c = std::ffi::CString::new(settings).map_err(|e| ShimError {
        call: CALL,
        message: e.to_string(),
    })?;
    // SAFETY: a NUL-terminated string the shim only reads.
    check(
        unsafe { ffi::segtune_cuda_allocator_settings(c.as_ptr()) },
        CALL,
    )
}

/// The caching allocator's share of a device that a `--vram` budget
/// leaves it: the budget less the CUDA context, over the device's total
/// memory (`per_process_memory_fraction`, what
/// `torch.cuda.set_per_process_memory_fraction` sets). `None` where the
/// device has no more than that anyway.
pub fn memory_fraction(
    budget: u64,
    total: u64,
    context: u64,
) -> Result<Option<f64>, BudgetBelowContext> {
    if budget <= context {
        return Err(BudgetBelowContext { budget, context });
    }
    let cap = budget - context;
    if cap >= total.saturating_sub(context) {
        return Ok(None);
    }
    Ok(Some(cap as f64 / total as f64))
}

/// How many data-dependent values (`.item()`) a meta trace stood in for.
pub fn op_trace_stand_ins() -> i64 {
    // SAFETY: plain call into the shim.
    unsafe { ffi::segtune_op_trace_stand_ins() }
}

/// The first op a meta trace could not run, if any.
pub fn op_trace_unsupported() -> Option<String> {
    // SAFETY: the shim returns a NUL-terminated string it keeps alive.
    let name = unsafe { ffi::shim_string(ffi::segtune_op_trace_unsupported()) };
    (!name.is_empty()).then_some(name)
}

/// A `--vram` budget no larger than the device's CUDA context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "--vram {:.2} GiB leaves nothing after this device's CUDA context ({:.2} GiB)",
    gib(.budget),
    gib(.context)
)]
pub struct BudgetBelowContext {
    pub budget: u64,
    pub context: u64,
}

fn gib(bytes: &u64) -> f64 {
    *bytes as f64 / (1u64 << 30) as f64
}

/// The counting CPU allocator. Installing it is process-wide and permanent;
/// tensors allocated before installation are not counted.
pub struct CpuCounter;

impl CpuCounter {
    pub fn install() -> CpuCounter {
        // SAFETY: plain calls into the shim; installation is idempotent.
        unsafe { ffi::segtune_cpu_alloc_install() };
        CpuCounter
    }
    pub fn current(&self) -> i64 {
        unsafe { ffi::segtune_cpu_alloc_current() }
    }
    pub fn peak(&self) -> i64 {
        unsafe { ffi::segtune_cpu_alloc_peak() }
    }
    /// Sets the peak to the current count.
    pub fn reset_peak(&self) {
        unsafe { ffi::segtune_cpu_alloc_reset_peak() }
    }
    pub fn allocations(&self) -> i64 {
        unsafe { ffi::segtune_cpu_alloc_count() }
    }
    /// Makes any allocation that would exceed `bytes` live bytes fail with
    /// an out-of-memory error (0 removes the cap).
    pub fn set_cap(&self, bytes: i64) {
        unsafe { ffi::segtune_cpu_alloc_set_cap(bytes) }
    }
    /// Tags the following trace events (see `trial::phase_code`).
    pub fn set_phase_code(&self, code: u32) {
        unsafe { ffi::segtune_cpu_alloc_set_phase(code) }
    }
    /// Tags the following trace events with the model part running
    /// (`models::scope` tells each change once this is called).
    pub fn tag_model_scopes(&self) {
        fn set_scope(id: u32) {
            unsafe { ffi::segtune_cpu_alloc_set_scope(id) }
        }
        crate::models::scope::set_hook(set_scope);
    }
    pub fn trace(&self, on: bool) {
        unsafe { ffi::segtune_cpu_alloc_trace(on) }
    }
    /// Takes every trace event recorded so far.
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        // SAFETY: plain call into the shim.
        let n = unsafe { ffi::segtune_cpu_alloc_trace_len() };
        let mut raw = vec![ffi::RawTraceEvent::default(); n];
        // SAFETY: `raw` has room for `n` events.
        let got = unsafe { ffi::segtune_cpu_alloc_trace_take(raw.as_mut_ptr(), n) };
        raw.truncate(got);
        raw.into_iter()
            .map(|e| TraceEvent {
                id: e.id,
                bytes: e.bytes,
                phase: e.phase,
                scope: e.scope,
            })
            .collect()
    }
}

/// The bytes held plus the bytes asked for when the counting allocator's
/// cap refused an allocation, read from its message (see `shim.cpp`).
pub fn cap_failure_bytes(message: &str) -> Option<u64> {
    let rest = message
        .split("segtune allocation cap: out of memory. Tried to allocate ")
        .nth(1)?;
    let mut words = rest.split_whitespace();
    let asked: u64 = words.next()?.parse().ok()?;
    let in_use: u64 = words.nth(2)?.parse().ok()?;
    Some(asked.saturating_add(in_use))
}

pub fn device_stats(device: usize) -> Result<DeviceStats, ShimError> {
    let mut stats = DeviceStats::default();
    // SAFETY: the shim writes the statistics through the pointer.
    check(
        unsafe { ffi::segtune_device_stats(device as c_int, &mut stats) },
        "segtune_device_stats",
    )?;
    Ok(stats)
}

pub fn device_reset_peak(device: usize) -> Result<(), ShimError> {
    // SAFETY: plain call into the shim.
    check(
        unsafe { ffi::segtune_device_reset_peak(device as c_int) },
        "segtune_device_reset_peak",
    )
}

pub fn device_empty_cache() -> Result<(), ShimError> {
    // SAFETY: plain call into the shim.
    check(
        unsafe { ffi::segtune_device_empty_cache() },
        "segtune_device_empty_cache",
    )
}

pub fn device_synchronize(device: usize) -> Result<(), ShimError> {
    // SAFETY: plain call into the shim.
    check(
        unsafe { ffi::segtune_device_synchronize(device as c_int) },
        "segtune_device_synchronize",
    )
}

/// c10's `ScalarType` number of a kind.
fn scalar_type(kind: tch::Kind) -> c_int {
    match kind {
        tch::Kind::Half => 5,
        tch::Kind::Float => 6,
        tch::Kind::Double => 7,
        tch::Kind::BFloat16 => 15,
        other => panic!("autocast to {other:?} is not a floating-point kind"),
    }
}

/// Autocast on `device` (CPU or CUDA) to `dtype` while the guard lives, as
/// `torch.autocast` does (weight-cast cache cleared on exit).
pub struct AutocastGuard {
    device_type: c_int,
}

impl AutocastGuard {
    pub fn new(device: tch::Device, dtype: tch::Kind) -> Result<AutocastGuard, ShimError> {
        let device_type = if device.is_cuda() { 1 } else { 0 };
        // SAFETY: plain call into the shim.
        check(
            unsafe { ffi::segtune_autocast_enter(device_type, scalar_type(dtype)) },
            "segtune_autocast_enter",
        )?;
        Ok(AutocastGuard { device_type })
    }
}

/// With [`autocast_cuda_policy`] on: CUDA autocast as `torch` had it
/// (its lists, from `autocast_lists.rs`) instead of 2.11's.
pub fn autocast_cuda_release(torch: crate::kinds::TorchVersion) -> Result<(), ShimError> {
    use super::autocast_lists::{fp32_in_release, unlisted_in};
    let names: Vec<std::ffi::CString> = unlisted_in(torch)
        .into_iter()
        .map(|n| std::ffi::CString::new(n).expect("op names have no NUL"))
        .collect();
    let pointers: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let fp32 = fp32_in_release(torch);
    // SAFETY: `pointers` point into `names`, alive across the call; the
    // shim copies the names.
    check(
        unsafe {
            ffi::segtune_autocast_cuda_release(
                pointers.as_ptr(),
                pointers.len() as c_int,
                fp32.contains(&"aten::gelu"),
                fp32.contains(&"aten::grid_sampler"),
            )
        },
        "segtune_autocast_cuda_release",
    )
}

/// While on, CPU autocast casts as CUDA's autocast does (CUDA's op lists
/// and rules; see `shim.cpp`), so that a CPU trace keeps the tensors a CUDA
/// run would keep in half precision. Process-wide.
pub fn autocast_cuda_policy(on: bool) -> Result<(), ShimError> {
    // SAFETY: a plain call; the shim registers or drops dispatcher kernels.
    check(
        unsafe { ffi::segtune_autocast_cuda_policy(on) },
        "segtune_autocast_cuda_policy",
    )
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        // SAFETY: plain call into the shim. A failure to leave autocast has
        // nowhere to go from a destructor.
        let _ = unsafe { ffi::segtune_autocast_exit(self.device_type) };
    }
}

/// `t.addcmul_(t1, t2, value=value)`.
pub fn addcmul_(t: &mut tch::Tensor, t1: &tch::Tensor, t2: &tch::Tensor, value: f64) {
    // SAFETY: tch tensors wrap `at::Tensor*`, which the shim takes as such.
    let rc = unsafe { ffi::segtune_addcmul_(t.as_mut_ptr(), t1.as_ptr(), t2.as_ptr(), value) };
    check(rc, "segtune_addcmul_").expect("addcmul_ on tensors of matching shapes");
}

/// `t.addcdiv_(t1, t2, value=value)`.
pub fn addcdiv_(t: &mut tch::Tensor, t1: &tch::Tensor, t2: &tch::Tensor, value: f64) {
    // SAFETY: as in `addcmul_`.
    let rc = unsafe { ffi::segtune_addcdiv_(t.as_mut_ptr(), t1.as_ptr(), t2.as_ptr(), value) };
    check(rc, "segtune_addcdiv_").expect("addcdiv_ on tensors of matching shapes");
}

/// The shim's pointers to `tensors`, live while they are.
fn pointers(tensors: &mut [tch::Tensor]) -> Vec<*mut torch_sys::C_tensor> {
    tensors.iter_mut().map(|t| t.as_mut_ptr()).collect()
}

/// `torch.nn.utils.clip_grad_norm_(grads, max_norm, norm_type)` (foreach path); returns the total norm.
pub fn clip_grad_norm_(
    grads: &mut [tch::Tensor],
    max_norm: f64,
    norm_type: f64,
) -> Result<f64, ShimError> {
    let ptrs = pointers(grads);
    // SAFETY: every pointer is a live tensor for the duration of the call.
    let total =
        unsafe { ffi::segtune_clip_grad_norm_(ptrs.as_ptr(), ptrs.len(), max_norm, norm_type) };
    if total < 0.0 {
        Err(ShimError::last("segtune_clip_grad_norm_"))
    } else {
        Ok(total)
    }
}

/// The tensors of one fused Adam(W) update, parameter by parameter.
pub struct FusedAdamLists<'a> {
    pub params: &'a mut [tch::Tensor],
    pub grads: &'a mut [tch::Tensor],
    pub exp_avgs: &'a mut [tch::Tensor],
    pub exp_avg_sqs: &'a mut [tch::Tensor],
    pub steps: &'a mut [tch::Tensor],
}

/// torch.optim's `_fused_adam` (`fused=True`) over one group:
/// `(lr, beta1, beta2, weight_decay, eps)`, decoupled weight decay for AdamW.
pub fn fused_adam_(
    lists: FusedAdamLists<'_>,
    hyper: (f64, f64, f64, f64, f64),
    decoupled: bool,
) -> Result<(), ShimError> {
    let n = lists.params.len();
    let (p, g, m, v, s) = (
        pointers(lists.params),
        pointers(lists.grads),
        pointers(lists.exp_avgs),
        pointers(lists.exp_avg_sqs),
        pointers(lists.steps),
    );
    let (lr, beta1, beta2, weight_decay, eps) = hyper;
    // SAFETY: every pointer is a live tensor for the duration of the call,
    // and the five lists have `n` entries each.
    let rc = unsafe {
        ffi::segtune_fused_adam_(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            s.as_ptr(),
            n,
            lr,
            beta1,
            beta2,
            weight_decay,
            eps,
            decoupled,
        )
    };
    check(rc, "segtune_fused_adam_")
}

/// `torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)`.
pub fn amp_unscale_(
    grads: &mut [tch::Tensor],
    found_inf: &mut tch::Tensor,
    inv_scale: &tch::Tensor,
) -> Result<(), ShimError> {
    let ptrs = pointers(grads);
    // SAFETY: as in `clip_grad_norm_`.
    let rc = unsafe {
        ffi::segtune_amp_unscale_(
            ptrs.as_ptr(),
            ptrs.len(),
            found_inf.as_mut_ptr(),
            inv_scale.as_ptr(),
        )
    };
    check(rc, "segtune_amp_unscale_")
}

/// `t.add_(other, alpha=alpha)`.
pub fn add_alpha_(t: &mut tch::Tensor, other: &tch::Tensor, alpha: f64) {
    // SAFETY: live tensors.
    let rc = unsafe { ffi::segtune_add_alpha_(t.as_mut_ptr(), other.as_ptr(), alpha) };
    check(rc, "segtune_add_alpha_").expect("add_ of matching shapes");
}

/// `t.add(other, alpha=alpha)`.
pub fn add_alpha(t: &tch::Tensor, other: &tch::Tensor, alpha: f64) -> tch::Tensor {
    // SAFETY: live tensors; the shim returns a new heap tensor or null.
    let p = unsafe { ffi::segtune_add_alpha(t.as_ptr(), other.as_ptr(), alpha) };
    // SAFETY: `p` is what the call just returned.
    unsafe { ffi::owned_tensor(p, "segtune_add_alpha") }.unwrap_or_else(|e| panic!("{e}"))
}

/// `param.grad = None`.
pub fn grad_set_none(t: &mut tch::Tensor) {
    // SAFETY: a live tensor.
    let rc = unsafe { ffi::segtune_grad_set_none(t.as_mut_ptr()) };
    check(rc, "segtune_grad_set_none").expect("clearing a gradient");
}

/// Keeps `keep` alive until the storage of `until` is freed (both counted
/// CPU tensors): what an autograd node that saved both would do.
pub fn hold_until_freed(keep: &tch::Tensor, until: &tch::Tensor) -> Result<(), ShimError> {
    // SAFETY: live tensors; the shim copies `keep` (a new reference).
    let rc = unsafe { ffi::segtune_hold_until_freed(keep.as_ptr(), until.as_ptr()) };
    check(rc, "segtune_hold_until_freed")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_cap_message_gives_what_the_step_asked_for() {
        let m = "segtune allocation cap: out of memory. Tried to allocate 409600 bytes with \
                 99825792 bytes in use and a cap of 100000000 bytes";
        assert_eq!(super::cap_failure_bytes(m), Some(409600 + 99825792));
        assert_eq!(super::cap_failure_bytes("CUDA out of memory"), None);
    }
}

#[cfg(test)]
mod vram_cap_tests {
    use super::memory_fraction;

    const GIB: u64 = 1 << 30;

    /// A 4 GB laptop budget on a 141 GB H200 with a 0.5 GiB context: the
    /// allocator may reserve 3.5 GiB of the 141.
    #[test]
    fn a_budget_below_the_card_caps_the_allocator_at_the_budget_less_the_context() {
        let total = 143_771_090_944; // H200 NVL, as cudaMemGetInfo reports it
        let f = memory_fraction(4 * GIB, total, GIB / 2).unwrap().unwrap();
        assert!((f * total as f64 - 3.5 * GIB as f64).abs() < 1.0, "{f}");
    }

    #[test]
    fn a_budget_at_or_above_the_card_sets_no_cap() {
        assert_eq!(memory_fraction(24 * GIB, 24 * GIB, GIB / 2), Ok(None));
        assert_eq!(memory_fraction(80 * GIB, 24 * GIB, GIB / 2), Ok(None));
    }

    #[test]
    fn a_budget_the_context_eats_is_refused_with_both_figures() {
        let e = memory_fraction(GIB / 4, 24 * GIB, GIB / 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.25 GiB") && e.contains("0.50 GiB"), "{e}");
    }
}
