//! Which cuDNN algorithm is fastest for a convolution on a given GPU: a
//! speed model in the units of the GPU's own math rates. cuDNN's
//! heuristics (`cudnnGetConvolution*Algorithm_v7`, the v8 API's
//! `CUDNN_HEUR_MODE_INSTANT`) predict speed, and `cudnn_benchmark=True`
//! times the candidates: both end at the fastest algorithm for the shape,
//! whose workspace is what the step then holds. The model decides between
//! families, which is what moves memory:
//!
//! - the GEMM family does every multiply-add at the math rate of the data
//!   type: tensor cores for fp16/bf16 (compute capability 7.0+/8.0+) and for
//!   fp32 where TF32 is allowed (`torch.backends.cudnn.allow_tf32`, True by
//!   default) and the card has it (8.0+); fp32 CUDA cores otherwise. Each
//!   algorithm is slower than implicit precomputed GEMM by its measured
//!   factor (`AlgoSpec::gemm_slowdown`);
//! - Winograd F(4x4, 3x3) (nonfused) does a quarter of the multiplies, in
//!   fp32 on CUDA cores, plus its transforms, which cost in proportion to
//!   the workspace they pass through ([`TRANSFORM_FLOPS_PER_BYTE`]);
//! - fused Winograd does about a third of the multiplies at a fifth of the
//!   GEMM kernels' efficiency; FFT costs its spectra's products and passes.
//!
//! Fitted to the timed shapes of the workspace table (`cudnn_algos.rs`:
//! 11 shapes with times for every algorithm, one fp32 GPU without tensor
//! cores): nonfused Winograd 2.5x faster than precomputed GEMM on 19x19
//! 512 -> 486, 1.6x on 10x10, even on 5x5, 1.7x slower on 3x3 (the model:
//! 2.5, 1.9, 1.15, 0.5). What the model cannot know (one card's kernels, a
//! cuDNN release's heuristics) the benchmark range covers
//! ([`PLAUSIBLE_SLOWDOWN`]).

use super::conv::{ConvProblem, DataType};
use super::cudnn_algos::{AlgoSpec, Family};

/// A GPU's math rates (TFLOPS; only their ratios decide the choice).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct GpuMath {
    pub fp32: f64,
    /// TF32 tensor cores (0: none).
    pub tf32: f64,
    /// fp16 tensor cores, fp32 accumulate (0: none, or no faster than fp32).
    pub fp16: f64,
    pub bf16: f64,
    /// Streaming multiprocessors, and the threads each can hold (the
    /// reduction kernels size their grids by them).
    pub sms: i64,
    pub max_threads_per_sm: i64,
}

impl GpuMath {
    /// A representative card's rates for a compute capability, for a GPU
    /// known only by `--vram` and `--compute-capability` (datasheet dense
    /// peaks: P100, GTX 1080 Ti, V100 SXM2, T4, A100 SXM, RTX 3090, RTX 4090,
    /// H100 SXM).
    pub fn of_compute_capability(cc: &str) -> GpuMath {
        let (rates, sms) = match cc {
            "6.0" => ([9.3, 0.0, 0.0, 0.0], 56),
            c if c.starts_with('6') || c.starts_with('5') => ([11.3, 0.0, 0.0, 0.0], 28),
            "7.0" | "7.2" => ([15.7, 0.0, 125.0, 0.0], 80),
            c if c.starts_with('7') => ([8.1, 0.0, 65.0, 0.0], 40),
            "8.0" => ([19.5, 156.0, 312.0, 312.0], 108),
            "8.9" => ([82.6, 82.6, 165.2, 165.2], 128),
            c if c.starts_with('8') => ([35.6, 35.6, 71.0, 71.0], 82),
            _ => ([67.0, 494.7, 989.5, 989.5], 132),
        };
        GpuMath::with_rates(rates, sms, max_threads_per_sm(cc))
    }

    /// A card's own rates (`[fp32, tf32, fp16, bf16]` TFLOPS and SMs), or a
    /// typical card's for its compute capability where it is known only by
    /// `--vram` (`custom`) or its SMs are not given.
    pub fn of_card(custom: bool, compute_capability: &str, rates: [f64; 4], sms: i64) -> GpuMath {
        let typical = GpuMath::of_compute_capability(compute_capability);
        if custom || sms == 0 {
            return typical;
        }
        GpuMath::with_rates(rates, sms, typical.max_threads_per_sm)
    }

