//! Memory measurement through the C++ shim (`shim.cpp`): a counting CPU
//! allocator installed in libtorch (current and peak bytes, an optional trace
//! of every allocation and free, an optional cap that raises out-of-memory),
//! and the CUDA caching allocator's statistics via `at::accelerator`.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

pub use crate::trial::trace::{Phase, TraceEvent};

#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct RawDeviceStats {
    allocated_current: i64,
    allocated_peak: i64,
    reserved_current: i64,
    reserved_peak: i64,
    requested_peak: i64,
    num_alloc_retries: i64,
    num_ooms: i64,
    free_bytes: i64,
    total_bytes: i64,
}

extern "C" {
    fn segtune_cpu_alloc_install();
    fn segtune_cpu_alloc_current() -> i64;
    fn segtune_cpu_alloc_peak() -> i64;
    fn segtune_cpu_alloc_reset_peak();
    fn segtune_cpu_alloc_count() -> i64;
    fn segtune_cpu_alloc_set_cap(bytes: i64);
    fn segtune_cpu_alloc_set_phase(phase: u32);
    fn segtune_cpu_alloc_set_scope(scope: u32);
    fn segtune_cpu_alloc_trace(on: bool);
    fn segtune_cpu_alloc_trace_take(out: *mut TraceEvent, capacity: usize) -> usize;
    fn segtune_cpu_alloc_trace_len() -> usize;
    fn segtune_last_error() -> *const c_char;
    fn segtune_device_stats(device: c_int, out: *mut RawDeviceStats) -> c_int;
    fn segtune_device_reset_peak(device: c_int) -> c_int;
    fn segtune_device_empty_cache() -> c_int;
    fn segtune_device_synchronize(device: c_int) -> c_int;
    fn segtune_autocast_enter(device_type: c_int, dtype: c_int) -> c_int;
    fn segtune_autocast_exit(device_type: c_int) -> c_int;
    fn segtune_op_trace(mode: c_int) -> c_int;
    fn segtune_cudnn_set_flags(benchmark: bool, deterministic: bool) -> c_int;
    fn segtune_cuda_mem_info(device: c_int, free_bytes: *mut u64, total_bytes: *mut u64) -> c_int;
    fn segtune_cuda_allocator_settings(settings: *const c_char) -> c_int;
    fn segtune_op_trace_stand_ins() -> i64;
    fn segtune_op_trace_unsupported() -> *const c_char;
}

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
pub fn set_op_trace(mode: OpTrace) -> Result<(), String> {
    let code = match mode {
        OpTrace::Off => 0,
        OpTrace::Cpu => 1,
        OpTrace::Meta => 2,
    };
    // SAFETY: plain call into the shim.
    check(unsafe { segtune_op_trace(code) })
}

/// Sets `torch.backends.cudnn.benchmark` and `.deterministic`.
pub fn set_cudnn_flags(benchmark: bool, deterministic: bool) -> Result<(), String> {
    // SAFETY: plain call into the shim.
    check(unsafe { segtune_cudnn_set_flags(benchmark, deterministic) })
}

/// `cudaMemGetInfo` of a CUDA device: (free, total) bytes.
pub fn cuda_mem_info(device: usize) -> Result<(u64, u64), String> {
    let (mut free, mut total) = (0u64, 0u64);
    // SAFETY: the shim writes the two counts through the pointers.
    check(unsafe { segtune_cuda_mem_info(device as c_int, &mut free, &mut total) })?;
    Ok((free, total))
}

/// Applies caching-allocator settings (`PYTORCH_CUDA_ALLOC_CONF` syntax)
/// at run time, as `torch._C._accelerator_setAllocatorSettings` does.
pub fn set_cuda_allocator_settings(settings: &str) -> Result<(), String> {
    let c = std::ffi::CString::new(settings).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated string the shim only reads.
    check(unsafe { segtune_cuda_allocator_settings(c.as_ptr()) })
}

/// The caching allocator's share of a device that a `--vram` budget
/// leaves it: the budget less the CUDA context, over the device's total
/// memory (`per_process_memory_fraction`, what
/// `torch.cuda.set_per_process_memory_fraction` sets). `None` where the
/// device has no more than that anyway.
pub fn memory_fraction(budget: u64, total: u64, context: u64) -> Result<Option<f64>, String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if budget <= context {
        return Err(format!(
            "--vram {:.2} GiB leaves nothing after this device's CUDA context ({:.2} GiB)",
            gib(budget),
            gib(context)
        ));
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
    unsafe { segtune_op_trace_stand_ins() }
}

