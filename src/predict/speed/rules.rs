//! How each kernel of a step is timed on a card: the kernel classes, which
//! ATen op launches which (rules as data, [`OP_RULES`]), and the few
//! efficiencies fitted on public training logs ([`Efficiencies::FITTED`]).
//!
//! Every kernel costs a latency (its launch and the tail of its last wave:
//! a small kernel does not fill the card) plus its work at a fraction of
//! the card's peak: floating-point operations at the math rate of its data
//! type for GEMMs and convolutions (the larger of that and its bytes at the
//! memory bandwidth), bytes at the bandwidth for everything else
//! (elementwise, reductions, norms, softmax, interpolation, losses, copies,
//! casts: their roofline is the memory's). The sources of each rule:
//!
//! - tensor cores only where the data type and the card allow: fp16 on
//!   compute capability 7.0+, bf16 on 8.0+, TF32 for fp32 convolutions on
//!   8.0+ (`torch.backends.cudnn.allow_tf32`, True by default) but not for
//!   fp32 matmuls (`torch.backends.cuda.matmul.allow_tf32`, False by default
//!   since PyTorch 1.12); a card without tensor cores (Pascal) runs half
//!   precision GEMMs with fp32 arithmetic (cuBLAS/cuDNN `CUDNN_DATA_HALF`
//!   with fp32 compute): no faster than fp32;
//! - depthwise convolutions (`groups == channels`) run PyTorch's own
//!   `conv_depthwise2d` kernels or cuDNN's on CUDA cores: their bytes, not
//!   their FLOPs, bound them;
//! - `upsample_*_backward` accumulates with atomics
//!   (`UpSampleBilinear2d.cu`): [`Efficiencies::atomic_slowdown`] times its bytes;
//! - norm kernels: `native_batch_norm` reads its input twice (statistics,
//!   then the normalisation: `batch_norm_collect_statistics` and
//!   `batch_norm_transform_input`), its backward three passes; layer norm
//!   one pass forward, two backward (`layer_norm_kernel.cu`);
//! - the optimizer's per-parameter ops run as PyTorch's for-each kernels
//!   (`_multi_tensor_adamw`, `_multi_tensor_sgd`; `foreach=None` picks them
//!   on CUDA since PyTorch 2.0): one launch per op kind per
//!   `multi_tensor_apply` chunk ([`FOREACH_MAX_TENSORS`] tensors), one
//!   dispatch each;
//! - ops that launch nothing: views, `empty*`, `_local_scalar_dense` (a
//!   device-to-host copy that waits for the GPU: a synchronisation).

/// What a kernel is bound by, and how it is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum KernelClass {
    /// cuBLAS GEMMs (`mm`, `addmm`, `bmm`, `baddbmm`).
    Gemm,
    /// cuDNN convolutions, each direction.
    Conv,
    /// Depthwise convolutions: bytes-bound.
    DepthwiseConv,
    /// Elementwise, reductions, norms, softmax, losses, copies: bytes.
    Memory,
    /// Atomic-accumulating kernels (interpolation backward, index_put with
    /// accumulate, scatter_add): bytes, slower.
    Atomic,
    /// No kernel: a view, an allocation.
    None,
    /// Waits for the GPU: a scalar read back to the host.
    Sync,
}

/// One op's rule: its class, the kernels it launches, and how many times
/// its bytes pass through memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpRule {
    pub class: KernelClass,
    pub launches: u32,
    pub passes: f64,
}

const fn rule(class: KernelClass, launches: u32, passes: f64) -> OpRule {
    OpRule {
        class,
        launches,
        passes,
    }
}

/// The ops whose kernels differ from one memory-bound launch, by ATen name
/// (a name without an overload matches every overload). The GEMMs and
/// convolutions are timed by their recorded kernel calls.
pub const OP_RULES: &[(&str, OpRule)] = &[
    ("aten::native_batch_norm", rule(KernelClass::Memory, 2, 1.5)),
    (
        "aten::_native_batch_norm_legit",
        rule(KernelClass::Memory, 2, 1.5),
    ),
    (
        "aten::_native_batch_norm_legit_no_training",
        rule(KernelClass::Memory, 1, 1.0),
    ),
    (
        "aten::native_batch_norm_backward",
        rule(KernelClass::Memory, 2, 1.5),
    ),
    (
        "aten::native_layer_norm_backward",
        rule(KernelClass::Memory, 2, 1.3),
    ),
    (
        "aten::native_group_norm_backward",
        rule(KernelClass::Memory, 3, 1.3),
    ),
    ("aten::native_group_norm", rule(KernelClass::Memory, 2, 1.3)),
    (
        "aten::upsample_bilinear2d_backward",
        rule(KernelClass::Atomic, 2, 1.0),
    ),
    (
        "aten::upsample_nearest2d_backward",
        rule(KernelClass::Atomic, 2, 1.0),
    ),
    (
        "aten::_upsample_bilinear2d_aa_backward",
        rule(KernelClass::Atomic, 2, 1.0),
    ),
    (
        "aten::grid_sampler_2d_backward",
        rule(KernelClass::Atomic, 2, 1.0),
    ),
    ("aten::index_put_", rule(KernelClass::Atomic, 2, 1.0)),
    ("aten::_index_put_impl_", rule(KernelClass::Atomic, 2, 1.0)),
    ("aten::scatter_add_", rule(KernelClass::Atomic, 1, 1.0)),
    ("aten::index_add_", rule(KernelClass::Atomic, 1, 1.0)),
    (
        "aten::nll_loss2d_forward",
        rule(KernelClass::Memory, 1, 1.0),
    ),
    (
        "aten::nll_loss2d_backward",
        rule(KernelClass::Memory, 2, 1.0),
    ),
    ("aten::_local_scalar_dense", rule(KernelClass::Sync, 1, 0.0)),
    ("aten::item", rule(KernelClass::Sync, 1, 0.0)),
    ("aten::empty", rule(KernelClass::None, 0, 0.0)),
    ("aten::empty_strided", rule(KernelClass::None, 0, 0.0)),
    ("aten::empty_like", rule(KernelClass::None, 0, 0.0)),
    ("aten::new_empty", rule(KernelClass::None, 0, 0.0)),
    ("aten::new_empty_strided", rule(KernelClass::None, 0, 0.0)),
    ("aten::resize_", rule(KernelClass::None, 0, 0.0)),
    ("aten::set_", rule(KernelClass::None, 0, 0.0)),
    ("aten::lift_fresh", rule(KernelClass::None, 0, 0.0)),
    ("aten::_unsafe_view", rule(KernelClass::None, 0, 0.0)),
    ("aten::_reshape_alias", rule(KernelClass::None, 0, 0.0)),
    ("aten::detach", rule(KernelClass::None, 0, 0.0)),
    ("aten::alias", rule(KernelClass::None, 0, 0.0)),
    // Host-side random state and shapes: no device kernel of note.
    ("aten::randint", rule(KernelClass::Memory, 1, 1.0)),
];

