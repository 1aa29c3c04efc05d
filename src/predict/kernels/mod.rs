//! What CUDA kernels allocate through the caching allocator beyond the
//! tensors ATen returns, at their place in a traced step: cuDNN's
//! convolution workspaces (chosen per call, bounded by the memory free at
//! that moment, falling back to a smaller one when it cannot be had), the
//! scratch of ATen's own kernels, and cuBLAS's workspaces. A replay hands
//! each recorded kernel call ([`KernelCall`]) to [`KernelScratch::at_call`],
//! which makes the allocations on the allocator model.
//!
//! - `conv.rs`: a convolution call's problem, directions and backend;
//! - `cudnn_algos.rs`: the algorithms, their support and workspaces;
//! - `cudnn_speed.rs`: which one is fastest on a GPU;
//! - `cudnn.rs`: the choice call by call (heuristics, benchmark, cache);
//! - `workspace_table.rs`: measured choices and workspaces of a real GPU;
//! - `native.rs`: ATen's CUDA kernels' scratch.

pub mod conv;
pub mod cudnn;
pub mod cudnn_algos;
pub mod cudnn_speed;
pub mod native;
pub mod workspace_table;

use super::allocator::{Allocator, OutOfMemory};
use crate::trial::kernel_calls::KernelCall;
use crate::trial::trace::{phase_of, Phase};
use conv::{conv_call, ConvBackend, Direction};
use cudnn::{order, ranked, search_workspace, AlgorithmCache, CudnnSettings, Figure};
use cudnn_speed::GpuMath;
use std::collections::HashSet;

/// The GPU-side behaviour a replay reproduces at kernel calls.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelModel {
    pub cudnn: CudnnSettings,
    pub figure: Figure,
    /// A bf16 tensor of the trace is fp16 on the GPU (`--amp fp16`).
    pub half_is_fp16: bool,
    /// cuBLAS's workspace per (handle, stream), taken from the caching
    /// allocator on a thread's first matrix product and kept (0: cuBLAS
    /// manages it itself, PyTorch before 1.13).
    pub cublas_workspace: u64,
    /// `binary_cross_entropy_with_logits` takes four input-sized
    /// temporaries (PyTorch up to 2.2), not one.
    pub bce_with_logits_four_temporaries: bool,
}

impl KernelModel {
    pub fn gpu(&self) -> &GpuMath {
        &self.cudnn.gpu
    }
}

/// The ops whose first call on a thread takes cuBLAS's workspace.
const MATMULS: &[&str] = &["aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"];

/// Told after each scratch allocation: the allocator, and the transient
/// scratch live then (what, bytes).
pub type PeakObserver<'a> = dyn FnMut(&Allocator, &[(&'static str, u64)]) + 'a;

/// What a replay's kernel calls did, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ScratchSummary {
    /// Convolution directions run, and how many of them could not have
    /// their preferred algorithm's workspace (took a slower one).
    pub conv_runs: usize,
    pub squeezed: usize,
    /// Modelled convolution time of the chosen algorithms over that of the
    /// preferred ones, over the last step (1: nothing squeezed).
    pub conv_slowdown: f64,
    /// The convolutions' FLOPs in the last step (all directions).
    pub conv_flops: f64,
    /// The largest workspace a convolution took, and a benchmark search.
    pub largest_workspace: u64,
    pub largest_search_workspace: u64,
    /// Benchmark searches run (first calls of a shape).
    pub searches: usize,
    /// A search could not have its workspace (v7: an out-of-memory).
    pub search_failed: bool,
}

/// One replay's kernel state: the algorithms chosen so far, the cuBLAS
/// handles that have their workspace, the scratch live now.
pub struct KernelScratch<'m> {
    model: &'m KernelModel,
    cache: AlgorithmCache,
    /// The candidates of each shape and direction, ranked once.
    ranked: std::collections::HashMap<(conv::ConvProblem, Direction), Vec<cudnn::Candidate>>,
    cublas_threads: HashSet<bool>,
    next_id: u64,
    /// Persistent allocations (cuBLAS workspaces): (what, bytes).
    persistent: Vec<(&'static str, u64)>,
    summary: ScratchSummary,
    chosen_time: f64,
    preferred_time: f64,
    last_step: usize,
}

