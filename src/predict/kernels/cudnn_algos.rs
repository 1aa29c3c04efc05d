//! cuDNN's convolution algorithms as data: for each, the direction it
//! computes, what it supports, whether it is deterministic, and the
//! workspace it asks for as a formula of the problem ([`ALGORITHMS`]).
//!
//! cuDNN is closed and documents workspaces only as "none", "small" or
//! "significant". The formulas are fitted to cuDNN's own answers: every
//! `cudnnGet*WorkspaceSize` value of 19 algorithms on 30 layer shapes
//! (cuDNN 7.5, fp32, NCHW, batch 32: the `out_example.txt` of
//! github.com/Slimakanzer/cudnn-benchmark at commit 652d8e0), where they
//! reproduce each value to the byte except where a row says otherwise, and
//! checked against NVIDIA's mnistCUDNN sample output under cuDNN 8 (FFT,
//! FFT tiling: unchanged). Support rules: the cuDNN 5.1/6 user guide's
//! `cudnnConvolutionForward` table, as Theano transcribed it
//! (`theano/gpuarray/tests/check_dnn_doc.py`, commit 6cc0c5cae).
//! The same families in open code have the same structure: MIOpen's GEMM
//! (`src/solver/conv/gemm.cpp`: im2col), FFT (`fft.cpp`: max(in + filter,
//! out) spectra) and multi-pass Winograd (`conv_MP_bidirectional_winograd.cpp`:
//! alpha^2 (C T + K T + C K)).

use super::conv::{ConvProblem, DataType, Direction};

/// A cuDNN convolution algorithm (the legacy enums' names; the v8 API's
/// engines implement the same families).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Algo {
    FwdImplicitGemm,
    FwdImplicitPrecompGemm,
    FwdGemm,
    FwdFft,
    FwdFftTiling,
    FwdWinograd,
    FwdWinogradNonfused,
    BwdDataAlgo0,
    BwdDataAlgo1,
    BwdDataFft,
    BwdDataFftTiling,
    BwdDataWinograd,
    BwdDataWinogradNonfused,
    BwdFilterAlgo0,
    BwdFilterAlgo1,
    BwdFilterFft,
    BwdFilterAlgo3,
    BwdFilterWinogradNonfused,
}

/// How an algorithm computes, for the speed model (`cudnn_speed.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Family {
    /// Implicit or explicit matrix products: every multiply-add done, on
    /// tensor cores where the math type allows.
    Gemm,
    /// Winograd F(4x4, 3x3) in separate passes: a quarter of the
    /// multiplies, in fp32, plus transforms through the workspace.
    WinogradNonfused,
    /// Fused Winograd F(3x3, 3x3) kernels.
    Winograd,
    /// Fourier transforms of whole planes or of 32x32 tiles.
    Fft,
}

/// One algorithm's row.
#[derive(Debug, Clone, Copy)]
pub struct AlgoSpec {
    pub algo: Algo,
    /// cuDNN's enum name.
    pub name: &'static str,
    pub direction: Direction,
    pub family: Family,
    pub deterministic: bool,
    /// Time relative to implicit precomputed GEMM at the same math rate,
    /// for the GEMM family (the medians of the timed shapes of the
    /// workspace table: 19x19 and 10x10 512 -> 486, 5x5 256 -> 486).
    pub gemm_slowdown: f64,
    pub supports: fn(&ConvProblem) -> bool,
    pub workspace: fn(&ConvProblem) -> u64,
    /// Where the workspace formula comes from, and how well it fits.
    pub source: &'static str,
}

fn all(_: &ConvProblem) -> bool {
    true
}
fn none(_: &ConvProblem) -> u64 {
    0
}

fn u(v: i64) -> u64 {
    v.max(0) as u64
}

/// Winograd and FFT need an undilated, ungrouped 2-d convolution. cuDNN
/// also runs grouped convolutions through them group by group; segtune
/// leaves them to the GEMM family (an assumption, see docs/prediction.md).
fn dense_undilated(p: &ConvProblem) -> bool {
    p.groups == 1 && !p.is_dilated() && p.dtype != DataType::F64
}

/// 3x3, stride 1 (the Winograd kernels' shapes with a fitted workspace).
fn winograd_3x3(p: &ConvProblem) -> bool {
    dense_undilated(p) && !p.is_strided() && p.r == 3 && p.s == 3
}

