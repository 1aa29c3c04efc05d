//! Which workspace each cuDNN convolution takes, call by call, as PyTorch
//! asks cuDNN for it (`aten/src/ATen/native/cudnn/Conv_v7.cpp`, the default
//! up to 1.13; `Conv_v8.cpp`, the default from 2.0, pytorch/pytorch#91117):
//!
//! - **benchmark off**: cuDNN's heuristics rank the algorithms
//!   (`cudnnGetConvolution*Algorithm_v7`, all of them, no workspace limit;
//!   v8: `CUDNN_HEUR_MODE_INSTANT`, then its fallback list); each is tried in
//!   turn, its workspace allocated through the caching allocator for the
//!   call and freed after it; an out-of-memory moves on to the next
//!   algorithm. The first that runs is cached per shape (`BenchmarkCache`,
//!   also without benchmark) and tried first next time.
//! - **benchmark on**: the first call of a shape times the algorithms with
//!   one workspace, the largest any of them asks for that fits
//!   `cacheInfo`'s largest block (the device's free memory, or the largest
//!   cached free block); v7 allocates it (an out-of-memory there is not
//!   caught), v8 halves it until it fits. `emptyCache()` follows (v7 while
//!   the search workspace is still held, so it stays cached; v8 after
//!   freeing it). The fastest algorithm whose workspace fit is cached.
//! - `torch.backends.cudnn.deterministic` keeps only deterministic ones.
//!
//! Which one is "fastest" is `cudnn_speed.rs`'s model; a measured table
//! (`workspace_table.rs`) overrides it for the shapes it has. Where the
//! choice is made by timing on the card, [`Figure`] says which end of the
//! plausible winners a replay takes.

use super::conv::{ConvProblem, Direction};
use super::cudnn_algos::{candidates, Algo};
use super::cudnn_speed::{time, GpuMath, PLAUSIBLE_SLOWDOWN};
use super::workspace_table::WorkspaceTable;
use std::collections::HashMap;

/// How PyTorch drives cuDNN in the run predicted.
#[derive(Debug, Clone, PartialEq)]
pub struct CudnnSettings {
    /// `torch.backends.cudnn.benchmark` (MMEngine: `env_cfg.cudnn_benchmark`).
    pub benchmark: bool,
    /// `torch.backends.cudnn.deterministic` (MMEngine: `randomness.deterministic`).
    pub deterministic: bool,
    /// `torch.backends.cudnn.allow_tf32` (PyTorch's default: True).
    pub allow_tf32: bool,
    /// The v8 (cuDNN frontend) API: PyTorch 2.0 and later.
    pub v8_api: bool,
    pub gpu: GpuMath,
    /// A measured table for this GPU's architecture, if there is one.
    pub table: Option<&'static WorkspaceTable>,
}

/// Which workspaces a replay gives the convolutions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Figure {
    /// The smallest workspace each convolution can run with: what the step
    /// needs at least (decides an out-of-memory; the search's feasibility).
    Least,
    /// The modelled fastest algorithm that fits: the likeliest figure.
    Likely,
    /// The plausible winner with the smallest workspace.
    Low,
    /// The plausible winner with the largest workspace that fits (the
    /// fastest's taken up to `ENGINE_ALLOWANCE` times).
    High,
}

/// One candidate: its algorithm, workspace and modelled time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub algo: Algo,
    pub workspace: u64,
    pub time: f64,
}

/// The candidates of a direction, fastest first (by the table where it
/// has the shape: its winner first).
pub fn ranked(p: &ConvProblem, direction: Direction, s: &CudnnSettings) -> Vec<Candidate> {
    let mut c: Vec<Candidate> = candidates(p, direction, s.deterministic)
        .into_iter()
        .map(|(algo, workspace)| {
            let workspace = s
                .table
                .as_ref()
                .and_then(|t| t.workspace(p, direction, algo))
                .unwrap_or(workspace);
            Candidate {
                algo,
                workspace,
                time: time(algo.spec(), p, &s.gpu, s.allow_tf32, workspace),
            }
        })
        .collect();
    c.sort_by(|a, b| a.time.total_cmp(&b.time).then(a.algo.cmp(&b.algo)));
    if let Some(winner) = s
        .table
        .as_ref()
        .and_then(|t| t.winner(p, direction, s.benchmark))
    {
        if let Some(i) = c.iter().position(|x| x.algo == winner) {
            let w = c.remove(i);
            c.insert(0, w);
        }
    }
    c
}

/// The order in which a call tries the candidates, for `figure`, among
/// those whose workspace is at most `bound` (a search's workspace).
pub fn order(ranked: &[Candidate], figure: Figure, bound: u64) -> Vec<Candidate> {
    let fitting: Vec<Candidate> = ranked
        .iter()
        .copied()
        .filter(|c| c.workspace <= bound)
        .collect();
    let Some(fastest) = fitting.first().copied() else {
        return Vec::new();
    };
    let plausible = |c: &Candidate| c.time <= fastest.time * PLAUSIBLE_SLOWDOWN;
    let first = match figure {
        Figure::Least => fitting
            .iter()
            .min_by(|a, b| {
                a.workspace
                    .cmp(&b.workspace)
                    .then(a.time.total_cmp(&b.time))
            })
            .copied(),
        Figure::Likely => Some(fastest),
        Figure::Low => fitting
            .iter()
            .filter(|c| plausible(c))
            .min_by_key(|c| c.workspace)
            .copied(),
        // The plausible winner with the largest workspace, the fastest's
        // counted with the engines' allowance (kernels::ENGINE_ALLOWANCE).
        Figure::High => fitting
            .iter()
            .filter(|c| plausible(c))
            .max_by_key(|c| {
                if c.algo == fastest.algo {
                    (c.workspace as f64 * super::ENGINE_ALLOWANCE) as u64
                } else {
                    c.workspace
                }
            })
            .copied(),
    }
    .unwrap_or(fastest);
    let mut out = vec![first];
    out.extend(fitting.into_iter().filter(|c| c.algo != first.algo));
    if figure == Figure::Least {
        // Smallest first all the way: a call that could not have even the
        // least workspace is out of memory.
        out.sort_by(|a, b| {
            a.workspace
                .cmp(&b.workspace)
                .then(a.time.total_cmp(&b.time))
        });
    }
    out
}

