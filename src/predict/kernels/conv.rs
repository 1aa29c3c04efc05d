//! A convolution of the trace as CUDA would run it: its shape (from the
//! recorded `aten::convolution` / `aten::convolution_backward` call), the
//! directions it runs (forward; backward data and backward filter as
//! autograd asks for them), and the backend PyTorch picks for it on CUDA
//! (`_select_conv_backend` in `aten/src/ATen/native/Convolution.cpp`): cuDNN,
//! or the native depthwise kernels, which take no workspace.

use crate::trial::kernel_calls::{KernelCall, Layout};

/// The element type of a convolution's tensors on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum DataType {
    F32,
    F16,
    Bf16,
    F64,
}

impl DataType {
    pub fn bytes(self) -> u64 {
        match self {
            DataType::F32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F64 => 8,
        }
    }

    /// The GPU type of a traced dtype. A trace standing in for CUDA holds
    /// half precision as bf16 (the same two bytes): under `--amp fp16` a
    /// bf16 tensor of the trace is an fp16 tensor on the GPU.
    pub fn of_traced(dtype: &str, half_is_fp16: bool) -> Option<DataType> {
        Some(match dtype {
            "f32" => DataType::F32,
            "f16" => DataType::F16,
            "bf16" if half_is_fp16 => DataType::F16,
            "bf16" => DataType::Bf16,
            "f64" => DataType::F64,
            _ => return None,
        })
    }
}

/// One of the three computations of a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Direction {
    Forward,
    /// The gradient of the input (`cudnnConvolutionBackwardData`).
    BackwardData,
    /// The gradient of the weight (`cudnnConvolutionBackwardFilter`).
    BackwardFilter,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Forward => "forward",
            Direction::BackwardData => "backward data",
            Direction::BackwardFilter => "backward filter",
        }
    }
}

/// A 2-d convolution as cuDNN sees it: `x` [n, c, h, w], `w` [k, c/groups,
/// r, s], `y` [n, k, ho, wo]. A transposed convolution is described by its
/// equivalent convolution (its output is `x`, its input `y`): its forward
/// is that convolution's backward data, and the other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ConvProblem {
    pub n: i64,
    pub c: i64,
    pub h: i64,
    pub w: i64,
    pub k: i64,
    pub r: i64,
    pub s: i64,
    pub ho: i64,
    pub wo: i64,
    pub stride: [i64; 2],
    pub pad: [i64; 2],
    pub dilation: [i64; 2],
    pub groups: i64,
    pub dtype: DataType,
    pub channels_last: bool,
}

impl ConvProblem {
    /// Multiply-adds x 2 of one direction (the same for all three).
    pub fn flops(&self) -> f64 {
        2.0 * (self.n * self.k * (self.c / self.groups) * self.r * self.s * self.ho * self.wo)
            as f64
    }
    pub fn is_depthwise(&self) -> bool {
        self.groups > 1 && self.groups == self.c && self.k % self.c == 0
    }
    pub fn is_dilated(&self) -> bool {
        self.dilation.iter().any(|&d| d != 1)
    }
    pub fn is_strided(&self) -> bool {
        self.stride.iter().any(|&d| d != 1)
    }
}

/// Which implementation PyTorch runs a CUDA convolution with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ConvBackend {
    Cudnn,
    /// `CudaDepthwise2d` (`DepthwiseConv2d.cu`): direct kernels, no workspace.
    CudaDepthwise2d,
}

/// `_select_conv_backend` for a CUDA 2-d convolution with cuDNN enabled:
/// a depthwise convolution runs cuDNN only when channels-last, or in fp16
/// NCHW undilated with at least 32 channels (`use_cudnn_depthwise`; its
/// shape check `check_cudnn_depthwise_workload` is taken as passing); fp32
/// and bf16 NCHW depthwise convolutions run `CudaDepthwise2d`. Everything
/// else runs cuDNN.
pub fn backend(p: &ConvProblem) -> ConvBackend {
    if !p.is_depthwise() {
        return ConvBackend::Cudnn;
    }
    let fp16_cudnn = p.dtype == DataType::F16 && !p.is_dilated() && p.c >= 32;
    if p.channels_last || fp16_cudnn {
        ConvBackend::Cudnn
    } else {
        ConvBackend::CudaDepthwise2d
    }
}

