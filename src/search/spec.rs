//! The search settings: what the command line gives, else what the config's
//! `segtune` dict says, else the defaults. Typed here; the JSON schema
//! (`segtune schema search`) documents the `segtune` dict.

use crate::config::{self, Value};
use crate::error::{Error, Result};
use crate::kinds::{GpuChoice, Vram};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most data-parallel GPUs a search or an estimate takes: far above any
/// MMSeg run (its zoo trains on 4 to 8), low enough that batch x
/// accumulation x GPUs never overflows.
pub const MAX_GPUS: i64 = 4096;

/// What the ranking favours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// The recipe's crop if anything fits at it, then throughput.
    #[default]
    KeepCrop,
    /// Images per second alone.
    Throughput,
}

crate::named::named_enum!(Objective, "an objective", {
    KeepCrop => "keep-crop",
    Throughput => "throughput",
});

/// Where candidates are evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSetting {
    /// A CUDA device if there is one, else predicted.
    #[default]
    Auto,
    /// Predicted from CPU traces.
    Cpu,
    /// Measured on this CUDA device.
    Cuda(usize),
}

/// A `--device` value that names no device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`--device {0}`: write auto, cpu, cuda or cuda:N")]
pub struct UnknownDevice(pub String);

impl std::str::FromStr for DeviceSetting {
    type Err = UnknownDevice;
    fn from_str(s: &str) -> std::result::Result<DeviceSetting, UnknownDevice> {
        match s {
            "auto" => Ok(DeviceSetting::Auto),
            other => match other.parse::<crate::kinds::DeviceChoice>() {
                Ok(crate::kinds::DeviceChoice::Cpu) => Ok(DeviceSetting::Cpu),
                Ok(crate::kinds::DeviceChoice::Cuda(i)) => Ok(DeviceSetting::Cuda(i)),
                Err(_) => Err(UnknownDevice(other.to_string())),
            },
        }
    }
}

/// The search settings: from the CLI, or a `segtune` section of the config.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct SearchSpec {
    /// The GPU: `vram` (and `compute_capability`) or `preset`.
    #[serde(flatten)]
    pub gpu: GpuChoice,
    /// Fraction of the VRAM kept free (default 0.05).
    pub margin: Option<f64>,
    /// `keep-crop` (default) or `throughput`.
    pub objective: Option<Objective>,
    /// `auto` (default), `cpu` (predict) or `cuda:N` (measure).
    pub device: Option<String>,
    /// GPUs training data-parallel (default 1): the batch is per GPU, the
    /// effective batch is batch x accumulation x gpus, and every GPU holds
    /// DDP's gradient buckets.
    pub gpus: Option<i64>,
    /// The PyTorch release to predict for (`"1.13"`; default: the torch of
    /// the Python environment, else the newest segtune knows).
    pub torch: Option<crate::kinds::TorchVersion>,
    /// The effective batch to keep (GPUs x batch x accumulation), where the
    /// config and its file name do not say it as the user trains (default:
    /// `auto_scale_lr.base_batch_size`, else the name's `NxbB` where it
    /// agrees with the config, else batch x GPUs x accumulation).
    #[serde(default)]
    pub effective_batch: Option<i64>,
    /// `keep-updates` (default: iteration-counted settings scaled so the
    /// recipe's optimizer updates are kept) or `keep-iters`.
    #[serde(default)]
    pub schedule: Option<super::recipe::Schedule>,
}

impl SearchSpec {
    /// The `segtune` dict of a resolved config.
    pub fn from_config(cfg: &config::Dict) -> Result<SearchSpec> {
        let d = segtune_section(cfg)?;
        let get = |k: &str| d.and_then(|d| d.get(k));
        let s = |k: &str| -> Result<Option<String>> {
            match get(k) {
                None | Some(Value::None) => Ok(None),
                Some(Value::Str(v)) => Ok(Some(v.clone())),
                Some(other) => Err(bad(format!(
                    "`segtune.{k}` must be a string, not {} {}",
                    other.type_name(),
                    config::value::python_repr(other)
                ))),
            }
        };
        let objective = s("objective")?
            .map(|o| o.parse::<Objective>())
            .transpose()
            .map_err(|e| bad(format!("`segtune.objective`: {e}")))?;
        let vram = s("vram")?
            .map(|v| v.parse::<Vram>())
            .transpose()
            .map_err(|e| bad(format!("`segtune.vram`: {e}")))?;
        let margin = match get("margin") {
            None | Some(Value::None) => None,
            Some(v) => match v.as_f64() {
                Some(m) if (0.0..=0.9).contains(&m) => Some(m),
                _ => {
                    return Err(bad(format!(
                        "`segtune.margin` must be a number between 0 and 0.9, not {}",
                        config::value::python_repr(v)
                    )))
                }
            },
        };
        let whole = |key: &str, max: i64| -> Result<Option<i64>> {
            match get(key) {
                None | Some(Value::None) => Ok(None),
                Some(v) => match v.as_i64() {
                    Some(n) if (1..=max).contains(&n) => Ok(Some(n)),
                    _ => Err(bad(format!(
                        "`segtune.{key}` must be a whole number from 1 to {max}, not {}",
                        config::value::python_repr(v)
                    ))),
                },
            }
        };
        let gpus = whole("gpus", MAX_GPUS)?;
        let effective_batch = whole("effective_batch", 1_000_000)?;
        let schedule = s("schedule")?
            .map(|o| o.parse::<super::recipe::Schedule>())
            .transpose()
            .map_err(|e| bad(format!("`segtune.schedule`: {e}")))?;
        if let Some(v @ (Value::Float(_) | Value::Int(_))) = get("torch") {
            return Err(bad(format!(
                "`segtune.torch` must be a string such as '1.13', not the number {} (a number loses 1.10's trailing 0)",
                config::value::python_repr(v)
            )));
        }
        let torch = s("torch")?
            .map(|v| v.parse::<crate::kinds::TorchVersion>())
            .transpose()
            .map_err(|e| bad(format!("`segtune.torch`: {e}")))?;
        Ok(SearchSpec {
            torch,
            gpu: GpuChoice {
                vram,
                preset: s("preset")?,
                compute_capability: s("compute_capability")?,
            },
            margin,
            objective,
            device: s("device")?,
            gpus,
            effective_batch,
            schedule,
        })
    }

