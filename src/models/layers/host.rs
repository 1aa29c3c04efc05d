//! Tensors built from host data (`Tensor::from_slice`, `Tensor::from(x)`).
//!
//! tch writes such data straight into the new tensor's bytes. While a step
//! is traced on meta kernels (`trial::memory::OpTrace::Meta`) a new tensor
//! has no bytes, so these are built with the op-level trace suspended on
//! this thread: real, small CPU tensors, counted as plain allocations in
//! every kind of trace alike (a CUDA run allocates them too).

use tch::Tensor;

extern "C" {
    // In the trial shim (`src/trial/shim.cpp`); a no-op when no op-level
    // trace is running.
    fn segtune_op_trace_resume(on: bool) -> std::os::raw::c_int;
}

fn outside_op_trace<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: plain calls into the shim, which only set a thread-local flag.
    unsafe { segtune_op_trace_resume(false) };
    let out = f();
    unsafe { segtune_op_trace_resume(true) };
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
