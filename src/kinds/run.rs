//! Where a trial runs (`--device`) and what it runs (`--mode`: training or
//! inference steps).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
/// Where a trial runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    #[default]
    Cpu,
    /// A CUDA device by index.
    Cuda(usize),
}

/// A `--device` value that names no device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`--device {given}`: write cpu, cuda or cuda:N")]
pub struct UnknownDevice {
    /// What was given.
    pub given: String,
}

impl std::str::FromStr for DeviceChoice {
    type Err = UnknownDevice;
    /// `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<DeviceChoice, UnknownDevice> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| UnknownDevice {
                    given: other.to_string(),
                }),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// What a trial runs: training steps, or inference (test) steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunMode {
    /// `train_step`: forward, loss, backward, optimizer.
    #[default]
    Train,
    /// `test_step` under `torch.no_grad()`: the test path of the data
    /// preprocessor, `predict` with `model.test_cfg`, the postprocess.
    Infer,
}

crate::named::named_enum!(RunMode, "a run mode", {
    Train => "train",
    Infer => "infer",
});

/// As the command line writes it (`cpu`, `cuda:1`).
impl serde::Serialize for DeviceChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for DeviceChoice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<DeviceChoice, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
