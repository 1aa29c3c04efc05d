//! Gradient checkpointing: `torch.utils.checkpoint.checkpoint(f, x)` as
//! MMSeg's blocks call it under `with_cp=True` (the reentrant variant, the
//! default of torch 2.11 when `use_reentrant` is not passed).
//!
//! Chen et al., "Training Deep Nets with Sublinear Memory Cost",
//! arXiv:1604.06174.
//!
//! tch has no custom autograd functions, so the function itself lives in
//! the C++ shim (`CheckpointFunction` in `src/trial/shim.cpp`): its forward
//! runs the block without grad and keeps only the block's input and the CPU
//! RNG state; its backward re-runs the block with grad (same RNG and
//! autocast state, so drop path draws the same masks) and back-propagates
//! through the recomputed graph. The block is the Rust closure given here.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use tch::Tensor;
use torch_sys::C_tensor;

type BlockRun = unsafe extern "C" fn(
    block: *mut c_void,
    inputs: *const *const C_tensor,
    n: usize,
    recompute: c_int,
) -> *mut C_tensor;
type BlockRelease = unsafe extern "C" fn(block: *mut c_void);

extern "C" {
    fn segtune_checkpoint(
        inputs: *const *const C_tensor,
        n: usize,
        block: *mut c_void,
        run: BlockRun,
        release: BlockRelease,
    ) -> *mut C_tensor;
    fn segtune_block_set_error(message: *const c_char);
    fn segtune_last_error() -> *const c_char;
}

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
    // SAFETY: `block` is the `Box<Block>` that `checkpoint_inputs` leaked,
    // alive until `release_block`; `inputs` are `n` live tensors the shim owns.
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
    // SAFETY: the pointer `checkpoint` leaked, released once by the shim.
    drop(unsafe { Box::from_raw(block as *mut Block) });
}

/// mmseg's `if self.with_cp and x.requires_grad: x = cp.checkpoint(f, x)
/// else: x = f(x)`: `block(input)`, through [`checkpoint`] when `with_cp`
/// and the input requires grad.
pub fn checkpoint_if<'a>(
    with_cp: bool,
    input: &Tensor,
    block: impl Fn(&Tensor) -> Tensor + 'a,
) -> Tensor {
    if with_cp && input.requires_grad() {
        checkpoint(input, block)
    } else {
        block(input)
    }
}

/// `cp.checkpoint(block, input)`: `block(input)` whose intermediate tensors
/// are not kept for backward but recomputed there.
///
/// `block` may borrow the model: it runs during this call and once more
/// during the backward of the step, while the model is alive (a trial keeps
/// its model for all its steps). If the graph is dropped without a
/// backward, the closure is leaked, never called.
pub fn checkpoint<'a>(input: &Tensor, block: impl Fn(&Tensor) -> Tensor + 'a) -> Tensor {
    checkpoint_inputs(std::slice::from_ref(input), move |inputs: &[Tensor]| {
        block(&inputs[0])
    })
}

/// `cp.checkpoint(block, *inputs)`: [`checkpoint`] of a block of several
/// tensors, each of which gets its gradient.
pub fn checkpoint_inputs<'a>(
    inputs: &[Tensor],
    block: impl Fn(&[Tensor]) -> Tensor + 'a,
) -> Tensor {
    let boxed: Box<Block<'a>> = Box::new(Box::new(block));
    // SAFETY: see above: the closure is only called while what it borrows lives.
    let boxed: Box<Block<'static>> = unsafe { std::mem::transmute(boxed) };
    let raw = Box::into_raw(boxed) as *mut c_void;
    let pointers: Vec<*const C_tensor> = inputs.iter().map(|t| t.as_ptr()).collect();
    // SAFETY: live inputs; the shim owns `raw` from here on.
    let out = unsafe {
        segtune_checkpoint(
            pointers.as_ptr(),
            pointers.len(),
            raw,
            run_block,
            release_block,
        )
    };
    if out.is_null() {
        let why = unsafe { std::ffi::CStr::from_ptr(segtune_last_error()) }.to_string_lossy();
        panic!("gradient checkpointing failed: {why}");
    }
    // SAFETY: a new heap tensor from the shim, now owned here.
    unsafe { Tensor::from_ptr(out) }
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