/// FFT: stride 1, the padded plane at most 256 per side, the filter larger
/// than the padding.
fn fft_supported(p: &ConvProblem) -> bool {
    dense_undilated(p)
        && !p.is_strided()
        && p.h + 2 * p.pad[0] <= 256
        && p.w + 2 * p.pad[1] <= 256
        && p.r > p.pad[0]
        && p.s > p.pad[1]
}

/// FFT tiling: filters up to 32 and at least 3 (the 1x1 case tiles
/// differently, not fitted: left out), the filter larger than the padding.
fn fft_tiling_supported(p: &ConvProblem) -> bool {
    dense_undilated(p)
        && (3..=32).contains(&p.r)
        && (3..=32).contains(&p.s)
        && p.r > p.pad[0]
        && p.s > p.pad[1]
}

/// The FFT size of a padded side: the next power of two, at least 16.
fn fft_side(padded: i64) -> i64 {
    (padded.max(1) as u64).next_power_of_two().max(16) as i64
}

/// Bytes of one complex fp32 half-spectrum plane, twice (real-to-complex
/// transforms of the padded plane, the last side halved).
fn fft_plane(p: &ConvProblem) -> i64 {
    let hf = fft_side(p.h + 2 * p.pad[0]);
    let wf = fft_side(p.w + 2 * p.pad[1]);
    16 * hf * (wf / 2 + 1)
}

fn gemm_im2col(p: &ConvProblem) -> u64 {
    u(p.n * p.c * p.r * p.s * p.ho * p.wo) * p.dtype.bytes()
}
fn precomp_indices(p: &ConvProblem) -> u64 {
    u(4 * (6 * (p.ho * p.wo + 1)).div_euclid(4)
        + if (6 * (p.ho * p.wo + 1)) % 4 == 0 {
            0
        } else {
            4
        })
}
fn fwd_fft(p: &ConvProblem) -> u64 {
    u(fft_plane(p) * (p.c * (p.n + p.k)).max(p.n * p.k) + 4 * p.r * p.s * p.c * p.k)
}
fn bwd_data_fft(p: &ConvProblem) -> u64 {
    u(fft_plane(p) * (p.k * (p.n + p.c)).max(p.n * p.c) + 4 * p.r * p.s * p.c * p.k)
}
fn bwd_filter_fft(p: &ConvProblem) -> u64 {
    u(fft_plane(p) * (p.n * (p.c + p.k)).max(p.k * p.c) + 4 * p.n * p.k * p.ho * p.wo)
}
/// 4352 bytes: one 32x32 tile's complex fp32 half-spectrum (32 x 17 x 8).
fn fft_tiling(p: &ConvProblem) -> u64 {
    let f = if (p.h + 2 * p.pad[0]).max(p.w + 2 * p.pad[1]) <= 32 {
        1
    } else {
        2
    };
    u(4352 * (f * p.n * (p.c + p.k) + p.k * p.c) + f * 24576)
}
fn round_up(v: i64, to: i64) -> i64 {
    v.div_euclid(to) * to + if v % to == 0 { 0 } else { to }
}
fn fwd_winograd(p: &ConvProblem) -> u64 {
    u(4 * (25 * p.c * p.k + 16 * p.c * (round_up(p.k, 32) - p.k) + p.k))
}
fn bwd_data_winograd(p: &ConvProblem) -> u64 {
    u(4 * (25 * p.c * p.k + 16 * p.c * (round_up(p.k, 8) - p.k) + p.c))
}
/// F(4x4, 3x3): 36 fp32 values per 4x4 tile of the plane `(hs, ws)` for the
/// input and output channels, and 36 per filter.
fn winograd_nonfused(p: &ConvProblem, hs: i64, ws: i64) -> u64 {
    let tiles = p.n * ((hs + 3) / 4) * ((ws + 3) / 4);
    u(144 * (p.c * tiles + p.k * tiles + p.c * p.k))
}
fn fwd_winograd_nonfused(p: &ConvProblem) -> u64 {
    winograd_nonfused(p, p.ho, p.wo)
}
fn bwd_data_winograd_nonfused(p: &ConvProblem) -> u64 {
    winograd_nonfused(p, p.h, p.w)
}
fn bwd_filter_algo3(p: &ConvProblem) -> u64 {
    u(2176 + 6 * (p.r * p.s + 1) * p.wo)
}

