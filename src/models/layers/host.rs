//! Tensors built from host data (`Tensor::from_slice`, `Tensor::from(x)`).
//!
//! tch writes such data straight into the new tensor's bytes. While a step
//! is traced on meta kernels (`trial::memory::OpTrace::Meta`) a new tensor
//! has no bytes, so these are built with the op-level trace stepping aside
//! on this thread: real, small CPU tensors, counted as plain allocations in
//! every kind of trace alike (a CUDA run allocates them too). The trace's
//! fallback (`src/shim/shim.cpp`) asks [`segtune_building_host_data`]
//! (declared for C in `src/shim/segtune_ffi.h`);
//! the flag lives here, in Rust, so that code which never traces (the
//! `segtune` binary) does not link the shim and libtorch for it.

use std::cell::Cell;
use tch::Tensor;

thread_local! {
    static BUILDING_HOST_DATA: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is building a tensor from host data (read by the
/// op-level trace's fallback, which then runs the op untraced).
#[no_mangle]
pub extern "C" fn segtune_building_host_data() -> bool {
    BUILDING_HOST_DATA.with(Cell::get)
}

fn outside_op_trace<T>(f: impl FnOnce() -> T) -> T {
    let before = BUILDING_HOST_DATA.with(|b| b.replace(true));
    let out = f();
    BUILDING_HOST_DATA.with(|b| b.set(before));
    out
}

/// `torch.tensor(data)`: a 1-D tensor of `data`.
pub fn from_host<T: tch::kind::Element>(data: &[T]) -> Tensor {
    outside_op_trace(|| Tensor::from_slice(data))
}

/// `torch.tensor(value)`: a 0-dim tensor.
pub fn scalar_from_host<T: tch::kind::Element>(value: T) -> Tensor {
    outside_op_trace(|| Tensor::from_slice(&[value]).view([]))
}

thread_local! {
    static SHAPE_ONLY_SEGMENTS: Cell<Option<i64>> = const { Cell::new(None) };
}

/// Declares (with `Some(segments)`) that this thread's step runs on a
/// shape-only trace: tensor values cannot be read, and each synthetic label
/// map holds `segments` classes. Code whose shapes depend on values
/// (Mask2Former's ground-truth segments and matching) then takes them from
/// here. `None` ends it.
pub fn set_shape_only_segments(segments: Option<i64>) {
    SHAPE_ONLY_SEGMENTS.with(|s| s.set(segments));
}

/// Whether tensor values cannot be read on this thread (see
/// [`set_shape_only_segments`]).
pub fn values_unavailable() -> bool {
    SHAPE_ONLY_SEGMENTS.with(Cell::get).is_some()
}

/// The classes per synthetic label map of a shape-only trace.
pub fn shape_only_segments() -> Option<i64> {
    SHAPE_ONLY_SEGMENTS.with(Cell::get)
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