/// `SEGTUNE_KERNEL_LOG=1`: every convolution of the measured step, its
/// algorithm and workspace, on stderr.
static KERNEL_LOG: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("SEGTUNE_KERNEL_LOG").is_some());

/// How much more workspace than the formula gives the fastest algorithm
/// may take at the high end of the range. The formulas are cuDNN 7.5's
/// (`cudnn_algos.rs`); cuDNN 8 and 9 run the same families as engines whose
/// workspaces no public table gives. Public MMSeg 1.x logs
/// (`tests/fixtures/mmseg_logs.tsv`, all with `cudnn_benchmark=True`) show
/// the factor at the convolution that makes the peak: 1.0 for most setups
/// (PSPNet at 512x1024, 128x96, 192x192, 384x384, DeepLabV3+, ViT), 1.39
/// for PSPNet R-50-D8 8x256x256 (its 4096 -> 512 bottleneck's backward,
/// nonfused Winograd, 612 MiB by the formula) on most cards, 2.0 for the
/// same on a T4, 1.93 for UPerNet R-50 8x512x512's 3024 MiB on an RTX 3090.
/// The likeliest figure keeps the formula (the common case); the high end
/// allows the largest factor seen. A GPU settles it per shape:
/// scripts/gpu-validate.sh records every convolution's workspace.
pub const ENGINE_ALLOWANCE: f64 = 2.0;

/// Ids of the replay's own allocations (above the trace's and the batch's).
const SCRATCH_IDS: u64 = 3 << 61;

impl ScratchSummary {
    /// The step's slowdown from squeezed convolutions, for a step of
    /// `step_flops` in all: the convolutions' share of it runs
    /// `conv_slowdown` times slower.
    pub fn step_slowdown(&self, step_flops: f64) -> f64 {
        if step_flops <= 0.0 || self.conv_slowdown <= 1.0 {
            return 1.0;
        }
        let share = (self.conv_flops / step_flops).min(1.0);
        1.0 + share * (self.conv_slowdown - 1.0)
    }
}

