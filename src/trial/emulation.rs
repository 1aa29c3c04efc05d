//! The process-wide switches a trial turns on to trace or emulate what it
//! measures: the shim's op-level trace, its record of kernel calls, the
//! model layers' shape-only mode of a meta trace, and the CPU counter's cap.
//! [`Switches`] turns each on and restores it when dropped, so that no
//! early return of a trial (an error, a panic caught as a report) leaves
//! one on for whatever runs next in the process.

use super::memory::{self, CpuCounter, OpTrace};
use crate::shim::ffi::ShimError;

/// The switches a trial has turned on; see the module doc.
pub struct Switches<'a> {
    counter: &'a CpuCounter,
    op_trace: bool,
    kernel_calls: bool,
    shape_only: bool,
}

impl<'a> Switches<'a> {
    /// Nothing on yet; the counter's cap is lifted when dropped.
    pub fn new(counter: &'a CpuCounter) -> Switches<'a> {
        Switches {
            counter,
            op_trace: false,
            kernel_calls: false,
            shape_only: false,
        }
    }

    /// Traces every ATen op's outputs (`Cpu` or `Meta` kernels).
    pub fn trace_ops(&mut self, mode: OpTrace) -> Result<(), ShimError> {
        memory::set_op_trace(mode)?;
        self.op_trace = mode != OpTrace::Off;
        Ok(())
    }

    /// Records the calls of the ops whose CUDA kernels take scratch.
    pub fn record_kernel_calls(&mut self) -> Result<(), ShimError> {
        super::kernel_calls::record(true)?;
        self.kernel_calls = true;
        Ok(())
    }

    /// A meta trace's values cannot be read: the layers that would read
    /// them take `classes` per synthetic label map instead.
    pub fn shape_only(&mut self, classes: i64) {
        crate::models::layers::host::set_shape_only_segments(Some(classes));
        self.shape_only = true;
    }

    /// Caps the counted CPU tensors at `bytes` (absolute, as the counter
    /// reads them).
    pub fn cap(&self, bytes: i64) {
        self.counter.set_cap(bytes);
    }
}

impl Drop for Switches<'_> {
    fn drop(&mut self) {
        self.counter.set_cap(0);
        if self.shape_only {
            crate::models::layers::host::set_shape_only_segments(None);
        }
        if self.op_trace {
            let _ = memory::set_op_trace(OpTrace::Off);
        }
        if self.kernel_calls {
            let _ = super::kernel_calls::record(false);
        }
    }
}
