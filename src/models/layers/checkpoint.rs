//! Gradient checkpointing: `torch.utils.checkpoint.checkpoint(f, x)` as
//! MMSeg's blocks call it under `with_cp=True` (the reentrant variant, the
//! default of torch 2.11 when `use_reentrant` is not passed).
//!
//! Chen et al., "Training Deep Nets with Sublinear Memory Cost",
//! arXiv:1604.06174.
//!
//! tch has no custom autograd functions, so the function itself lives in
//! the C++ shim (`CheckpointFunction` in `src/shim/shim_checkpoint.cpp`,
//! called through `crate::shim::ffi`): its forward
//! runs the block without grad and keeps only the block's input and the CPU
//! RNG state; its backward re-runs the block with grad (same RNG and
//! autocast state, so drop path draws the same masks) and back-propagates
//! through the recomputed graph. The block is the Rust closure given here,
//! owned by the shim's graph node from then on and dropped through its
//! release callback.

use crate::shim::ffi::{self, segtune_block_set_error, segtune_checkpoint};
use std::cell::Cell;
use std::ffi::{c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use tch::Tensor;
use torch_sys::C_tensor;

type Block<'a> = Box<dyn Fn(&[Tensor]) -> Tensor + 'a>;

thread_local! {
    static RECOMPUTE_FLOPS: Cell<f64> = const { Cell::new(0.0) };
}

/// Takes (and resets) the FLOPs of this thread's recomputations, which
/// are kept out of the forward FLOP count (`layers::take_forward_flops`).
pub fn take_recompute_flops() -> f64 {
    RECOMPUTE_FLOPS.with(|f| f.replace(0.0))
}

unsafe extern "C" fn run_block(
    block: *mut c_void,
    inputs: *const *const C_tensor,
    n: usize,
    recompute: c_int,
) -> *mut C_tensor {
    // SAFETY: `block` is the `Box<Block>` that `checkpoint_block` handed
    // over, alive until `release_block`; `inputs` are `n` live tensors the
    // shim owns.
    let f = unsafe { &*(block as *const Block) };
    let inputs: Vec<Tensor> = (0..n)
        .map(|i| unsafe { Tensor::clone_from_ptr(*inputs.add(i) as *mut C_tensor) })
        .collect();
    let forward_flops = super::take_forward_flops();
    let result = catch_unwind(AssertUnwindSafe(|| f(&inputs)));
    let block_flops = super::take_forward_flops();
    super::count_flops(forward_flops);
    if recompute != 0 {
        RECOMPUTE_FLOPS.with(|f| f.set(f.get() + block_flops));
    } else {
        super::count_flops(block_flops);
    }
    match result {
        Ok(mut out) => {
            let p = out.as_mut_ptr();
            // The shim takes the heap tensor over (and deletes it).
            std::mem::forget(out);
            p
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
            unsafe { segtune_block_set_error(message.as_ptr()) };
            std::ptr::null_mut()
        }
    }
}

unsafe extern "C" fn release_block(block: *mut c_void) {
    // SAFETY: the pointer `checkpoint_block` handed over, released once by
    // the shim (after the backward, or with a graph that never ran one).
    drop(unsafe { Box::from_raw(block as *mut Block) });
}

/// mmseg's `if self.with_cp and x.requires_grad: x = cp.checkpoint(f, x)
/// else: x = f(x)`: `block(input)`, through [`checkpoint`] when `with_cp`
/// and the input requires grad.
///
/// `block` may borrow the model; see [`checkpoint`] for what that asks.
///
/// # Safety
/// As [`checkpoint`]'s, when `with_cp` and `input` requires a gradient.
pub unsafe fn checkpoint_if<'a>(
    with_cp: bool,
    input: &Tensor,
    block: impl Fn(&Tensor) -> Tensor + 'a,
) -> Tensor {
    if with_cp && input.requires_grad() {
        // SAFETY: the caller's, as this function's.
        unsafe { checkpoint(input, block) }
    } else {
        block(input)
    }
}

/// `cp.checkpoint(block, input)`: `block(input)` whose intermediate tensors
/// are not kept for backward but recomputed there.
///
/// # Safety
/// `block` runs during this call and once more during the backward through
/// the returned tensor, and is dropped after that backward (or with the
/// graph, if none runs): whatever it borrows must outlive both, i.e. the
/// returned tensor's graph. A trial's model, kept for all its steps, does.
pub unsafe fn checkpoint<'a>(input: &Tensor, block: impl Fn(&Tensor) -> Tensor + 'a) -> Tensor {
    let block: Block<'a> = Box::new(move |inputs: &[Tensor]| block(&inputs[0]));
    // SAFETY: the caller keeps what the block borrows alive as long as the
    // graph that may call or drop it.
    let block: Block<'static> = unsafe { std::mem::transmute(block) };
    checkpoint_block(std::slice::from_ref(input), block)
}

/// `cp.checkpoint(block, *inputs)`: [`checkpoint`] of a block of several
/// tensors, each of which gets its gradient. The block owns what it uses,
/// so the graph may keep it as long as it likes.
pub fn checkpoint_inputs(
    inputs: &[Tensor],
    block: impl Fn(&[Tensor]) -> Tensor + 'static,
) -> Tensor {
    checkpoint_block(inputs, Box::new(block))
}

/// Hands `block` over to the shim's checkpoint function, which owns it from
/// here on and drops it through [`release_block`].
fn checkpoint_block(inputs: &[Tensor], block: Block<'static>) -> Tensor {
    let raw = Box::into_raw(Box::new(block)) as *mut c_void;
    let pointers: Vec<*const C_tensor> = inputs.iter().map(|t| t.as_ptr()).collect();
    // SAFETY: live inputs; `raw` is a `Box<Block>` whose ownership passes
    // to the shim, with the two callbacks that use and release it.
    let out = unsafe {
        segtune_checkpoint(
            pointers.as_ptr(),
            pointers.len(),
            raw,
            run_block,
            release_block,
        )
    };
    // SAFETY: `out` is what the call just returned.
    match unsafe { ffi::owned_tensor(out, "segtune_checkpoint") } {
        Ok(tensor) => tensor,
        Err(e) => panic!("gradient checkpointing failed: {e}"),
    }
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