/// Every algorithm segtune models, by direction.
pub const ALGORITHMS: &[AlgoSpec] = &[
    AlgoSpec {
        algo: Algo::FwdImplicitGemm,
        name: "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM",
        direction: Direction::Forward,
        family: Family::Gemm,
        deterministic: true,
        gemm_slowdown: 1.47,
        supports: all,
        workspace: none,
        source: "0 on all 30 shapes of the table",
    },
    AlgoSpec {
        algo: Algo::FwdImplicitPrecompGemm,
        name: "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM",
        direction: Direction::Forward,
        family: Family::Gemm,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: all,
        workspace: precomp_indices,
        source: "4 ceil(6 (Ho Wo + 1) / 4): 28 of 30 shapes (the two 1x1 outputs take C R S 4); also fp16 at 4K (Theano PR #6354)",
    },
    AlgoSpec {
        algo: Algo::FwdGemm,
        name: "CUDNN_CONVOLUTION_FWD_ALGO_GEMM",
        direction: Direction::Forward,
        family: Family::Gemm,
        deterministic: true,
        gemm_slowdown: 1.40,
        supports: |p| p.dtype != DataType::F64,
        workspace: gemm_im2col,
        source: "N C R S Ho Wo x element size (the whole batch's im2col matrix): 30 of 30 shapes; fp16 at half the bytes (mnistCUDNN, cuDNN 8)",
    },
    AlgoSpec {
        algo: Algo::FwdFft,
        name: "CUDNN_CONVOLUTION_FWD_ALGO_FFT",
        direction: Direction::Forward,
        family: Family::Fft,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: fft_supported,
        workspace: fwd_fft,
        source: "16 Hf (Wf/2+1) max(C (N+K), N K) + 4 R S C K, Hf = max(16, next power of 2 of H + 2 pad): 23 of 24 shapes (the 75x75 one 0.03% above); cuDNN 8 mnistCUDNN exact",
    },
    AlgoSpec {
        algo: Algo::FwdFftTiling,
        name: "CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING",
        direction: Direction::Forward,
        family: Family::Fft,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: fft_tiling_supported,
        workspace: fft_tiling,
        source: "4352 (f N (C+K) + K C) + 24576 f, f = 1 if the padded plane fits one 32x32 tile else 2: 23 of 23 3x3 and 7x7 shapes (1x1 filters tile otherwise: not modelled)",
    },
    AlgoSpec {
        algo: Algo::FwdWinograd,
        name: "CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD",
        direction: Direction::Forward,
        family: Family::Winograd,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: winograd_3x3,
        workspace: fwd_winograd,
        source: "4 (25 C K + 16 C (K rounded up to 32 - K) + K): 18 of 18 shapes",
    },
    AlgoSpec {
        algo: Algo::FwdWinogradNonfused,
        name: "CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED",
        direction: Direction::Forward,
        family: Family::WinogradNonfused,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: winograd_3x3,
        workspace: fwd_winograd_nonfused,
        source: "144 (C T + K T + C K), T = N ceil(Ho/4) ceil(Wo/4) (F(4x4,3x3), fp32 transforms): 18 of 18 shapes; 5x5 not fitted (left out)",
    },
    AlgoSpec {
        algo: Algo::BwdDataAlgo0,
        name: "CUDNN_CONVOLUTION_BWD_DATA_ALGO_0",
        direction: Direction::BackwardData,
        family: Family::Gemm,
        deterministic: false,
        gemm_slowdown: 1.65,
        supports: all,
        workspace: none,
        source: "0 on all shapes (atomic adds: non-deterministic)",
    },
    AlgoSpec {
        algo: Algo::BwdDataAlgo1,
        name: "CUDNN_CONVOLUTION_BWD_DATA_ALGO_1",
        direction: Direction::BackwardData,
        family: Family::Gemm,
        deterministic: true,
        gemm_slowdown: 1.07,
        supports: all,
        workspace: none,
        source: "0 to 36 KB in the table (small: counted as 0)",
    },
    AlgoSpec {
        algo: Algo::BwdDataFft,
        name: "CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT",
        direction: Direction::BackwardData,
        family: Family::Fft,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: fft_supported,
        workspace: bwd_data_fft,
        source: "16 Hf (Wf/2+1) max(K (N+C), N C) + 4 R S C K: 23 of 24 shapes",
    },
    AlgoSpec {
        algo: Algo::BwdDataFftTiling,
        name: "CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING",
        direction: Direction::BackwardData,
        family: Family::Fft,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: fft_tiling_supported,
        workspace: fft_tiling,
        source: "as the forward FFT tiling (the same value on every shape of the table)",
    },
    AlgoSpec {
        algo: Algo::BwdDataWinograd,
        name: "CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD",
        direction: Direction::BackwardData,
        family: Family::Winograd,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: winograd_3x3,
        workspace: bwd_data_winograd,
        source: "4 (25 C K + 16 C (K rounded up to 8 - K) + C): 18 of 18 shapes",
    },
    AlgoSpec {
        algo: Algo::BwdDataWinogradNonfused,
        name: "CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED",
        direction: Direction::BackwardData,
        family: Family::WinogradNonfused,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: winograd_3x3,
        workspace: bwd_data_winograd_nonfused,
        source: "144 (C T + K T + C K), T = N ceil(H/4) ceil(W/4) (the input gradient's plane): 18 of 18 shapes",
    },
    AlgoSpec {
        algo: Algo::BwdFilterAlgo0,
        name: "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0",
        direction: Direction::BackwardFilter,
        family: Family::Gemm,
        deterministic: false,
        gemm_slowdown: 1.64,
        supports: all,
        workspace: none,
        source: "0 on all shapes (atomic adds: non-deterministic)",
    },
    AlgoSpec {
        algo: Algo::BwdFilterAlgo1,
        name: "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1",
        direction: Direction::BackwardFilter,
        family: Family::Gemm,
        deterministic: true,
        gemm_slowdown: 1.50,
        supports: all,
        workspace: none,
        source: "0.5 to 47 KB in the table (small: counted as 0)",
    },
    AlgoSpec {
        algo: Algo::BwdFilterFft,
        name: "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT",
        direction: Direction::BackwardFilter,
        family: Family::Fft,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: fft_supported,
        workspace: bwd_filter_fft,
        source: "16 Hf (Wf/2+1) max(N (C+K), K C) + 4 N K Ho Wo: 22 of 22 shapes",
    },
    AlgoSpec {
        algo: Algo::BwdFilterAlgo3,
        name: "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3",
        direction: Direction::BackwardFilter,
        family: Family::Gemm,
        deterministic: false,
        gemm_slowdown: 1.55,
        supports: all,
        workspace: bwd_filter_algo3,
        source: "about 2176 + 6 (R S + 1) Wo: 28 of 30 shapes (non-deterministic)",
    },
    AlgoSpec {
        algo: Algo::BwdFilterWinogradNonfused,
        name: "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED",
        direction: Direction::BackwardFilter,
        family: Family::WinogradNonfused,
        deterministic: true,
        gemm_slowdown: 1.0,
        supports: winograd_3x3,
        workspace: fwd_winograd_nonfused,
        source: "not in the table: the forward's F(4x4,3x3) structure assumed (transforms of the input, the output gradient and the filter gradient)",
    },
];

