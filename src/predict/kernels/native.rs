//! Scratch memory ATen's own CUDA kernels take through the caching
//! allocator beyond their outputs, for the ops MMSeg's training steps run
//! (read from PyTorch's sources; the 2.11 headers and binary where the
//! release could be pinned, see docs/prediction.md):
//!
//! - reductions that split one output across blocks (`Reduce.cuh`,
//!   `gpu_reduce_kernel`: `buffer` of `ReduceConfig::global_memory_size()`
//!   and `semaphores` of `semaphore_size()`, freed when the kernel is
//!   launched): `sum`/`mean` over dimensions, e.g. a linear layer's bias
//!   gradient (`sum_to_size` over the tokens);
//! - `_softmax_backward_data` (`SoftMax.cu`, `softmax_backward_cuda_out`:
//!   `Tensor tmp = grad * output`): a gradient-sized temporary;
//! - a cuDNN convolution of a strided input: `input.contiguous(...)`;
//! - `binary_cross_entropy_with_logits` (`Loss.cpp`, a composite traced as
//!   one op): four input-sized temporaries up to PyTorch 2.2, one from 2.3.
//!
//! What the others take is outputs only (`nll_loss2d` with
//! `reduction='none'`, `log_softmax`, `upsample_bilinear2d` and its
//! backward, pooling, `cat`, the `_foreach_*` ops and the fused optimizers),
//! or less than 1 MiB (`nonzero`'s cub temporaries, group norm's [N, C]
//! buffers); cuDNN's batch-norm workspace and reserve are sized by cuDNN at
//! run time and not modelled.

use super::cudnn_speed::GpuMath;
use crate::trial::kernel_calls::{KernelCall, Layout};

/// `ReduceConfig` for a reduction, as `setReduceConfig` (PyTorch 2.11
/// `aten/src/ATen/native/cuda/Reduce.cuh`) sets it; returns the bytes of
/// the global staging buffer and of the semaphores (0, 0 when the kernel
/// reduces within blocks).
pub fn reduce_scratch(
    num_outputs: i64,
    inputs_per_output: i64,
    fastest: bool,
    num_reduce_dims: usize,
    accumulate_bytes: i64,
    gpu: &GpuMath,
) -> (u64, u64) {
    const MAX_THREADS: i64 = 512;
    const INPUT_VEC: i64 = 4;
    const OUTPUT_VEC: i64 = 4;
    const WARP: i64 = 32;
    fn last_pow2(n: i64) -> i64 {
        let mut n = n.max(1);
        n |= n >> 1;
        n |= n >> 2;
        n |= n >> 4;
        n |= n >> 8;
        n |= n >> 16;
        (n - (n >> 1)).max(1)
    }
    let div_up = |a: i64, b: i64| (a + b - 1) / b;
    let mut output_vec = 1;
    let (mut dim0, dim1) = if fastest {
        (inputs_per_output, num_outputs)
    } else {
        (num_outputs, inputs_per_output)
    };
    if fastest {
        if dim0 >= 128 && num_reduce_dims == 1 {
            dim0 /= INPUT_VEC;
        }
    } else {
        output_vec = OUTPUT_VEC;
        dim0 /= output_vec;
    }
    let max_threads = MAX_THREADS / output_vec;
    let d0 = if dim0 < max_threads {
        last_pow2(dim0)
    } else {
        max_threads
    };
    let d1 = if dim1 < max_threads {
        last_pow2(dim1)
    } else {
        max_threads
    };
    let mut block_width = d0.min(WARP);
    let block_height = d1.min(max_threads / block_width);
    block_width = d0.min(max_threads / block_height);
    let threads = block_width * block_height;
    let (mut step_input, mut step_output) = (1, 1);
    if fastest {
        step_input *= block_width;
    } else {
        step_output *= block_width;
    }
    let values_per_thread = div_up(inputs_per_output, step_input);
    let split_across_warps = values_per_thread >= (block_height * 16).min(256);
    if split_across_warps {
        step_input *= block_height;
    } else {
        step_output *= block_height;
    }
    let target_grid = gpu.sms * (gpu.max_threads_per_sm / threads.max(1));
    let grid_x = div_up(num_outputs / output_vec, step_output);
    let values_per_thread = div_up(inputs_per_output, step_input);
    if !(split_across_warps && values_per_thread >= 256 && grid_x <= target_grid) {
        return (0, 0);
    }
    let ctas = div_up(target_grid, grid_x)
        .min(div_up(values_per_thread, 16))
        .max(div_up(values_per_thread, 256));
    if ctas <= 1 {
        return (0, 0);
    }
    let mut global = accumulate_bytes * num_outputs * ctas;
    if !fastest {
        global *= block_width * output_vec;
    }
    (global.max(0) as u64, (4 * grid_x).max(0) as u64)
}