impl<'m> KernelScratch<'m> {
    pub fn new(model: &'m KernelModel, last_step: usize) -> KernelScratch<'m> {
        KernelScratch {
            model,
            cache: AlgorithmCache::default(),
            ranked: std::collections::HashMap::new(),
            cublas_threads: HashSet::new(),
            next_id: SCRATCH_IDS,
            persistent: Vec::new(),
            summary: ScratchSummary::default(),
            chosen_time: 0.0,
            preferred_time: 0.0,
            last_step,
        }
    }

    pub fn summary(&self) -> ScratchSummary {
        let mut s = self.summary;
        s.conv_slowdown = if self.preferred_time > 0.0 {
            self.chosen_time / self.preferred_time
        } else {
            1.0
        };
        s
    }

    /// The persistent scratch (cuBLAS workspaces) allocated so far.
    pub fn persistent(&self) -> &[(&'static str, u64)] {
        &self.persistent
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Makes the call's allocations on `alloc`. `peak` is told after each
    /// allocation, with the transient scratch live then (what, bytes).
    /// `Err` is an out-of-memory the step cannot survive.
    pub fn at_call(
        &mut self,
        call: &KernelCall,
        alloc: &mut Allocator,
        peak: &mut PeakObserver,
    ) -> Result<(), OutOfMemory> {
        let (step, phase) = phase_of(call.phase);
        let measured = step == self.last_step;
        if MATMULS.contains(&call.op.as_str()) {
            // Forward ops run on the main thread, backward ones on the
            // autograd engine's device thread: two cuBLAS handles.
            let backward_thread = phase == Phase::Backward;
            if self.model.cublas_workspace > 0 && self.cublas_threads.insert(backward_thread) {
                let id = self.id();
                alloc.malloc(id, self.model.cublas_workspace)?;
                self.persistent
                    .push(("cuBLAS workspace", self.model.cublas_workspace));
                peak(alloc, &[]);
            }
            return Ok(());
        }
        if let Some(conv) = conv_call(call, self.model.half_is_fp16) {
            if conv.backend != ConvBackend::Cudnn {
                return Ok(());
            }
            for direction in conv.directions {
                self.convolution(&conv.problem, direction, measured, alloc, peak)?;
            }
            return Ok(());
        }
        let scratch = native::scratch(
            call,
            self.model.gpu(),
            self.model.bce_with_logits_four_temporaries,
        );
        let mut live: Vec<(&'static str, u64)> = Vec::new();
        let mut ids = Vec::new();
        for (what, bytes) in scratch {
            let id = self.id();
            alloc.malloc(id, bytes)?;
            ids.push(id);
            live.push((what, bytes));
            peak(alloc, &live);
        }
        for id in ids {
            alloc.free(id);
        }
        Ok(())
    }

    /// One direction of a cuDNN convolution: the candidates (ranked once
    /// per shape), the order this call tries them in (after a benchmark
    /// search on a shape's first call), then the first whose workspace can
    /// be had.
    fn convolution(
        &mut self,
        p: &conv::ConvProblem,
        direction: Direction,
        measured: bool,
        alloc: &mut Allocator,
        peak: &mut PeakObserver,
    ) -> Result<(), OutOfMemory> {
        let key = (*p, direction);
        let s = &self.model.cudnn;
        let ranked = self
            .ranked
            .entry(key)
            .or_insert_with(|| ranked(p, direction, s))
            .clone();
        if ranked.is_empty() {
            return Ok(());
        }
        let tries = self.tries(&key, &ranked, alloc, peak)?;
        for c in tries {
            if self.take_workspace(&c, ranked[0].algo, alloc, peak) {
                self.chose(p, direction, c, &ranked, measured, alloc);
                return Ok(());
            }
        }
        // Not even the smallest workspace could be had.
        let least = order(&ranked, Figure::Least, u64::MAX)[0].workspace;
        Err(OutOfMemory {
            requested: least,
            stats: alloc.stats(),
        })
    }

    /// The candidates in the order this call tries them: the shape's cached
    /// choice first; on a shape's first call with benchmark on, those whose
    /// workspace fit the search's.
    fn tries(
        &mut self,
        key: &(conv::ConvProblem, Direction),
        ranked: &[cudnn::Candidate],
        alloc: &mut Allocator,
        peak: &mut PeakObserver,
    ) -> Result<Vec<cudnn::Candidate>, OutOfMemory> {
        let figure = self.model.figure;
        if let Some(cached) = self.cache.chosen.get(key).copied() {
            let mut tries = vec![cached];
            tries.extend(order(ranked, figure, u64::MAX));
            return Ok(tries);
        }
        if self.model.cudnn.benchmark && figure != Figure::Least {
            let bound = self.benchmark_search(ranked, alloc, peak)?;
            return Ok(order(ranked, figure, bound));
        }
        Ok(order(ranked, figure, u64::MAX))
    }

    /// The benchmark search of a shape's first call: one workspace as large
    /// as any candidate needs within the largest free block (v8 halves it
    /// until it fits; v7's out-of-memory there is not caught), then
    /// emptyCache. Returns the workspace the search had.
    fn benchmark_search(
        &mut self,
        ranked: &[cudnn::Candidate],
        alloc: &mut Allocator,
        peak: &mut PeakObserver,
    ) -> Result<u64, OutOfMemory> {
        let v8 = self.model.cudnn.v8_api;
        let mut bound = search_workspace(ranked, alloc.max_block_size());
        let id = self.id();
        while bound > 0 {
            match alloc.malloc(id, bound) {
                Ok(()) => {
                    peak(alloc, &[("cuDNN benchmark search workspace", bound)]);
                    break;
                }
                Err(_) if v8 => bound /= 2,
                Err(e) => {
                    self.summary.search_failed = true;
                    return Err(e);
                }
            }
        }
        self.summary.searches += 1;
        self.summary.largest_search_workspace = self.summary.largest_search_workspace.max(bound);
        if bound > 0 {
            if v8 {
                alloc.free(id);
                alloc.empty_cache();
            } else {
                alloc.empty_cache();
                alloc.free(id);
            }
        }
        Ok(bound)
    }

    /// Allocates and frees `c`'s workspace for the call; false where it
    /// cannot be had. cuDNN 8's engines may take more than the formula where
    /// that fits: the high end allows the fastest algorithm the largest
    /// factor seen (ENGINE_ALLOWANCE).
    fn take_workspace(
        &mut self,
        c: &cudnn::Candidate,
        fastest: cudnn_algos::Algo,
        alloc: &mut Allocator,
        peak: &mut PeakObserver,
    ) -> bool {
        if c.workspace == 0 {
            return true;
        }
        let mut sizes = vec![c.workspace];
        if self.model.figure == Figure::High && c.algo == fastest {
            sizes.insert(0, (c.workspace as f64 * ENGINE_ALLOWANCE) as u64);
        }
        for bytes in sizes {
            let id = self.id();
            if alloc.malloc(id, bytes).is_ok() {
                peak(alloc, &[("cuDNN workspace", bytes)]);
                alloc.free(id);
                return true;
            }
        }
        false
    }

    /// Records the choice: the shape's cache, the summary, and in the
    /// measured step its time against the unbounded choice's.
    fn chose(
        &mut self,
        p: &conv::ConvProblem,
        direction: Direction,
        c: cudnn::Candidate,
        ranked: &[cudnn::Candidate],
        measured: bool,
        alloc: &Allocator,
    ) {
        let figure = self.model.figure;
        if *KERNEL_LOG && measured {
            eprintln!(
                "kernel {:?} {} {}x{}x{}x{} k{} {}x{} s{:?} d{:?} g{} {:?}: {} ws {} MiB at {} MiB allocated",
                figure,
                direction.name(),
                p.n, p.c, p.h, p.w, p.k, p.r, p.s, p.stride, p.dilation, p.groups, p.dtype,
                c.algo.name(),
                c.workspace >> 20,
                alloc.stats().allocated >> 20
            );
        }
        self.cache.chosen.insert((*p, direction), c);
        self.summary.largest_workspace = self.summary.largest_workspace.max(c.workspace);
        if measured {
            // What this figure takes when nothing bounds it: a call that
            // had to settle for less is squeezed (slower than it would be).
            let unbounded = order(ranked, figure, u64::MAX)[0];
            self.summary.conv_runs += 1;
            self.summary.conv_flops += p.flops();
            self.chosen_time += c.time;
            self.preferred_time += unbounded.time.min(c.time);
            if c.algo != unbounded.algo && c.time > unbounded.time {
                self.summary.squeezed += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::allocator::AllocatorSettings;

    const MIB: u64 = 1 << 20;

    /// PSPNet's bottleneck at 256x256 (batch 8: 4096 -> 512 channels, 3x3
    /// at 32x32), fp32, in the measured step's forward.
    fn bottleneck() -> KernelCall {
        KernelCall::from_line(
            "k 0 9 0 aten::convolution t:f32:8x4096x32x32 t:f32:512x4096x3x3 - l:1,1 l:1,1 l:1,1 b:0 l:0,0 i:1",
        )
        .unwrap()
    }

    /// sm 7.0 (no TF32: nonfused Winograd wins fp32 3x3, with hundreds of
    /// MiB of workspace), benchmark as given, the v8 API unless `v7`.
    fn model(benchmark: bool, v7: bool, figure: Figure) -> KernelModel {
        KernelModel {
            cudnn: CudnnSettings {
                benchmark,
                deterministic: false,
                allow_tf32: true,
                v8_api: !v7,
                gpu: GpuMath::of_compute_capability("7.0"),
                table: None,
            },
            figure,
            half_is_fp16: false,
            cublas_workspace: 8 * MIB + 128 * 1024,
            bce_with_logits_four_temporaries: false,
        }
    }

    /// Runs `call` on an allocator of `capacity` that already holds `held`
    /// bytes; returns the summary, the peak allocated during the call and
    /// the allocator.
    fn run(
        m: &KernelModel,
        call: &KernelCall,
        capacity: Option<u64>,
        held: u64,
    ) -> (Result<(), OutOfMemory>, ScratchSummary, u64, Allocator) {
        let mut alloc = Allocator::new(capacity, AllocatorSettings::default());
        alloc.malloc(1, held).unwrap();
        let mut scratch = KernelScratch::new(m, 1);
        let mut peak = alloc.stats().allocated;
        let r = scratch.at_call(call, &mut alloc, &mut |a, _| {
            peak = peak.max(a.stats().allocated)
        });
        (r, scratch.summary(), peak, alloc)
    }

    /// Conv_v7.cpp `AlgoIterator::try_all` and Conv_v8.cpp's plan loop: an
    /// algorithm whose workspace cannot be had is skipped for the next.
    #[test]
    fn with_a_capacity_a_convolution_whose_preferred_workspace_does_not_fit_takes_the_next_algorithm(
    ) {
        let m = model(false, false, Figure::Likely);
        let (ok, roomy, _, _) = run(&m, &bottleneck(), None, 512 * MIB);
        assert!(ok.is_ok());
        let preferred = roomy.largest_workspace;
        assert!(preferred > 256 * MIB, "Winograd's transforms: {preferred}");
        assert_eq!(roomy.squeezed, 0);
        // Room for the tensors and 64 MiB more: the preferred workspace
        // cannot be had.
        let (ok, tight, peak, alloc) = run(&m, &bottleneck(), Some(576 * MIB), 512 * MIB);
        assert!(
            ok.is_ok(),
            "never an out-of-memory while a smaller workspace fits"
        );
        assert!(tight.largest_workspace < 64 * MIB, "{tight:?}");
        assert_eq!(tight.squeezed, 1);
        assert!(tight.conv_slowdown > 1.0, "the fallback is slower");
        assert!(peak <= 576 * MIB);
        assert_eq!(
            alloc.stats().allocated,
            512 * MIB,
            "the workspace is freed after the call"
        );
    }

    /// The least figure takes the smallest workspace whatever the room.
    #[test]
    fn the_least_figure_runs_with_the_smallest_workspace() {
        let m = model(true, false, Figure::Least);
        let (ok, s, peak, _) = run(&m, &bottleneck(), None, 512 * MIB);
        assert!(ok.is_ok());
        assert_eq!(s.searches, 0, "the least figure runs no search");
        assert!(
            peak - 512 * MIB < MIB,
            "implicit GEMM: {}",
            peak - 512 * MIB
        );
    }

    /// `cudnn_benchmark=True`: the search's one workspace is bounded by the
    /// largest block the allocator could give (`cacheInfo`), and the cache
    /// is emptied after it.
    #[test]
    fn a_benchmark_search_is_bounded_by_the_free_memory() {
        for v7 in [false, true] {
            let m = model(true, v7, Figure::Likely);
            let (ok, roomy, roomy_peak, _) = run(&m, &bottleneck(), None, 512 * MIB);
            assert!(ok.is_ok());
            assert_eq!(roomy.searches, 1);
            assert!(roomy.largest_search_workspace >= roomy.largest_workspace);
            assert!(roomy_peak >= 512 * MIB + roomy.largest_search_workspace);
            let capacity = 512 * MIB + 96 * MIB;
            let (ok, tight, peak, alloc) = run(&m, &bottleneck(), Some(capacity), 512 * MIB);
            assert!(ok.is_ok(), "v7 {v7}: {tight:?}");
            assert!(
                tight.largest_search_workspace <= 96 * MIB,
                "v7 {v7}: {tight:?}"
            );
            assert!(peak <= capacity);
            assert!(
                alloc.stats().reserved <= 512 * MIB + 96 * MIB,
                "v7 {v7}: emptyCache after the search"
            );
        }
    }

    /// pytorch/pytorch#83461: one cuBLAS workspace per thread that runs a
    /// matrix product (the forward's and autograd's), kept.
    #[test]
    fn cublas_takes_one_workspace_per_thread_and_keeps_it() {
        let m = model(false, false, Figure::Likely);
        let mut alloc = Allocator::new(None, AllocatorSettings::default());
        let mut scratch = KernelScratch::new(&m, 1);
        for line in [
            "k 0 9 0 aten::mm t:f32:64x64 t:f32:64x64",
            "k 1 9 0 aten::addmm t:f32:64 t:f32:64x64 t:f32:64x64",
            "k 2 10 0 aten::mm t:f32:64x64 t:f32:64x64",
            "k 3 10 0 aten::bmm t:f32:2x64x64 t:f32:2x64x64",
        ] {
            let call = KernelCall::from_line(line).unwrap();
            scratch.at_call(&call, &mut alloc, &mut |_, _| {}).unwrap();
        }
        assert_eq!(scratch.persistent().len(), 2);
        assert_eq!(alloc.stats().allocated, 2 * m.cublas_workspace);
    }
}