impl Algo {
    pub fn spec(self) -> &'static AlgoSpec {
        ALGORITHMS
            .iter()
            .find(|a| a.algo == self)
            .expect("every algorithm has a row")
    }
    pub fn name(self) -> &'static str {
        self.spec().name
    }
}

/// The algorithms of `direction` that support `p` (deterministic ones only
/// under `torch.backends.cudnn.deterministic`), with their workspaces.
pub fn candidates(p: &ConvProblem, direction: Direction, deterministic: bool) -> Vec<(Algo, u64)> {
    ALGORITHMS
        .iter()
        .filter(|a| a.direction == direction && (a.supports)(p))
        .filter(|a| a.deterministic || !deterministic)
        .map(|a| (a.algo, (a.workspace)(p)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shape of the fitted table: N=32, fp32, NCHW.
    fn table_shape(hw: i64, c: i64, k: i64, r: i64, pad: i64, stride: i64) -> ConvProblem {
        let o = (hw + 2 * pad - r) / stride + 1;
        ConvProblem {
            n: 32,
            c,
            h: hw,
            w: hw,
            k,
            r,
            s: r,
            ho: o,
            wo: o,
            stride: [stride; 2],
            pad: [pad; 2],
            dilation: [1; 2],
            groups: 1,
            dtype: DataType::F32,
            channels_last: false,
        }
    }

    fn ws(algo: Algo, p: &ConvProblem) -> u64 {
        assert!(
            (algo.spec().supports)(p),
            "{} supports the shape",
            algo.name()
        );
        (algo.spec().workspace)(p)
    }

    /// Values cuDNN 7.5 returned (Slimakanzer/cudnn-benchmark out_example.txt).
    #[test]
    fn the_formulas_give_cudnns_own_workspaces() {
        let p = table_shape(38, 256, 256, 3, 1, 1);
        assert_eq!(ws(Algo::FwdGemm, &p), 425_852_928);
        assert_eq!(ws(Algo::FwdImplicitPrecompGemm, &p), 8_672);
        assert_eq!(ws(Algo::FwdFft, &p), 2_493_775_872);
        assert_eq!(ws(Algo::FwdFftTiling, &p), 427_868_160);
        assert_eq!(ws(Algo::FwdWinograd, &p), 6_554_624);
        assert_eq!(ws(Algo::FwdWinogradNonfused, &p), 245_366_784);
        assert_eq!(ws(Algo::BwdDataWinogradNonfused, &p), 245_366_784);
        assert_eq!(ws(Algo::BwdFilterFft, &p), 2_261_909_504);
        let p = table_shape(75, 64, 64, 3, 1, 1);
        assert_eq!(ws(Algo::FwdGemm, &p), 414_720_000);
        assert_eq!(ws(Algo::FwdImplicitPrecompGemm, &p), 33_756);
        assert_eq!(ws(Algo::FwdFftTiling, &p), 53_526_528);
        assert_eq!(ws(Algo::FwdWinograd, &p), 409_856);
        assert_eq!(ws(Algo::FwdWinogradNonfused, &p), 213_516_288);
        let p = table_shape(19, 512, 486, 3, 1, 1);
        assert_eq!(ws(Algo::FwdFftTiling, &p), 1_221_926_912);
        assert_eq!(ws(Algo::FwdWinograd, &p), 25_737_112);
        assert_eq!(ws(Algo::FwdWinogradNonfused, &p), 150_801_408);
        assert_eq!(ws(Algo::FwdFft, &p), 2_317_398_016);
        let p = table_shape(300, 3, 64, 7, 3, 2);
        assert_eq!(ws(Algo::FwdGemm, &p), 423_360_000);
        assert_eq!(ws(Algo::FwdImplicitPrecompGemm, &p), 135_008);
        assert_eq!(ws(Algo::FwdFftTiling, &p), 19_546_112);
        let p = table_shape(38, 256, 512, 3, 1, 2);
        assert_eq!(ws(Algo::FwdFftTiling, &p), 784_384_000);
        assert_eq!(ws(Algo::FwdGemm, &p), 106_463_232);
    }

    #[test]
    fn each_algorithm_supports_only_its_shapes() {
        let strided = table_shape(38, 256, 512, 3, 1, 2);
        assert!(!(Algo::FwdWinogradNonfused.spec().supports)(&strided));
        assert!(!(Algo::FwdFft.spec().supports)(&strided));
        let mut dilated = table_shape(38, 256, 256, 3, 2, 1);
        dilated.dilation = [2, 2];
        for a in ALGORITHMS {
            let family = a.family;
            assert_eq!(
                (a.supports)(&dilated),
                family == Family::Gemm,
                "{}: dilated convolutions run the GEMM family only",
                a.name
            );
        }
        let big = table_shape(300, 3, 64, 3, 1, 1);
        assert!(
            !(Algo::FwdFft.spec().supports)(&big),
            "FFT planes at most 256"
        );
        let one = table_shape(38, 256, 256, 1, 0, 1);
        assert!(
            !(Algo::FwdFftTiling.spec().supports)(&one),
            "1x1 tiling not modelled"
        );
        assert!(!(Algo::FwdWinograd.spec().supports)(&one));
    }

    #[test]
    fn deterministic_mode_keeps_only_deterministic_algorithms() {
        let p = table_shape(38, 256, 256, 3, 1, 1);
        let any = candidates(&p, Direction::BackwardFilter, false);
        let det = candidates(&p, Direction::BackwardFilter, true);
        assert!(any.iter().any(|(a, _)| *a == Algo::BwdFilterAlgo0));
        assert!(det.iter().all(|(a, _)| a.spec().deterministic));
        assert!(!det.iter().any(|(a, _)| *a == Algo::BwdFilterAlgo3));
        assert!(det.iter().any(|(a, _)| *a == Algo::BwdFilterAlgo1));
    }
}