/// The first op a meta trace could not run, if any.
pub fn op_trace_unsupported() -> Option<String> {
    // SAFETY: the shim returns a NUL-terminated string it keeps alive.
    let name = unsafe { CStr::from_ptr(segtune_op_trace_unsupported()) }
        .to_string_lossy()
        .into_owned();
    (!name.is_empty()).then_some(name)
}

fn check(rc: c_int) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        // SAFETY: the shim returns a pointer to a thread-local, NUL-terminated string.
        Err(unsafe { CStr::from_ptr(segtune_last_error()) }
            .to_string_lossy()
            .into_owned())
    }
}

/// The counting CPU allocator. Installing it is process-wide and permanent;
/// tensors allocated before installation are not counted.
pub struct CpuCounter;

impl CpuCounter {
    pub fn install() -> CpuCounter {
        // SAFETY: plain calls into the shim; installation is idempotent.
        unsafe { segtune_cpu_alloc_install() };
        CpuCounter
    }
    pub fn current(&self) -> i64 {
        unsafe { segtune_cpu_alloc_current() }
    }
    pub fn peak(&self) -> i64 {
        unsafe { segtune_cpu_alloc_peak() }
    }
    /// Sets the peak to the current count.
    pub fn reset_peak(&self) {
        unsafe { segtune_cpu_alloc_reset_peak() }
    }
    pub fn allocations(&self) -> i64 {
        unsafe { segtune_cpu_alloc_count() }
    }
    /// Makes any allocation that would exceed `bytes` live bytes fail with
    /// an out-of-memory error (0 removes the cap).
    pub fn set_cap(&self, bytes: i64) {
        unsafe { segtune_cpu_alloc_set_cap(bytes) }
    }
    /// Tags the following trace events (see `trial::phase_code`).
    pub fn set_phase_code(&self, code: u32) {
        unsafe { segtune_cpu_alloc_set_phase(code) }
    }
    /// Tags the following trace events with the model part running
    /// (`models::scope` tells each change once this is called).
    pub fn tag_model_scopes(&self) {
        fn set_scope(id: u32) {
            unsafe { segtune_cpu_alloc_set_scope(id) }
        }
        crate::models::scope::set_hook(set_scope);
    }
    pub fn trace(&self, on: bool) {
        unsafe { segtune_cpu_alloc_trace(on) }
    }
    /// Takes every trace event recorded so far.
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        let n = unsafe { segtune_cpu_alloc_trace_len() };
        let mut out = vec![
            TraceEvent {
                id: 0,
                bytes: 0,
                phase: 0,
                scope: 0
            };
            n
        ];
        // SAFETY: `out` has room for `n` events.
        let got = unsafe { segtune_cpu_alloc_trace_take(out.as_mut_ptr(), n) };
        out.truncate(got);
        out
    }
}

/// Statistics of the CUDA caching allocator for one device.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct DeviceStats {
    pub allocated_current: i64,
    pub allocated_peak: i64,
    pub reserved_current: i64,
    pub reserved_peak: i64,
    pub requested_peak: i64,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
    pub free_bytes: i64,
    pub total_bytes: i64,
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

pub fn device_stats(device: usize) -> Result<DeviceStats, String> {
    let mut raw = RawDeviceStats::default();
    check(unsafe { segtune_device_stats(device as c_int, &mut raw) })?;
    Ok(DeviceStats {
        allocated_current: raw.allocated_current,
        allocated_peak: raw.allocated_peak,
        reserved_current: raw.reserved_current,
        reserved_peak: raw.reserved_peak,
        requested_peak: raw.requested_peak,
        num_alloc_retries: raw.num_alloc_retries,
        num_ooms: raw.num_ooms,
        free_bytes: raw.free_bytes,
        total_bytes: raw.total_bytes,
    })
}

pub fn device_reset_peak(device: usize) -> Result<(), String> {
    check(unsafe { segtune_device_reset_peak(device as c_int) })
}

pub fn device_empty_cache() -> Result<(), String> {
    check(unsafe { segtune_device_empty_cache() })
}

pub fn device_synchronize(device: usize) -> Result<(), String> {
    check(unsafe { segtune_device_synchronize(device as c_int) })
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
    pub fn new(device: tch::Device, dtype: tch::Kind) -> Result<AutocastGuard, String> {
        let device_type = if device.is_cuda() { 1 } else { 0 };
        check(unsafe { segtune_autocast_enter(device_type, scalar_type(dtype)) })?;
        Ok(AutocastGuard { device_type })
    }
}