/// A reduction's shape from a contiguous input's sizes and the dimensions
/// reduced: (outputs, inputs per output, whether the innermost dimension is
/// reduced, the reduced groups after TensorIterator coalesces neighbours).
pub fn reduction_shape(sizes: &[i64], dims: &[i64]) -> (i64, i64, bool, usize) {
    let rank = sizes.len() as i64;
    let reduced = |i: usize| {
        dims.is_empty()
            || dims
                .iter()
                .any(|&d| (if d < 0 { d + rank } else { d }) == i as i64)
    };
    let (mut outputs, mut inputs) = (1i64, 1i64);
    let mut groups = 0;
    let mut previous: Option<bool> = None;
    for (i, &s) in sizes.iter().enumerate() {
        if s == 1 {
            continue;
        }
        let r = reduced(i);
        if r {
            inputs *= s;
            if previous != Some(true) {
                groups += 1;
            }
        } else {
            outputs *= s;
        }
        previous = Some(r);
    }
    let fastest = sizes
        .iter()
        .enumerate()
        .rev()
        .find(|(_, &s)| s != 1)
        .is_none_or(|(i, _)| reduced(i));
    (outputs, inputs, fastest, groups.max(1))
}

fn element_bytes(dtype: &str) -> u64 {
    match dtype {
        "f64" | "i64" => 8,
        "f32" | "i32" => 4,
        "f16" | "bf16" => 2,
        _ => 1,
    }
}

fn numel(sizes: &[i64]) -> u64 {
    sizes.iter().map(|&s| s.max(0) as u64).product()
}

