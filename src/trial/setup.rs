//! The training run a trial stands for beyond its step: the software stack
//! whose memory behaviour it reproduces and the data-parallel GPU count.

/// The training software whose memory behaviour a trial reproduces.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
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

impl Stack {
    pub fn name(self) -> &'static str {
        match self {
            Stack::Current => "current",
            Stack::Zoo2021 => "zoo-2021",
        }
    }
}

impl std::fmt::Display for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Stack {
    type Err = String;
    fn from_str(s: &str) -> Result<Stack, String> {
        [Stack::Current, Stack::Zoo2021]
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("`{s}` is not a stack; use current or zoo-2021"))
    }
}

/// The training run around the step: how many GPUs, which software stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrainingSetup {
    /// GPUs training data-parallel (DDP): each also holds DDP's gradient
    /// buckets, one more copy of the trainable parameters.
    pub gpus: i64,
    /// Whose memory behaviour to reproduce.
    pub stack: Stack,
}

impl Default for TrainingSetup {
    fn default() -> TrainingSetup {
        TrainingSetup {
            gpus: 1,
            stack: Stack::Current,
        }
    }
}