extern "C" {
    fn segtune_autocast_cuda_policy(on: bool) -> c_int;
    fn segtune_autocast_cuda_release(
        unlisted: *const *const std::ffi::c_char,
        n_unlisted: c_int,
        gelu_fp32: bool,
        grid_sampler_fp32: bool,
    ) -> c_int;
}

/// With [`autocast_cuda_policy`] on: CUDA autocast as `torch` had it
/// (its lists, from `autocast_lists.rs`) instead of 2.11's.
pub fn autocast_cuda_release(torch: super::TorchVersion) -> Result<(), String> {
    use super::autocast_lists::{fp32_in_release, unlisted_in};
    let names: Vec<std::ffi::CString> = unlisted_in(torch)
        .into_iter()
        .map(|n| std::ffi::CString::new(n).expect("op names have no NUL"))
        .collect();
    let pointers: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let fp32 = fp32_in_release(torch);
    // SAFETY: `pointers` point into `names`, alive across the call; the
    // shim copies the names.
    check(unsafe {
        segtune_autocast_cuda_release(
            pointers.as_ptr(),
            pointers.len() as c_int,
            fp32.contains(&"aten::gelu"),
            fp32.contains(&"aten::grid_sampler"),
        )
    })
}

/// While on, CPU autocast casts as CUDA's autocast does (CUDA's op lists
/// and rules; see `shim.cpp`), so that a CPU trace keeps the tensors a CUDA
/// run would keep in half precision. Process-wide.
pub fn autocast_cuda_policy(on: bool) -> Result<(), String> {
    // SAFETY: a plain call; the shim registers or drops dispatcher kernels.
    check(unsafe { segtune_autocast_cuda_policy(on) })
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        let _ = check(unsafe { segtune_autocast_exit(self.device_type) });
    }
}

extern "C" {
    fn segtune_addcmul_(
        s: *mut torch_sys::C_tensor,
        t1: *const torch_sys::C_tensor,
        t2: *const torch_sys::C_tensor,
        value: f64,
    ) -> c_int;
    fn segtune_addcdiv_(
        s: *mut torch_sys::C_tensor,
        t1: *const torch_sys::C_tensor,
        t2: *const torch_sys::C_tensor,
        value: f64,
    ) -> c_int;
}

/// `t.addcmul_(t1, t2, value=value)`.
pub fn addcmul_(t: &mut tch::Tensor, t1: &tch::Tensor, t2: &tch::Tensor, value: f64) {
    // SAFETY: tch tensors wrap `at::Tensor*`, which the shim takes as such.
    let rc = unsafe { segtune_addcmul_(t.as_mut_ptr(), t1.as_ptr(), t2.as_ptr(), value) };
    check(rc).expect("addcmul_ on tensors of matching shapes");
}

/// `t.addcdiv_(t1, t2, value=value)`.
pub fn addcdiv_(t: &mut tch::Tensor, t1: &tch::Tensor, t2: &tch::Tensor, value: f64) {
    // SAFETY: as in `addcmul_`.
    let rc = unsafe { segtune_addcdiv_(t.as_mut_ptr(), t1.as_ptr(), t2.as_ptr(), value) };
    check(rc).expect("addcdiv_ on tensors of matching shapes");
}

extern "C" {
    fn segtune_clip_grad_norm_(
        grads: *const *mut torch_sys::C_tensor,
        n: usize,
        max_norm: f64,
        norm_type: f64,
    ) -> f64;
    fn segtune_amp_unscale_(
        grads: *const *mut torch_sys::C_tensor,
        n: usize,
        found_inf: *mut torch_sys::C_tensor,
        inv_scale: *const torch_sys::C_tensor,
    ) -> c_int;
}

/// `torch.nn.utils.clip_grad_norm_(grads, max_norm, norm_type)` (foreach path); returns the total norm.
pub fn clip_grad_norm_(
    grads: &mut [tch::Tensor],
    max_norm: f64,
    norm_type: f64,
) -> Result<f64, String> {
    let ptrs: Vec<*mut torch_sys::C_tensor> = grads.iter_mut().map(|g| g.as_mut_ptr()).collect();
    // SAFETY: every pointer is a live tensor for the duration of the call.
    let total = unsafe { segtune_clip_grad_norm_(ptrs.as_ptr(), ptrs.len(), max_norm, norm_type) };
    if total < 0.0 {
        Err(unsafe { CStr::from_ptr(segtune_last_error()) }
            .to_string_lossy()
            .into_owned())
    } else {
        Ok(total)
    }
}