/// The transient scratch of a native kernel call: (what, bytes) each,
/// allocated in order and freed when the op returns.
pub fn scratch(
    call: &KernelCall,
    gpu: &GpuMath,
    bce_with_logits_four_temporaries: bool,
) -> Vec<(&'static str, u64)> {
    match call.op.as_str() {
        "aten::sum.dim_IntList" | "aten::mean.dim" => {
            let Some((_, sizes, layout)) = call.tensor(0) else {
                return Vec::new();
            };
            if layout != Layout::Contiguous {
                return Vec::new();
            }
            let dims = call.ints(1).unwrap_or(&[]);
            let (outputs, inputs, fastest, groups) = reduction_shape(sizes, dims);
            let (buffer, semaphores) = reduce_scratch(outputs, inputs, fastest, groups, 4, gpu);
            [
                ("reduction staging buffer", buffer),
                ("reduction semaphores", semaphores),
            ]
            .into_iter()
            .filter(|(_, b)| *b > 0)
            .collect()
        }
        "aten::_softmax_backward_data" => match call.tensor(0) {
            Some((dtype, sizes, _)) => vec![(
                "softmax backward: grad * output",
                numel(sizes) * element_bytes(dtype),
            )],
            None => Vec::new(),
        },
        // A composite of ATen ops on every backend, traced as one op: its
        // temporaries live until the statement that makes the loss ends.
        // Up to 2.2: `max_val = (-input).clamp_min_(0)`, then
        // `(-max_val).exp_()`, `-input` and `-input - max_val` (C++
        // temporaries, freed at the end of the full expression); from 2.3
        // `log_sigmoid(input)` (its CUDA buffer is empty).
        "aten::binary_cross_entropy_with_logits" => match call.tensor(0) {
            Some((dtype, sizes, _)) => {
                let bytes = numel(sizes) * element_bytes(dtype);
                if bce_with_logits_four_temporaries {
                    vec![
                        ("BCE with logits: max_val", bytes),
                        ("BCE with logits: -max_val", bytes),
                        ("BCE with logits: -input", bytes),
                        ("BCE with logits: -input - max_val", bytes),
                    ]
                } else {
                    vec![("BCE with logits: log_sigmoid(input)", bytes)]
                }
            }
            None => Vec::new(),
        },
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> GpuMath {
        GpuMath::of_compute_capability("9.0")
    }

    #[test]
    fn full_and_innermost_reductions_take_next_to_nothing() {
        // loss.mean() over 8x512x512: KiB.
        let (outputs, inputs, fastest, groups) = reduction_shape(&[8, 512, 512], &[]);
        assert_eq!(
            (outputs, inputs, fastest, groups),
            (1, 8 * 512 * 512, true, 1)
        );
        let (b, s) = reduce_scratch(outputs, inputs, fastest, groups, 4, &h200());
        assert!(b < 8 << 10 && s <= 4, "{b} {s}");
        // per-channel over (0, 2, 3) of NCHW: N, then H*W coalesced.
        assert_eq!(
            reduction_shape(&[8, 64, 128, 128], &[0, 2, 3]),
            (64, 8 * 128 * 128, true, 2)
        );
    }

    #[test]
    fn a_column_reduction_of_a_tall_matrix_stages_per_block() {
        // A linear layer's bias gradient: [tokens, C].sum(0).
        let (outputs, inputs, fastest, groups) = reduction_shape(&[32768, 128], &[0]);
        assert_eq!((outputs, inputs, fastest), (128, 32768, false));
        let (b, _) = reduce_scratch(outputs, inputs, fastest, groups, 4, &h200());
        // setReduceConfig on 132 SMs: 512 ctas x 128 outputs x 4 B x block 32 x 4 lanes.
        assert_eq!(b, 32 << 20);
        // A short one reduces within blocks.
        let (outputs, inputs, fastest, groups) = reduction_shape(&[64, 128], &[0]);
        assert_eq!(
            reduce_scratch(outputs, inputs, fastest, groups, 4, &h200()),
            (0, 0)
        );
    }

    #[test]
    fn softmax_backward_takes_a_gradient_sized_temporary() {
        let call = KernelCall::from_line(
            "k 3 10 1 aten::_softmax_backward_data t:f32:2x1x16384x256 t:f32:2x1x16384x256 i:-1 ?",
        )
        .unwrap();
        assert_eq!(
            scratch(&call, &h200(), false),
            vec![("softmax backward: grad * output", 2 * 16384 * 256 * 4)]
        );
    }

    #[test]
    fn bce_with_logits_takes_four_input_sized_temporaries_up_to_2_2_and_one_after() {
        let call = KernelCall::from_line(
            "k 3 10 1 aten::binary_cross_entropy_with_logits t:f32:4x19x512x1024 t:f32:4x19x512x1024 ? ? i:0",
        )
        .unwrap();
        let logits = 4 * 19 * 512 * 1024 * 4;
        let old = scratch(&call, &h200(), true);
        assert_eq!(old.len(), 4);
        assert!(old.iter().all(|(_, b)| *b == logits));
        assert_eq!(
            scratch(&call, &h200(), false),
            vec![("BCE with logits: log_sigmoid(input)", logits)]
        );
    }
}
