//! The one seam between Rust and the C++ shim (`src/shim/shim*.cpp`): every
//! function the shim exports, declared once here and once in the C header
//! `src/shim/segtune_ffi.h` (in the same order), and [`ShimError`], what a
//! failed call reports. The safe wrappers live with their users
//! (`trial::memory`, `trial::kernel_calls`, `models::layers::ops`,
//! `models::layers::checkpoint`); the one function Rust exports to the shim,
//! `segtune_building_host_data`, lives in `models::layers::host`.
//!
//! Conventions (the header's): a function returning `c_int` returns 0, or -1
//! with its error's text for [`last_error`]; one returning a tensor returns
//! null on error, likewise, or else a new heap tensor the caller owns.

use std::ffi::{c_char, c_int, c_void, CStr};
use torch_sys::C_tensor;

/// A call into the shim that failed, with the C++ exception's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ShimError {
    /// The shim function that failed (`segtune_device_stats`, ...).
    pub call: &'static str,
    /// Its error text (`segtune_last_error`).
    pub message: String,
}

impl ShimError {
    /// The error `call` just left on this thread.
    pub fn last(call: &'static str) -> ShimError {
        ShimError {
            call,
            message: last_error(),
        }
    }
}

/// `Ok` for a status of 0, else [`ShimError::last`] of `call`.
pub fn check(rc: c_int, call: &'static str) -> Result<(), ShimError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(ShimError::last(call))
    }
}

/// A tensor the shim returned (now owned here), or its error as
/// [`ShimError::last`] of `call` for a null pointer.
///
/// # Safety
/// `p` is what `call` just returned: null, or a new heap tensor that
/// nothing else owns.
pub unsafe fn owned_tensor(p: *mut C_tensor, call: &'static str) -> Result<tch::Tensor, ShimError> {
    if p.is_null() {
        return Err(ShimError::last(call));
    }
    // SAFETY: as the caller promises.
    Ok(unsafe { tch::Tensor::from_ptr(p) })
}