/// PSPNet's bottleneck on Cityscapes 512x1024, batch 2: 3x3, 4096 -> 512 at
/// 64x128 (the kernels' tests' common shape).
#[cfg(test)]
pub(crate) fn psp_bottleneck(dtype: DataType) -> ConvProblem {
    ConvProblem {
        n: 2,
        c: 4096,
        h: 64,
        w: 128,
        k: 512,
        r: 3,
        s: 3,
        ho: 64,
        wo: 128,
        stride: [1; 2],
        pad: [1; 2],
        dilation: [1; 2],
        groups: 1,
        dtype,
        channels_last: false,
    }
}

/// A recorded convolution call: its problem and the directions it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvCall {
    pub problem: ConvProblem,
    pub directions: Vec<Direction>,
    pub backend: ConvBackend,
}

fn dims4<'a>(t: Option<(&'a str, &[i64], Layout)>) -> Option<([i64; 4], &'a str, Layout)> {
    let (dtype, sizes, layout) = t?;
    (sizes.len() == 4).then(|| ([sizes[0], sizes[1], sizes[2], sizes[3]], dtype, layout))
}

fn pair(v: Option<&[i64]>) -> Option<[i64; 2]> {
    match v? {
        [a] => Some([*a, *a]),
        [a, b] => Some([*a, *b]),
        _ => None,
    }
}

/// The convolution of a recorded `aten::convolution` or
/// `aten::convolution_backward` call (`None` for another op, a 1-d/3-d
/// convolution, or arguments it cannot read).
pub fn conv_call(call: &KernelCall, half_is_fp16: bool) -> Option<ConvCall> {
    // convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    // convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    //                      transposed, output_padding, groups, output_mask)
    let (x_at, w_at, first_scalar, backward) = match call.op.as_str() {
        "aten::convolution" => (0, 1, 3, false),
        "aten::convolution_backward" => (1, 2, 4, true),
        _ => return None,
    };
    let (x, dtype, layout) = dims4(call.tensor(x_at))?;
    let (w, _, w_layout) = dims4(call.tensor(w_at))?;
    let stride = pair(call.ints(first_scalar))?;
    let pad = pair(call.ints(first_scalar + 1))?;
    let dilation = pair(call.ints(first_scalar + 2))?;
    let transposed = call.bool(first_scalar + 3)?;
    let groups = call.int(first_scalar + 5)?;
    let dtype = DataType::of_traced(dtype, half_is_fp16)?;
    let channels_last = layout == Layout::ChannelsLast || w_layout == Layout::ChannelsLast;
    let out_size = |i: usize, size: i64, kernel: i64| {
        (size + 2 * pad[i] - dilation[i] * (kernel - 1) - 1) / stride[i] + 1
    };
    // (c, h, w, k, ho, wo) of the convolution the kernels run.
    let (c, h, wd, k, ho, wo) = if !transposed {
        let (ho, wo) = (out_size(0, x[2], w[2]), out_size(1, x[3], w[3]));
        (x[1], x[2], x[3], w[0], ho, wo)
    } else {
        // Transposed: weight [c_in, c_out / groups, r, s]; the equivalent
        // convolution maps the transposed output (c_out channels) to its
        // input (c_in channels).
        let output_padding = pair(call.ints(first_scalar + 4))?;
        let size = |i: usize, size: i64, kernel: i64| {
            (size - 1) * stride[i] - 2 * pad[i] + dilation[i] * (kernel - 1) + output_padding[i] + 1
        };
        let (h, wd) = (size(0, x[2], w[2]), size(1, x[3], w[3]));
        (w[1] * groups, h, wd, x[1], x[2], x[3])
    };
    let problem = ConvProblem {
        n: x[0],
        c,
        h,
        w: wd,
        k,
        r: w[2],
        s: w[3],
        ho,
        wo,
        stride,
        pad,
        dilation,
        groups,
        dtype,
        channels_last,
    };
    let swap = |d: Direction| match (transposed, d) {
        (true, Direction::Forward) => Direction::BackwardData,
        (true, Direction::BackwardData) => Direction::Forward,
        (_, d) => d,
    };
    let directions = if backward {
        let mask = call.bools(first_scalar + 6)?;
        let mut d = Vec::new();
        if mask.first() == Some(&true) {
            d.push(swap(Direction::BackwardData));
        }
        if mask.get(1) == Some(&true) {
            d.push(Direction::BackwardFilter);
        }
        d
    } else {
        vec![swap(Direction::Forward)]
    };
    Some(ConvCall {
        backend: backend(&problem),
        problem,
        directions,
    })
}

#[cfg(test)]
#[path = "conv_tests.rs"]
mod tests;