/// The rule of `op` (`aten::add.Tensor`): its own, its name's without the
/// overload, or one memory-bound launch.
pub fn rule_of(op: &str) -> OpRule {
    let base = op.split_once('.').map_or(op, |(name, _)| name);
    OP_RULES
        .iter()
        .find(|(name, _)| *name == op || *name == base)
        .map_or(rule(KernelClass::Memory, 1, 1.0), |(_, r)| *r)
}

/// The most tensors of one list a `multi_tensor_apply` launch takes
/// (`depth_to_max_tensors` in ATen's `MultiTensorApply.cuh`: 110, 64, 48,
/// 36 and 30 for 1 to 5 lists; AdamW's update passes 4 lists).
pub const FOREACH_MAX_TENSORS: usize = 36;

/// The elements one `multi_tensor_apply` launch covers at most
/// (`kChunkSize` 65536 x `depth_to_max_blocks` 320).
pub const FOREACH_MAX_ELEMENTS: f64 = 65536.0 * 320.0;

/// The few efficiencies of the model, fitted on public logs (see
/// `docs/speed.md`, "Fit"), never per config.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Efficiencies {
    /// Host time per ATen op of the forward (Python, module hooks, the
    /// dispatcher, autograd recording the graph), seconds.
    pub forward_dispatch_s: f64,
    /// Host time per op of the backward (the C++ autograd engine).
    pub backward_dispatch_s: f64,
    /// Host time per view or allocation (no kernel).
    pub view_dispatch_s: f64,
    /// Device time per kernel before its work: the launch and the tail of
    /// its last wave.
    pub kernel_latency_s: f64,
    /// Fraction of the tensor cores' dense peak a large GEMM or
    /// convolution reaches.
    pub tensor_core: f64,
    /// Fraction of the fp32 CUDA cores' peak.
    pub cuda_core: f64,
    /// Fraction of the memory bandwidth a large memory-bound kernel reaches.
    pub bandwidth: f64,
    /// How much slower than its bytes an atomic-accumulating kernel runs.
    pub atomic_slowdown: f64,
    /// A convolution's backward directions against its forward (cuDNN's
    /// wgrad/dgrad kernels reach less of the peak).
    pub conv_backward: f64,
    /// How much faster than implicit GEMM cuDNN's Winograd kernels run a
    /// 3x3 convolution on CUDA cores (F(4x4, 3x3) does a quarter of the
    /// multiplies, plus its transforms: 1.6x to 2.5x on the timed shapes of
    /// `kernels/cudnn_speed.rs`).
    pub winograd: f64,
    /// The L2 cache's bandwidth against DRAM's, for the bytes of a
    /// memory-bound kernel that fit in it (Ada's 32-72 MB, A100's 40 MB
    /// hold a small step's activations).
    pub l2: f64,
}

impl Efficiencies {
    /// The figures `scripts/speed-fit` fitted on the fitting part of
    /// `tests/fixtures/mmseg_log_times.tsv` (the held-out part is
    /// reported on, never fitted).
    pub const FITTED: Efficiencies = Efficiencies {
        forward_dispatch_s: 43.8e-6,
        backward_dispatch_s: 4.2e-6,
        view_dispatch_s: 4e-6,
        // At the fit's bound (2-15 us): with the dispatch it stands for
        // every per-kernel cost (launch, tail, the allocator's calls).
        kernel_latency_s: 15e-6,
        tensor_core: 0.475,
        // At the fit's bound (0.95): cuDNN's fp32 kernels beyond implicit
        // GEMM (Winograd beyond 3x3, FFT) that the rules do not credit.
        cuda_core: 0.95,
        bandwidth: 0.402,
        // At the fit's bound (6).
        atomic_slowdown: 6.0,
        conv_backward: 1.126,
        winograd: 1.276,
        l2: 1.0,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_by_full_name_or_name() {
        assert_eq!(rule_of("aten::add.Tensor").class, KernelClass::Memory);
        assert_eq!(
            rule_of("aten::_local_scalar_dense").class,
            KernelClass::Sync
        );
        assert_eq!(
            rule_of("aten::empty.memory_format").class,
            KernelClass::None
        );
        assert_eq!(
            rule_of("aten::upsample_bilinear2d_backward").class,
            KernelClass::Atomic
        );
    }
}