/// The largest workspace a benchmark search takes: the largest any
/// candidate asks for within `max_block` (`getMaxWorkspaceSize` in v7,
/// `generate_and_filter_plans` in v8).
pub fn search_workspace(ranked: &[Candidate], max_block: u64) -> u64 {
    ranked
        .iter()
        .map(|c| c.workspace)
        .filter(|&w| w <= max_block)
        .max()
        .unwrap_or(0)
}

/// The algorithms chosen so far in one process, per shape and direction
/// (PyTorch's `BenchmarkCache`).
#[derive(Debug, Default, Clone)]
pub struct AlgorithmCache {
    pub chosen: HashMap<(ConvProblem, Direction), Candidate>,
}

#[cfg(test)]
mod tests {
    use super::super::conv::DataType;
    use super::*;

    fn settings(cc: &str) -> CudnnSettings {
        CudnnSettings {
            benchmark: false,
            deterministic: false,
            allow_tf32: true,
            v8_api: true,
            gpu: GpuMath::of_compute_capability(cc),
            table: None,
        }
    }

    use super::super::conv::psp_bottleneck;

    #[test]
    fn fp32_on_a_card_without_tf32_ranks_winograd_first() {
        let r = ranked(
            &psp_bottleneck(DataType::F32),
            Direction::Forward,
            &settings("7.0"),
        );
        assert_eq!(r[0].algo, Algo::FwdWinogradNonfused);
        // 144 (4096 * 1024 + 512 * 1024 + 4096 * 512) bytes.
        assert_eq!(
            r[0].workspace,
            144 * (4096 * 1024 + 512 * 1024 + 4096 * 512)
        );
        let half = ranked(
            &psp_bottleneck(DataType::F16),
            Direction::Forward,
            &settings("7.0"),
        );
        assert_eq!(half[0].algo, Algo::FwdImplicitPrecompGemm, "tensor cores");
    }

    /// HALF_PRECISION_TRANSFORM_SLOWDOWN: on a GeForce card whose tensor
    /// cores give half precision only twice its fp32 rate, fp16 still
    /// keeps to the GEMM family in every direction, and no plausible
    /// winner takes nonfused Winograd's workspace (the public fp16 log).
    #[test]
    fn half_precision_keeps_to_tensor_core_gemms_on_an_rtx_4090() {
        let s = settings("8.9");
        for d in [
            Direction::Forward,
            Direction::BackwardData,
            Direction::BackwardFilter,
        ] {
            let r = ranked(&psp_bottleneck(DataType::F16), d, &s);
            assert_eq!(
                r[0].algo.spec().family,
                super::super::cudnn_algos::Family::Gemm,
                "{d:?}: {:?}",
                r[0]
            );
            let high = order(&r, Figure::High, u64::MAX)[0];
            assert!(high.workspace < 64 << 20, "{d:?}: {high:?}");
        }
    }

    #[test]
    fn the_least_figure_takes_the_smallest_workspace() {
        let r = ranked(
            &psp_bottleneck(DataType::F32),
            Direction::BackwardFilter,
            &settings("7.0"),
        );
        let o = order(&r, Figure::Least, u64::MAX);
        assert_eq!(o[0].workspace, 0);
        assert!(o.windows(2).all(|w| w[0].workspace <= w[1].workspace));
        let mut det = settings("7.0");
        det.deterministic = true;
        let r = ranked(
            &psp_bottleneck(DataType::F32),
            Direction::BackwardFilter,
            &det,
        );
        assert!(
            r.iter().all(|c| c.algo != Algo::BwdFilterAlgo0),
            "ALGO_0 is not deterministic"
        );
    }

    #[test]
    fn a_bound_leaves_out_what_does_not_fit_and_the_next_fastest_leads() {
        let r = ranked(
            &psp_bottleneck(DataType::F32),
            Direction::Forward,
            &settings("7.0"),
        );
        let winograd = r[0].workspace;
        let o = order(&r, Figure::Likely, winograd - 1);
        assert!(o.iter().all(|c| c.workspace < winograd));
        assert_ne!(o[0].algo, Algo::FwdWinogradNonfused);
        assert_eq!(
            search_workspace(&r, u64::MAX),
            r.iter().map(|c| c.workspace).max().unwrap()
        );
        assert!(search_workspace(&r, winograd) <= winograd);
    }

    #[test]
    fn low_and_high_span_the_plausible_winners() {
        // A 5x5 plane: Winograd and precomputed GEMM about as fast.
        let p = ConvProblem {
            n: 32,
            c: 256,
            h: 5,
            w: 5,
            k: 486,
            ho: 5,
            wo: 5,
            ..psp_bottleneck(DataType::F32)
        };
        let r = ranked(&p, Direction::Forward, &settings("6.1"));
        let low = order(&r, Figure::Low, u64::MAX)[0];
        let high = order(&r, Figure::High, u64::MAX)[0];
        assert!(low.workspace < high.workspace, "{low:?} {high:?}");
        let likely = order(&r, Figure::Likely, u64::MAX)[0];
        assert!((low.workspace..=high.workspace).contains(&likely.workspace));
    }
}