/// The text of this thread's last failed shim call.
pub fn last_error() -> String {
    // SAFETY: the shim returns a pointer to a thread-local, NUL-terminated
    // string, valid until this thread's next call into the shim.
    unsafe { CStr::from_ptr(segtune_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A string the shim keeps (until the next call of its kind), copied.
///
/// # Safety
/// `p` is a NUL-terminated string the shim returned, still alive.
pub unsafe fn shim_string(p: *const c_char) -> String {
    // SAFETY: as the caller promises.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// One allocator event as the shim writes it (`SegtuneTraceEvent`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct RawTraceEvent {
    pub id: u64,
    pub bytes: i64,
    pub phase: u32,
    pub scope: u32,
}

/// Statistics of the CUDA caching allocator for one device, as the shim
/// writes them (`SegtuneDeviceStats`) and the trial report carries them.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
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

/// Runs a checkpointed block on `n` inputs (`recompute`: 1 in the
/// backward's re-run): a new heap tensor, or null after
/// `segtune_block_set_error`.
pub type BlockRun = unsafe extern "C" fn(
    block: *mut c_void,
    inputs: *const *const C_tensor,
    n: usize,
    recompute: c_int,
) -> *mut C_tensor;

/// Drops a checkpointed block; the shim calls it once, when the graph node
/// holding the block goes.
pub type BlockRelease = unsafe extern "C" fn(block: *mut c_void);

extern "C" {
    // Errors.
    pub fn segtune_last_error() -> *const c_char;

    // The counting CPU allocator and its trace.
    pub fn segtune_cpu_alloc_install();
    pub fn segtune_cpu_alloc_current() -> i64;
    pub fn segtune_cpu_alloc_peak() -> i64;
    pub fn segtune_cpu_alloc_reset_peak();
    pub fn segtune_cpu_alloc_count() -> i64;
    pub fn segtune_cpu_alloc_set_cap(bytes: i64);
    pub fn segtune_cpu_alloc_set_phase(phase: u32);
    pub fn segtune_cpu_alloc_set_scope(scope: u32);
    pub fn segtune_cpu_alloc_trace(on: bool);
    pub fn segtune_cpu_alloc_trace_take(out: *mut RawTraceEvent, capacity: usize) -> usize;
    pub fn segtune_cpu_alloc_trace_len() -> usize;
    pub fn segtune_hold_until_freed(keep: *const C_tensor, until: *const C_tensor) -> c_int;

    // The device's caching allocator and CUDA settings.
    pub fn segtune_device_stats(device: c_int, out: *mut DeviceStats) -> c_int;
    pub fn segtune_device_reset_peak(device: c_int) -> c_int;
    pub fn segtune_device_empty_cache() -> c_int;
    pub fn segtune_device_synchronize(device: c_int) -> c_int;
    pub fn segtune_cuda_mem_info(
        device: c_int,
        free_bytes: *mut u64,
        total_bytes: *mut u64,
    ) -> c_int;
    pub fn segtune_cuda_allocator_settings(settings: *const c_char) -> c_int;
    pub fn segtune_cudnn_set_flags(benchmark: bool, deterministic: bool) -> c_int;

    // Autocast.
    pub fn segtune_autocast_enter(device_type: c_int, dtype: c_int) -> c_int;
    pub fn segtune_autocast_exit(device_type: c_int) -> c_int;
    pub fn segtune_autocast_cuda_policy(on: bool) -> c_int;
    pub fn segtune_autocast_cuda_release(
        unlisted: *const *const c_char,
        n_unlisted: c_int,
        gelu_fp32: bool,
        grid_sampler_fp32: bool,
    ) -> c_int;

    // Ops tch's bindings lack or call without an argument.
    pub fn segtune_addcmul_(
        s: *mut C_tensor,
        t1: *const C_tensor,
        t2: *const C_tensor,
        value: f64,
    ) -> c_int;
    pub fn segtune_addcdiv_(
        s: *mut C_tensor,
        t1: *const C_tensor,
        t2: *const C_tensor,
        value: f64,
    ) -> c_int;
    /// The total norm, or a negative value on error.
    pub fn segtune_clip_grad_norm_(
        grads: *const *mut C_tensor,
        n: usize,
        max_norm: f64,
        norm_type: f64,
    ) -> f64;
    pub fn segtune_fused_adam_(
        params: *const *mut C_tensor,
        grads: *const *mut C_tensor,
        exp_avgs: *const *mut C_tensor,
        exp_avg_sqs: *const *mut C_tensor,
        steps: *const *mut C_tensor,
        n: usize,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        decoupled: bool,
    ) -> c_int;
    pub fn segtune_amp_unscale_(
        grads: *const *mut C_tensor,
        n: usize,
        found_inf: *mut C_tensor,
        inv_scale: *const C_tensor,
    ) -> c_int;
    pub fn segtune_add_alpha_(s: *mut C_tensor, other: *const C_tensor, alpha: f64) -> c_int;
    pub fn segtune_add_alpha(
        s: *const C_tensor,
        other: *const C_tensor,
        alpha: f64,
    ) -> *mut C_tensor;
    pub fn segtune_histc(s: *const C_tensor, bins: i64, min: f64, max: f64) -> *mut C_tensor;
    pub fn segtune_grad_set_none(s: *mut C_tensor) -> c_int;
    pub fn segtune_psamask(
        input: *const C_tensor,
        collect: bool,
        h_mask: i64,
        w_mask: i64,
        values: bool,
    ) -> *mut C_tensor;

    // The op-level trace and its kernel calls.
    pub fn segtune_op_trace(mode: c_int) -> c_int;
    pub fn segtune_op_trace_stand_ins() -> i64;
    pub fn segtune_op_trace_unsupported() -> *const c_char;
    pub fn segtune_kernel_calls_record(ops: *const c_char) -> c_int;
    pub fn segtune_kernel_calls_take() -> *const c_char;

    // Gradient checkpointing.
    pub fn segtune_block_set_error(message: *const c_char);
    pub fn segtune_checkpoint(
        inputs: *const *const C_tensor,
        n: usize,
        block: *mut c_void,
        run: BlockRun,
        release: BlockRelease,
    ) -> *mut C_tensor;
}
