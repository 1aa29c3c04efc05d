//! A card's rates as the step-time model needs them: math rates by data
//! type and kernel class (tensor cores only where the card and the data
//! type allow), memory bandwidth, and the links a step's bytes cross.

use super::rules::KernelClass;
use crate::predict::kernels::conv::DataType;
use crate::predict::Budget;

/// A GPU's rates (TFLOPS, GB/s).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Card {
    pub fp32_tflops: f64,
    /// TF32 tensor cores (0: none).
    pub tf32_tflops: f64,
    /// fp16 tensor cores, fp32 accumulate (0 or below fp32: none).
    pub fp16_tflops: f64,
    pub bf16_tflops: f64,
    pub bandwidth_gbs: f64,
    /// The link DDP all-reduces over, one direction.
    pub link_gbs: f64,
    /// The host-to-device copy of the batch (pinned PCIe).
    pub host_link_gbs: f64,
    /// Tensor cores (Volta and newer): half precision and TF32 GEMMs run on
    /// them, at their efficiency; else half precision runs on CUDA cores
    /// (the P100's double-rate fp16) or in fp32.
    pub tensor_cores: bool,
    /// The L2 cache: a memory-bound kernel's bytes that fit in it come
    /// from it (a producer's output still there) at `Efficiencies::l2`
    /// times the DRAM bandwidth.
    pub l2_bytes: f64,
}

impl Card {
    /// The rates of the budget's card.
    pub fn of_budget(budget: &Budget) -> Card {
        Card {
            fp32_tflops: budget.fp32_tflops,
            tf32_tflops: budget.tf32_tflops,
            fp16_tflops: budget.fp16_tflops,
            bf16_tflops: if budget.bf16 { budget.bf16_tflops } else { 0.0 },
            bandwidth_gbs: budget.bandwidth_gbs.max(1.0),
            link_gbs: if budget.link_gbs > 0.0 {
                budget.link_gbs
            } else {
                default_link_gbs(&budget.compute_capability)
            },
            host_link_gbs: 12.0,
            tensor_cores: budget.tensor_cores
                || budget.fast_half() && !budget.compute_capability.starts_with('6'),
            l2_bytes: budget.l2_bytes as f64,
        }
    }

    /// The rates of a card.
    pub fn of_gpu(gpu: &crate::predict::Gpu) -> Card {
        Card {
            fp32_tflops: gpu.fp32_tflops,
            tf32_tflops: gpu.tf32_tflops,
            fp16_tflops: gpu.fp16_tflops,
            bf16_tflops: if gpu.bf16 { gpu.bf16_tflops } else { 0.0 },
            bandwidth_gbs: gpu.bandwidth_gbs.max(1.0),
            link_gbs: if gpu.link_gbs > 0.0 {
                gpu.link_gbs
            } else {
                default_link_gbs(&gpu.compute_capability)
            },
            host_link_gbs: 12.0,
            tensor_cores: gpu.tensor_cores,
            l2_bytes: gpu.l2_bytes as f64,
        }
    }

    /// The peak (TFLOPS) a GEMM (cuBLAS) or convolution (cuDNN) of `dtype`
    /// runs at, and whether it is the tensor cores' (else the CUDA cores',
    /// at their efficiency). fp32 convolutions take
    /// TF32 where the card has it (`cudnn.allow_tf32`, True by default);
    /// fp32 matmuls do not (`cuda.matmul.allow_tf32`, False by default);
    /// half precision without tensor cores computes in fp32.
    pub fn math_rate(&self, class: KernelClass, dtype: DataType) -> (f64, bool) {
        let fp32 = (self.fp32_tflops.max(0.1), false);
        let tensor = |rate: f64| {
            if rate > self.fp32_tflops * 1.2 {
                (rate, self.tensor_cores)
            } else {
                fp32
            }
        };
        match dtype {
            DataType::F16 => tensor(self.fp16_tflops),
            DataType::Bf16 => tensor(self.bf16_tflops),
            DataType::F32 if class == KernelClass::Conv => tensor(self.tf32_tflops),
            DataType::F32 | DataType::F64 => fp32,
        }
    }
}

/// PCIe's one-direction bandwidth a card of `compute_capability` most
/// often sits on (GB/s): 3.0 x16 before Ampere, 4.0 x16 from it, 5.0 x16
/// on Hopper's PCIe cards and Blackwell. An NVLink card states its own.
pub fn default_link_gbs(compute_capability: &str) -> f64 {
    let major: u32 = compute_capability
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(8);
    match major {
        0..=7 => 15.75,
        8 => 31.5,
        _ => 63.0,
    }
}
