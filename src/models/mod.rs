//! Models built from a resolved MMSeg config, in libtorch (`tch`), one file
//! per backbone or head, looked up by MMSeg's `type` names. Each reproduces
//! MMSeg's module: the same parameters (names and counts), the same ops, the
//! same tensors saved for backward, so that a training step here allocates
//! what MMSeg's does.
//!
//! Supported now: `EncoderDecoder` with `MixVisionTransformer` and
//! `SegformerHead` (SegFormer B0-B5). The ResNet families, UNet and
//! Mask2Former plug into the same registry ([`BACKBONES`], [`DECODE_HEADS`]).

pub mod decode_head;
pub mod encoder_decoder;
pub mod layers;
pub mod mit;
pub mod params;
pub mod segformer_head;

use crate::config::{Dict, Value};
pub use encoder_decoder::{parse_losses, EncoderDecoder, StepLosses};

/// Why a model cannot be built.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelError {
    /// A `type` segtune has no implementation of.
    UnknownType {
        role: &'static str,
        name: String,
        supported: Vec<&'static str>,
    },
    /// A setting segtune does not implement.
    Unsupported(String),
    /// A setting that is missing or of the wrong type.
    Config(String),
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelError::UnknownType {
                role,
                name,
                supported,
            } => write!(
                f,
                "unknown {role} type `{name}`; segtune supports: {}",
                supported.join(", ")
            ),
            ModelError::Unsupported(what) => write!(f, "not supported yet: {what}"),
            ModelError::Config(what) => write!(f, "bad model config: {what}"),
        }
    }
}

impl std::error::Error for ModelError {}

/// Segmentor types (`model.type`).
pub const SEGMENTORS: &[&str] = &["EncoderDecoder"];
/// Backbone types (`model.backbone.type`).
pub const BACKBONES: &[&str] = &["MixVisionTransformer"];
/// Decode head types (`model.decode_head.type`).
pub const DECODE_HEADS: &[&str] = &["SegformerHead"];

/// Normalisation layer settings (`norm_cfg`), BN only: SyncBN on one device
/// is BN.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormCfg {
    pub eps: f64,
    pub momentum: f64,
    pub requires_grad: bool,
}

impl NormCfg {
    pub fn from_cfg(v: Option<&Value>) -> Result<Option<NormCfg>, ModelError> {
        let d = match v {
            None | Some(Value::None) => return Ok(None),
            Some(Value::Dict(d)) => d,
            Some(other) => {
                return Err(ModelError::Config(format!(
                    "norm_cfg must be a dict, not {}",
                    other.type_name()
                )))
            }
        };
        let ty = d.get("type").and_then(Value::as_str).unwrap_or("");
        if !matches!(ty, "BN" | "BN2d" | "SyncBN" | "MMSyncBN") {
            return Err(ModelError::Unsupported(format!(
                "norm_cfg type `{ty}` (supported: BN, SyncBN)"
            )));
        }
        Ok(Some(NormCfg {
            eps: cfg_f64(d, "eps", 1e-5)?,
            momentum: cfg_f64(d, "momentum", 0.1)?,
            requires_grad: d.get("requires_grad").map(Value::truthy).unwrap_or(true),
        }))
    }

    /// mmcv's name for the norm module inside a ConvModule.
    pub fn module_name(&self) -> &'static str {
        "bn"
    }
}

pub(crate) fn cfg_i64(d: &Dict, key: &str, default: i64) -> Result<i64, ModelError> {
    match d.get(key) {
        None => Ok(default),
        Some(v @ (Value::Int(_) | Value::Bool(_))) => Ok(v.as_i64().unwrap_or(default)),
        Some(other) => Err(ModelError::Config(format!(
            "`{key}` must be an int, not {}",
            other.type_name()
        ))),
    }
}

pub(crate) fn cfg_f64(d: &Dict, key: &str, default: f64) -> Result<f64, ModelError> {
    match d.get(key) {
        None => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| {
            ModelError::Config(format!("`{key}` must be a number, not {}", v.type_name()))
        }),
    }
}

pub(crate) fn cfg_i64_list(d: &Dict, key: &str, default: &[i64]) -> Result<Vec<i64>, ModelError> {
    match d.get(key) {
        None => Ok(default.to_vec()),
        Some(Value::Int(i)) => Ok(vec![*i]),
        Some(v) => v
            .as_seq()
            .and_then(|s| s.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| ModelError::Config(format!("`{key}` must be a list of ints"))),
    }
}

/// The `type` of a sub-config, or an error naming what is missing.
pub(crate) fn type_of<'a>(d: &'a Dict, role: &'static str) -> Result<&'a str, ModelError> {
    d.get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError::Config(format!("{role} has no `type`")))
}

/// Whether segtune can build the model of a resolved config, and if not why.
pub fn check_supported(cfg: &Dict) -> Result<(), ModelError> {
    let model = cfg
        .get("model")
        .and_then(Value::as_dict)
        .ok_or_else(|| ModelError::Config("the config has no `model` dict".into()))?;
    let seg = type_of(model, "model")?;
    if !SEGMENTORS.contains(&seg) {
        return Err(ModelError::UnknownType {
            role: "segmentor",
            name: seg.into(),
            supported: SEGMENTORS.to_vec(),
        });
    }
    let sub = |k: &str| model.get(k).and_then(Value::as_dict);
    let backbone =
        sub("backbone").ok_or_else(|| ModelError::Config("model has no `backbone`".into()))?;
    let bt = type_of(backbone, "backbone")?;
    if !BACKBONES.contains(&bt) {
        return Err(ModelError::UnknownType {
            role: "backbone",
            name: bt.into(),
            supported: BACKBONES.to_vec(),
        });
    }
    let head = match model.get("decode_head") {
        Some(Value::Dict(d)) => d,
        Some(Value::List(_)) => {
            return Err(ModelError::Unsupported(
                "a list of decode heads (CascadeEncoderDecoder)".into(),
            ))
        }
        _ => return Err(ModelError::Config("model has no `decode_head`".into())),
    };
    let ht = type_of(head, "decode_head")?;
    if !DECODE_HEADS.contains(&ht) {
        return Err(ModelError::UnknownType {
            role: "decode head",
            name: ht.into(),
            supported: DECODE_HEADS.to_vec(),
        });
    }
    if model.get("neck").is_some_and(|n| !matches!(n, Value::None)) {
        return Err(ModelError::Unsupported("necks".into()));
    }
    if model
        .get("auxiliary_head")
        .is_some_and(|n| !matches!(n, Value::None))
    {
        return Err(ModelError::Unsupported("auxiliary heads".into()));
    }
    Ok(())
}
