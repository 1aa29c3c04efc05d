//! The losses decode heads train with (`mmseg/models/losses/`), and the
//! pixel accuracy every BaseDecodeHead logs. A head's `loss_decode` is one
//! loss dict or a list of them ([`DecodeLoss`]); segtune implements
//! `CrossEntropyLoss` and `DiceLoss`, the `OHEMPixelSampler` a head can
//! weight its pixels with, and PIDNet's `OhemCrossEntropy` and
//! `BoundaryLoss`, which only heads that call their losses themselves
//! (DDRHead, PIDHead) can take.

pub mod accuracy;
pub mod boundary_loss;
pub mod cross_entropy_loss;
pub mod dice_loss;
pub mod ohem_cross_entropy_loss;
pub mod ohem_pixel_sampler;

pub use accuracy::accuracy;
pub use boundary_loss::BoundaryLossCfg;
pub use cross_entropy_loss::CrossEntropyCfg;
pub use dice_loss::DiceLossCfg;
pub use ohem_cross_entropy_loss::OhemCrossEntropyCfg;
pub use ohem_pixel_sampler::OhemPixelSampler;

use super::ModelError;
use crate::config::{Dict, Value};
use tch::Tensor;

/// One loss of a head's `loss_decode`.
#[derive(Debug, Clone, PartialEq)]
pub enum DecodeLoss {
    CrossEntropy(CrossEntropyCfg),
    Dice(DiceLossCfg),
    OhemCrossEntropy(OhemCrossEntropyCfg),
    Boundary(BoundaryLossCfg),
}

impl DecodeLoss {
    /// The loss item's name (`loss_ce`, `loss_dice`).
    pub fn loss_name(&self) -> &str {
        match self {
            DecodeLoss::CrossEntropy(l) => &l.loss_name,
            DecodeLoss::Dice(l) => &l.loss_name,
            DecodeLoss::OhemCrossEntropy(l) => &l.loss_name,
            DecodeLoss::Boundary(l) => &l.loss_name,
        }
    }

    /// Whether BaseDecodeHead's `loss_by_feat` can call it: its `forward`
    /// takes `weight` and `ignore_index` (`OhemCrossEntropy` and
    /// `BoundaryLoss` do not: MMSeg raises a `TypeError`).
    pub fn takes_base_head_call(&self) -> bool {
        matches!(self, DecodeLoss::CrossEntropy(_) | DecodeLoss::Dice(_))
    }

    /// The MMSeg type name.
    pub fn type_name(&self) -> &'static str {
        match self {
            DecodeLoss::CrossEntropy(_) => "CrossEntropyLoss",
            DecodeLoss::Dice(_) => "DiceLoss",
            DecodeLoss::OhemCrossEntropy(_) => "OhemCrossEntropy",
            DecodeLoss::Boundary(_) => "BoundaryLoss",
        }
    }

    /// `loss_decode[i](pred, label)`, the positional call of the heads that
    /// call their losses themselves: `CrossEntropyLoss` then takes its
    /// own default `ignore_index=-100`.
    pub fn call(&self, pred: &Tensor, label: &Tensor) -> Tensor {
        match self {
            DecodeLoss::CrossEntropy(l) => l.forward(pred, label, None, -100),
            DecodeLoss::Dice(l) => l.forward(pred, label),
            DecodeLoss::OhemCrossEntropy(l) => l.forward(pred, label),
            DecodeLoss::Boundary(l) => l.forward(pred, label),
        }
    }

    /// `loss_decode(seg_logits, seg_label, weight=seg_weight,
    /// ignore_index=...)`: `pred` `[B, K, H, W]`, `label` `[B, H, W]`.
    pub fn forward(
        &self,
        pred: &Tensor,
        label: &Tensor,
        weight: Option<&Tensor>,
        ignore_index: i64,
    ) -> Tensor {
        match self {
            DecodeLoss::CrossEntropy(l) => l.forward(pred, label, weight, ignore_index),
            DecodeLoss::Dice(l) => l.forward(pred, label),
            DecodeLoss::OhemCrossEntropy(_) | DecodeLoss::Boundary(_) => {
                unreachable!("DecodeHeadCfg refuses losses BaseDecodeHead cannot call")
            }
        }
    }
}

/// A head's `loss_decode`: one dict or a list of dicts, each a loss segtune
/// implements; unset is MMSeg's default `CrossEntropyLoss`.
pub fn loss_decode_from_cfg(v: Option<&Value>) -> Result<Vec<DecodeLoss>, ModelError> {
    let items: Vec<&Dict> = match v {
        None => return Ok(vec![DecodeLoss::CrossEntropy(CrossEntropyCfg::default())]),
        Some(Value::Dict(d)) => vec![d],
        Some(Value::List(l)) | Some(Value::Tuple(l)) => {
            l.iter().filter_map(Value::as_dict).collect()
        }
        Some(other) => {
            return Err(ModelError::config(
                "loss_decode",
                format!(
                    "must be a dict or a list of dicts, not {}",
                    other.type_name()
                ),
            ))
        }
    };
    items
        .into_iter()
        .map(
            |d| match d.get("type").and_then(Value::as_str).unwrap_or("") {
                "CrossEntropyLoss" => CrossEntropyCfg::from_cfg(d).map(DecodeLoss::CrossEntropy),
                "DiceLoss" => DiceLossCfg::from_cfg(d).map(DecodeLoss::Dice),
                "OhemCrossEntropy" => {
                    OhemCrossEntropyCfg::from_cfg(d).map(DecodeLoss::OhemCrossEntropy)
                }
                "BoundaryLoss" => BoundaryLossCfg::from_cfg(d).map(DecodeLoss::Boundary),
                ty => Err(ModelError::unsupported(
                    "loss_decode",
                    "type",
                    format!(
                        "`{ty}` (supported: CrossEntropyLoss, DiceLoss, OhemCrossEntropy, BoundaryLoss)"
                    ),
                )),
            },
        )
        .collect()
}
