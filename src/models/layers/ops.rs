//! ATen ops whose tch binding lacks arguments MMSeg passes, called
//! through the C++ shim (`src/trial/shim.cpp`).

use std::ffi::CStr;
use tch::Tensor;

extern "C" {
    fn segtune_histc(
        s: *const torch_sys::C_tensor,
        bins: i64,
        min: f64,
        max: f64,
    ) -> *mut torch_sys::C_tensor;
    fn segtune_last_error() -> *const std::ffi::c_char;
}

/// `t.histc(bins, min, max)` (tch's `histc` takes `bins` only).
pub fn histc(t: &Tensor, bins: i64, min: f64, max: f64) -> Tensor {
    // SAFETY: the shim returns a new heap tensor (or null on error), which
    // tch then owns.
    let p = unsafe { segtune_histc(t.as_ptr(), bins, min, max) };
    if p.is_null() {
        panic!(
            "{}",
            unsafe { CStr::from_ptr(segtune_last_error()) }.to_string_lossy()
        );
    }
    unsafe { Tensor::from_ptr(p) }
}