    fn with_rates(rates: [f64; 4], sms: i64, max_threads_per_sm: i64) -> GpuMath {
        let [fp32, tf32, fp16, bf16] = rates;
        GpuMath {
            fp32,
            tf32,
            fp16,
            bf16,
            sms,
            max_threads_per_sm,
        }
    }

    /// The rate of the GEMM family for `dtype`.
    fn gemm_rate(&self, dtype: DataType, allow_tf32: bool) -> f64 {
        let cuda_cores = self.fp32 * CUDA_CORE_EFFICIENCY;
        let tensor = |peak: f64| peak * TENSOR_CORE_EFFICIENCY;
        match dtype {
            DataType::F16 => tensor(self.fp16).max(cuda_cores),
            DataType::Bf16 => tensor(self.bf16).max(cuda_cores),
            DataType::F32 if allow_tf32 => tensor(self.tf32).max(cuda_cores),
            DataType::F32 => cuda_cores,
            DataType::F64 => cuda_cores / 32.0,
        }
    }
}

/// Resident threads per SM by compute capability (CUDA C++ Programming
/// Guide, "Compute Capabilities", table of technical specifications).
pub fn max_threads_per_sm(cc: &str) -> i64 {
    match cc {
        "7.5" => 1024,
        "8.6" | "8.7" | "8.9" => 1536,
        c if c.starts_with("12") => 1536,
        _ => 2048,
    }
}

/// Share of peak a convolution kernel reaches on CUDA cores and on tensor
/// cores. Only their ratio decides between the families, and public logs
/// bound it: fp16 PSPNet on an RTX 4090 (tensor cores at 2x its fp32 rate)
/// shows the GEMM family's small workspaces, which needs a ratio above
/// 1.33; fp32 on RTX 3090s (TF32 at its fp32 rate) shows Winograd's, which
/// needs one below 2.8 (tests/fixtures/mmseg_logs.tsv). 0.7 / 0.4 sits in
/// between.
pub const CUDA_CORE_EFFICIENCY: f64 = 0.4;
pub const TENSOR_CORE_EFFICIENCY: f64 = 0.7;

/// Cost of Winograd's and FFT's transforms, in flops at the fp32 GEMM rate
/// per byte of workspace they pass through: fitted to nonfused Winograd's
/// times in the workspace table (19x19 512 -> 486: 33.0 ms against 82.3 for
/// precomputed GEMM, whose rate gives the GEMM part 20.6 ms; the other
/// 12.4 ms over its 150.8 MB of transforms).
pub const TRANSFORM_FLOPS_PER_BYTE: f64 = 52.0;

/// Fused Winograd F(3x3, 3x3): 81 / 25 fewer multiplies at this share of
/// the GEMM kernels' efficiency (the table: 1.4x slower than precomputed
/// GEMM on 19x19 512 -> 486).
const FUSED_WINOGRAD_EFFICIENCY: f64 = 0.2;

/// In half precision on a card whose tensor cores run it, cuDNN's
/// heuristics and its benchmark keep to the tensor-core GEMM kernels:
/// nonfused Winograd and FFT take their products through fp32 transforms
/// on CUDA cores. The public fp16 runs bound how much slower that is: fp16
/// PSPNet on an RTX 4090 (2x its fp32 rate on tensor cores) shows none of
/// nonfused Winograd's backward-filter workspace (531 MiB for its
/// bottleneck; the log shows the least figure + 5%), which needs a factor
/// above 2.14 on the model's times (PLAUSIBLE_SLOWDOWN included); MMSeg's
/// fp16 zoo rows on V100s (tests/fixtures/fp16_runs.csv) show none either.
pub const HALF_PRECISION_TRANSFORM_SLOWDOWN: f64 = 3.0;

/// With `cudnn_benchmark=True` cuDNN times the candidates and keeps the
/// fastest on this card; an algorithm within this factor of the modelled
/// fastest may be the one it keeps (the model's error on the table's timed
/// shapes is up to 1.7x on the smallest, within 1.25x on the large ones).
pub const PLAUSIBLE_SLOWDOWN: f64 = 1.25;

