//! The building blocks MMSeg models are made of, each calling the same ATen
//! ops, with the same views and copies, as the PyTorch/mmcv module it
//! reproduces: so that libtorch allocates, saves for backward and frees
//! exactly what the Python model does.
//!
//! One file per kind of block: [`conv`] (`nn.Conv2d`, mmcv's `ConvModule`),
//! [`activation`] (mmcv's Hardswish, HSigmoid, Sigmoid), [`inverted_residual`]
//! (MobileNetV3's `InvertedResidualV3` and `SELayer`),
//! [`norm`] (`nn.LayerNorm`, `nn.BatchNorm2d`), [`basic_block`] and [`ppm`]
//! (the residual blocks and pyramid pooling of DDRNet and PIDNet), [`linear`], [`attention`], [`ms_deform_attn`] (mmcv's
//! `MultiScaleDeformableAttention`), [`positional_encoding`] (mmdet's sine
//! encoding), [`self_attention_block`] (MMSeg's `SelfAttentionBlock`),
//! (`nn.MultiheadAttention`), [`drop`] (mmcv's `DropPath`), [`embed`] (mmseg's `PatchEmbed`), [`ffn`] (mmcv's `FFN`), [`checkpoint`]
//! (`torch.utils.checkpoint`), [`shape`]
//! (mmseg's `nlc_to_nchw`/`nchw_to_nlc` and `resize`), [`host`] (tensors
//! from host data), [`ops`] (ATen ops through the shim). This file holds what
//! every block reports to: the softmax-input emulation and the FLOP count.

pub mod activation;
pub mod attention;
pub mod basic_block;
pub mod checkpoint;
pub mod conv;
pub mod drop;
pub mod embed;
pub mod ffn;
pub mod host;
pub mod inverted_residual;
pub mod linear;
pub mod ms_deform_attn;
pub mod norm;
pub mod ops;
pub mod positional_encoding;
pub mod ppm;
pub mod self_attention_block;
pub mod shape;

pub use attention::MultiheadAttention;
pub use checkpoint::{checkpoint, checkpoint_if, checkpoint_inputs};
pub use conv::{Conv2d, ConvModule, ConvSpec, ConvTranspose2d, DepthwiseSeparableConvModule};
pub use drop::{dropout, linspace_drop_path_rates, DropPath};
pub use embed::{corner_padding, PatchEmbed, PatchPadding};
pub use ffn::{Ffn, FfnActivation};
pub use linear::Linear;
pub use norm::{normalize, BatchNorm2d, ConvNorm, GroupNorm, LayerNorm, LayerNormCfg};
pub use shape::{channel_layer_norm, nchw_to_nlc, nlc_to_nchw, resize_bilinear};

use std::cell::Cell;
use std::sync::OnceLock;
use tch::Tensor;

/// Keeps a softmax's input alive as long as its output (see
/// [`emulate_softmax_saving_input`]).
type KeepInputHook = fn(input: &Tensor, output: &Tensor);

static SOFTMAX_KEEPS_INPUT: OnceLock<KeepInputHook> = OnceLock::new();

/// Makes `softmax` and `log_softmax` keep their input for backward next to
/// their output, as autograd did up to PyTorch 1.10 (pytorch/pytorch#64000,
/// fixed in 1.11): what MMSeg's model-zoo memory figures were measured with.
/// `hook` ties the input's lifetime to the output's. Process-wide; PyTorch
/// 2.x behaviour (output only) is the default.
pub fn emulate_softmax_saving_input(hook: KeepInputHook) {
    let _ = SOFTMAX_KEEPS_INPUT.set(hook);
}

static HARDTANH_SAVES_RESULT: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Makes in-place `hardtanh_` (mmcv's `ReLU6(inplace=True)`) save its
/// result for backward, as autograd did up to PyTorch 1.9
/// (`HardtanhBackward1`); from 1.10 it saves a copy of its input, one more
/// activation per ReLU6. Process-wide; the 1.10+ behaviour is the default.
pub fn emulate_hardtanh_saving_result() {
    HARDTANH_SAVES_RESULT.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// `x.relu6_()` as the PyTorch release being reproduced saves it: from
/// 1.10 (and in libtorch 2.11) `hardtanh_` keeps a copy of `x` for its
/// backward; up to 1.9 it kept its result, which the next layer keeps
/// anyway. The emulation is `relu_` (which saves its result) followed by
/// the clamp at 6 on the storage outside autograd: the same values and the
/// same saved tensors, a gradient that differs above 6 only (a prediction
/// trace never trains).
pub fn relu6_(x: &mut Tensor) {
    if HARDTANH_SAVES_RESULT.load(std::sync::atomic::Ordering::Relaxed) {
        let _ = x.relu_();
        let _ = x.data().clamp_max_(6.0);
    } else {
        let _ = x.relu6_();
    }
}

static MMCV_HSWISH_COMPOSITE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Makes `HSwish` mmcv's own module of releases before 1.4.5,
/// `x * ReLU6(x + 3) / 6` with the ReLU6 in place, instead of
/// `nn.Hardswish(inplace=True)`: it keeps `x` and `ReLU6(x + 3)` for backward
/// (and from PyTorch 1.10 ReLU6's copy of `x + 3`). Process-wide.
pub fn emulate_mmcv_hswish_composite() {
    MMCV_HSWISH_COMPOSITE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `HSwish` is mmcv's composite (see [`emulate_mmcv_hswish_composite`]).
pub fn mmcv_hswish_composite() -> bool {
    MMCV_HSWISH_COMPOSITE.load(std::sync::atomic::Ordering::Relaxed)
}

static MMCV_CUDA_OPS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes the ops mmcv runs as compiled CUDA kernels on a GPU (today
/// `MultiScaleDeformableAttnFunction`) keep for backward what those kernels
/// keep, instead of the tensors of mmcv's PyTorch fallback: for a CPU trial
/// that stands in for a CUDA run (`--as-cuda`). Process-wide.
pub fn emulate_mmcv_cuda_ops() {
    MMCV_CUDA_OPS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether mmcv's CUDA ops are emulated (see [`emulate_mmcv_cuda_ops`]).
pub fn mmcv_cuda_ops() -> bool {
    MMCV_CUDA_OPS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether softmax inputs are being kept (see [`emulate_softmax_saving_input`]).
pub fn softmax_keeps_input() -> bool {
    SOFTMAX_KEEPS_INPUT.get().is_some()
}

/// Called after every softmax / log_softmax whose backward may run.
pub fn softmax_saved(input: &Tensor, output: &Tensor) {
    if let Some(hook) = SOFTMAX_KEEPS_INPUT.get() {
        if input.requires_grad() {
            hook(input, output);
        }
    }
}

thread_local! {
    static FORWARD_FLOPS: Cell<f64> = const { Cell::new(0.0) };
}

/// Adds to the forward FLOP count of the current thread (multiply-adds
/// count two). Blocks outside `layers` that multiply matrices themselves
/// (window attention) count theirs here too.
pub fn count_flops(flops: f64) {
    FORWARD_FLOPS.with(|f| f.set(f.get() + flops));
}

/// Takes (and resets) the forward FLOPs counted by convolutions, linear
/// layers and attention matmuls on this thread.
pub fn take_forward_flops() -> f64 {
    FORWARD_FLOPS.with(|f| f.replace(0.0))
}