extern "C" {
    fn segtune_fused_adam_(
        params: *const *mut torch_sys::C_tensor,
        grads: *const *mut torch_sys::C_tensor,
        exp_avgs: *const *mut torch_sys::C_tensor,
        exp_avg_sqs: *const *mut torch_sys::C_tensor,
        steps: *const *mut torch_sys::C_tensor,
        n: usize,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        decoupled: bool,
    ) -> c_int;
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
) -> Result<(), String> {
    let ptrs = |ts: &mut [tch::Tensor]| -> Vec<*mut torch_sys::C_tensor> {
        ts.iter_mut().map(|t| t.as_mut_ptr()).collect()
    };
    let n = lists.params.len();
    let (p, g, m, v, s) = (
        ptrs(lists.params),
        ptrs(lists.grads),
        ptrs(lists.exp_avgs),
        ptrs(lists.exp_avg_sqs),
        ptrs(lists.steps),
    );
    let (lr, beta1, beta2, weight_decay, eps) = hyper;
    // SAFETY: every pointer is a live tensor for the duration of the call,
    // and the five lists have `n` entries each.
    check(unsafe {
        segtune_fused_adam_(
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
    })
}

/// `torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)`.
pub fn amp_unscale_(
    grads: &mut [tch::Tensor],
    found_inf: &mut tch::Tensor,
    inv_scale: &tch::Tensor,
) -> Result<(), String> {
    let ptrs: Vec<*mut torch_sys::C_tensor> = grads.iter_mut().map(|g| g.as_mut_ptr()).collect();
    // SAFETY: as in `clip_grad_norm_`.
    check(unsafe {
        segtune_amp_unscale_(
            ptrs.as_ptr(),
            ptrs.len(),
            found_inf.as_mut_ptr(),
            inv_scale.as_ptr(),
        )
    })
}

extern "C" {
    fn segtune_add_alpha_(
        s: *mut torch_sys::C_tensor,
        other: *const torch_sys::C_tensor,
        alpha: f64,
    ) -> c_int;
    fn segtune_add_alpha(
        s: *const torch_sys::C_tensor,
        other: *const torch_sys::C_tensor,
        alpha: f64,
    ) -> *mut torch_sys::C_tensor;
    fn segtune_grad_set_none(s: *mut torch_sys::C_tensor) -> c_int;
}

/// `t.add_(other, alpha=alpha)`.
pub fn add_alpha_(t: &mut tch::Tensor, other: &tch::Tensor, alpha: f64) {
    // SAFETY: live tensors.
    check(unsafe { segtune_add_alpha_(t.as_mut_ptr(), other.as_ptr(), alpha) })
        .expect("add_ of matching shapes");
}

/// `t.add(other, alpha=alpha)`.
pub fn add_alpha(t: &tch::Tensor, other: &tch::Tensor, alpha: f64) -> tch::Tensor {
    // SAFETY: the shim returns a new heap tensor (or null on error), which tch then owns.
    let p = unsafe { segtune_add_alpha(t.as_ptr(), other.as_ptr(), alpha) };
    if p.is_null() {
        panic!(
            "{}",
            unsafe { CStr::from_ptr(segtune_last_error()) }.to_string_lossy()
        );
    }
    unsafe { tch::Tensor::from_ptr(p) }
}

/// `param.grad = None`.
pub fn grad_set_none(t: &mut tch::Tensor) {
    // SAFETY: a live tensor.
    check(unsafe { segtune_grad_set_none(t.as_mut_ptr()) }).expect("clearing a gradient");
}

extern "C" {
    fn segtune_hold_until_freed(
        keep: *const torch_sys::C_tensor,
        until: *const torch_sys::C_tensor,
    ) -> c_int;
}

/// Keeps `keep` alive until the storage of `until` is freed (both counted
/// CPU tensors): what an autograd node that saved both would do.
pub fn hold_until_freed(keep: &tch::Tensor, until: &tch::Tensor) -> Result<(), String> {
    // SAFETY: live tensors; the shim copies `keep` (a new reference).
    check(unsafe { segtune_hold_until_freed(keep.as_ptr(), until.as_ptr()) })
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
        let e = memory_fraction(GIB / 4, 24 * GIB, GIB / 2).unwrap_err();
        assert!(e.contains("0.25 GiB") && e.contains("0.50 GiB"), "{e}");
    }
}