/// Seconds (in the model's units) `algo` takes for `p` on `gpu`.
pub fn time(
    algo: &AlgoSpec,
    p: &ConvProblem,
    gpu: &GpuMath,
    allow_tf32: bool,
    workspace: u64,
) -> f64 {
    let flops = p.flops();
    let half_on_tensor_cores = matches!(p.dtype, DataType::F16 | DataType::Bf16)
        && gpu.gemm_rate(p.dtype, allow_tf32) > gpu.fp32 * CUDA_CORE_EFFICIENCY;
    let transform_slowdown = if half_on_tensor_cores {
        HALF_PRECISION_TRANSFORM_SLOWDOWN
    } else {
        1.0
    };
    let fp32 = gpu.fp32 * CUDA_CORE_EFFICIENCY * 1e12 / transform_slowdown;
    match algo.family {
        Family::Gemm => algo.gemm_slowdown * flops / (gpu.gemm_rate(p.dtype, allow_tf32) * 1e12),
        Family::WinogradNonfused => {
            (flops / 4.0 + TRANSFORM_FLOPS_PER_BYTE * workspace as f64) / fp32
        }
        Family::Winograd => flops / (81.0 / 25.0) / (fp32 * FUSED_WINOGRAD_EFFICIENCY),
        Family::Fft => {
            // Complex products of every (input, output) channel pair per
            // spectrum point, plus the transforms' passes.
            let points =
                (p.h + 2 * p.pad[0]).max(16) as f64 * ((p.w + 2 * p.pad[1]) as f64 / 2.0 + 1.0);
            let products = 8.0 * (p.n * p.c * p.k) as f64 * points;
            (products + TRANSFORM_FLOPS_PER_BYTE * workspace as f64) / fp32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::cudnn_algos::Algo;
    use super::*;

    fn shape(hw: i64, c: i64, k: i64) -> ConvProblem {
        ConvProblem {
            n: 32,
            c,
            h: hw,
            w: hw,
            k,
            r: 3,
            s: 3,
            ho: hw,
            wo: hw,
            stride: [1; 2],
            pad: [1; 2],
            dilation: [1; 2],
            groups: 1,
            dtype: DataType::F32,
            channels_last: false,
        }
    }

    /// Nonfused Winograd's time over precomputed GEMM's, on a card like the
    /// table's (fp32, no tensor cores).
    fn winograd_over_gemm(p: &ConvProblem, gpu: &GpuMath, allow_tf32: bool) -> f64 {
        let w = Algo::FwdWinogradNonfused.spec();
        let g = Algo::FwdImplicitPrecompGemm.spec();
        time(w, p, gpu, allow_tf32, (w.workspace)(p))
            / time(g, p, gpu, allow_tf32, (g.workspace)(p))
    }

    #[test]
    fn winograd_wins_on_large_planes_and_loses_on_small_ones_as_timed() {
        let gpu = GpuMath::of_compute_capability("6.1");
        // Measured ratios: 19x19 0.40, 10x10 0.62, 5x5 1.03, 3x3 1.73.
        let r19 = winograd_over_gemm(&shape(19, 512, 486), &gpu, true);
        let r10 = winograd_over_gemm(&shape(10, 512, 486), &gpu, true);
        let r5 = winograd_over_gemm(&shape(5, 256, 486), &gpu, true);
        let r3 = winograd_over_gemm(&shape(3, 256, 324), &gpu, true);
        assert!((0.36..0.44).contains(&r19), "{r19}");
        assert!((0.45..0.7).contains(&r10), "{r10}");
        assert!((0.8..1.3).contains(&r5), "{r5}");
        assert!(r3 > 1.5, "{r3}");
    }

    #[test]
    fn tensor_cores_make_the_gemm_family_win() {
        let p = shape(64, 512, 512);
        // fp32 on a V100 (no TF32): Winograd; on an A100 (TF32): GEMM.
        assert!(winograd_over_gemm(&p, &GpuMath::of_compute_capability("7.0"), true) < 1.0);
        assert!(winograd_over_gemm(&p, &GpuMath::of_compute_capability("8.0"), true) > 1.0);
        // ... unless TF32 is switched off.
        assert!(winograd_over_gemm(&p, &GpuMath::of_compute_capability("8.0"), false) < 1.0);
        // A GeForce Ampere's TF32 is no faster than its fp32: Winograd.
        assert!(winograd_over_gemm(&p, &GpuMath::of_compute_capability("8.6"), true) < 1.0);
        // fp16 on tensor cores: GEMM.
        let half = ConvProblem {
            dtype: DataType::F16,
            ..p
        };
        assert!(winograd_over_gemm(&half, &GpuMath::of_compute_capability("7.0"), true) > 1.0);
    }
}