    /// These settings where given, else `fallback`'s. A GPU named one way
    /// (`vram` or `preset`) here hides the other way in `fallback`.
    pub fn or(self, fallback: SearchSpec) -> SearchSpec {
        // The GPU is named as a whole, on the command line or in the
        // config: a config's compute capability is of its GPU.
        let gpu = if self.gpu.names_a_gpu() {
            self.gpu
        } else {
            GpuChoice {
                compute_capability: self
                    .gpu
                    .compute_capability
                    .or(fallback.gpu.compute_capability),
                ..fallback.gpu
            }
        };
        SearchSpec {
            gpu,
            margin: self.margin.or(fallback.margin),
            objective: self.objective.or(fallback.objective),
            device: self.device.or(fallback.device),
            gpus: self.gpus.or(fallback.gpus),
            torch: self.torch.or(fallback.torch),
            effective_batch: self.effective_batch.or(fallback.effective_batch),
            schedule: self.schedule.or(fallback.schedule),
        }
    }

    /// Where to evaluate (default auto).
    pub fn device_setting(&self) -> Result<DeviceSetting> {
        self.device
            .as_deref()
            .map_or(Ok(DeviceSetting::Auto), str::parse)
            .map_err(|e| Error::Input(e.to_string()))
    }
}

/// An error in the config's `segtune` settings.
fn bad(what: String) -> Error {
    Error::Input(format!("the config's `segtune` settings: {what}"))
}

/// The config's `segtune` dict (`None` without one), its keys checked.
fn segtune_section(cfg: &config::Dict) -> Result<Option<&config::Dict>> {
    const KEYS: [&str; 10] = [
        "effective_batch",
        "schedule",
        "vram",
        "preset",
        "margin",
        "objective",
        "device",
        "compute_capability",
        "gpus",
        "torch",
    ];
    let d = match cfg.get("segtune") {
        None => None,
        Some(Value::Dict(d)) => Some(d),
        Some(other) => {
            return Err(bad(format!(
                "`segtune` must be a dict, e.g. segtune = dict(preset='rtx3050ti'), not {} {}",
                other.type_name(),
                config::value::python_repr(other)
            )))
        }
    };
    if let Some(key) = d.and_then(|d| d.keys().find(|k| !KEYS.contains(&k.as_str()))) {
        return Err(bad(format!(
            "unknown key `segtune.{key}`; the keys are {}",
            KEYS.join(", ")
        )));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_overrides_the_config_and_a_gpu_hides_the_other() {
        let from_cli = SearchSpec {
            gpu: GpuChoice::custom("8G".parse().unwrap(), None),
            ..SearchSpec::default()
        };
        let from_cfg = SearchSpec {
            gpu: GpuChoice::preset("rtx3050ti"),
            margin: Some(0.1),
            ..SearchSpec::default()
        };
        let spec = from_cli.or(from_cfg);
        assert_eq!(spec.gpu.vram.map(|v| v.to_string()).as_deref(), Some("8G"));
        assert_eq!(spec.gpu.preset, None);
        assert_eq!(spec.margin, Some(0.1));
    }

    #[test]
    fn devices_and_objectives_parse() {
        assert_eq!("auto".parse(), Ok(DeviceSetting::Auto));
        assert_eq!("cuda:1".parse(), Ok(DeviceSetting::Cuda(1)));
        assert!("gpu".parse::<DeviceSetting>().is_err());
        assert_eq!("throughput".parse(), Ok(Objective::Throughput));
        assert!("fastest".parse::<Objective>().is_err());
    }
}
