//! The training run a trial or prediction stands for beyond its step: the
//! data-parallel GPU count and the PyTorch and mmcv releases whose memory
//! behaviour it reproduces.

use super::mmcv_version::MmcvVersion;
use super::torch_version::TorchVersion;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The two named software stacks of earlier segtune releases, kept as
/// aliases of PyTorch releases (`--stack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum Stack {
    /// PyTorch 2.x with MMEngine (MMSeg 1.x): what segtune trains with.
    #[default]
    #[serde(rename = "current")]
    Current,
    /// PyTorch <= 1.10 with the mmcv 1.x runner (MMSeg 0.x), the stack that
    /// measured MMSeg's published model-zoo memory: softmax and log_softmax
    /// keep their input for backward (pytorch/pytorch#64000, fixed in 1.11),
    /// and `optimizer.zero_grad()` zeroes gradients instead of freeing them
    /// (`set_to_none=False` before PyTorch 2.0). CPU trials only.
    #[serde(rename = "zoo-2021")]
    Zoo2021,
}

crate::named::named_enum!(Stack, "a stack", {
    Current => "current",
    Zoo2021 => "zoo-2021",
});

impl Stack {
    /// The PyTorch release the stack stands for (mmcv 1.x's runner and
    /// MMEngine hold the same tensors; what moved is PyTorch's).
    pub fn torch(self) -> TorchVersion {
        match self {
            Stack::Current => TorchVersion::NEWEST,
            Stack::Zoo2021 => TorchVersion::ZOO_2021,
        }
    }
}

/// The training run around the step: how many GPUs, which PyTorch and mmcv.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrainingSetup {
    /// GPUs training data-parallel (DDP): each also holds DDP's gradient
    /// buckets, one more copy of the trainable parameters.
    pub gpus: i64,
    /// The PyTorch release whose memory behaviour to reproduce.
    pub torch: TorchVersion,
    /// The mmcv release whose building blocks to reproduce (MMSeg 1.x:
    /// 2.x; older ones for MMSeg 0.x's logs).
    #[serde(default)]
    pub mmcv: MmcvVersion,
}

impl TrainingSetup {
    /// `gpus` training with `torch` on MMSeg 1.x's mmcv (what a search
    /// writes configs for).
    pub fn new(gpus: i64, torch: TorchVersion) -> TrainingSetup {
        TrainingSetup {
            gpus,
            torch,
            mmcv: MmcvVersion::NEWEST,
        }
    }
}

impl Default for TrainingSetup {
    fn default() -> TrainingSetup {
        TrainingSetup {
            gpus: 1,
            torch: TorchVersion::NEWEST,
            mmcv: MmcvVersion::NEWEST,
        }
    }
}
