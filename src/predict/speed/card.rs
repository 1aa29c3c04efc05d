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
    pub fn of_budget(b: &Budget) -> Card {
        let rates = [b.fp32_tflops, b.tf32_tflops, b.fp16_tflops, b.bf16_tflops];
        Card::of_rates(
            rates,
            b.bf16,
            b.bandwidth_gbs,
            b.link_gbs,
            b.tensor_cores,
            b.l2_bytes,
        )
    }

    /// The rates of a card.
    pub fn of_gpu(g: &crate::predict::Gpu) -> Card {
        let rates = [g.fp32_tflops, g.tf32_tflops, g.fp16_tflops, g.bf16_tflops];
        Card::of_rates(
            rates,
            g.bf16,
            g.bandwidth_gbs,
            g.link_gbs,
            g.tensor_cores,
            g.l2_bytes,
        )
    }

    /// `[fp32, tf32, fp16, bf16]` TFLOPS (bf16 counted where the card runs
    /// it), bandwidth and link in GB/s, L2 in bytes.
    fn of_rates(
        [fp32, tf32, fp16, bf16]: [f64; 4],
        has_bf16: bool,
        bandwidth_gbs: f64,
        link_gbs: f64,
        tensor_cores: bool,
        l2_bytes: u64,
    ) -> Card {
        Card {
            fp32_tflops: fp32,
            tf32_tflops: tf32,
            fp16_tflops: fp16,
            bf16_tflops: if has_bf16 { bf16 } else { 0.0 },
            bandwidth_gbs: bandwidth_gbs.max(1.0),
            link_gbs: link_gbs.max(1.0),
            host_link_gbs: 12.0,
            tensor_cores,
            l2_bytes: l2_bytes as f64,
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
