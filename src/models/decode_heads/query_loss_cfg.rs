//! The config readers MaskFormer's and Mask2Former's heads share, as mmdet
//! derives `Mask2FormerHead` from `MaskFormerHead`: the class loss
//! (`loss_cls`), a mask-loss dict's reader, the Dice loss (`loss_dice`) and
//! the `HungarianAssigner`'s ordered `match_costs`. What differs (the mask
//! loss's keys, `train_cfg`'s point sampling) stays in each head's loss file.

use super::mask2former_head::check_type;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::ModelError;

pub(super) const MMDET_LOSSES: &str = "mmdet/models/losses/";
const HUNGARIAN_SOURCE: &str = "mmdet/models/task_modules/assigners/hungarian_assigner.py";
const MATCH_COST_SOURCE: &str = "mmdet/models/task_modules/assigners/match_cost.py";

/// The head's `loss_cls`: mmdet's `CrossEntropyLoss` over the classes and
/// no-object.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassLossCfg {
    /// `loss_weight`.
    pub weight: f64,
    /// `class_weight`: `num_classes + 1` weights, no-object last.
    pub class_weight: Vec<f64>,
}

/// Reads the head's `loss_cls`.
pub(super) fn class_loss_cfg(
    c: &mut ComponentConfig,
    num_classes: i64,
    default_weight: f64,
    head: &str,
) -> Result<ClassLossCfg, ModelError> {
    let empty = Dict::new();
    let cls = c.dict("loss_cls")?.unwrap_or(&empty);
    let mut l = ComponentConfig::new(cls, "CrossEntropyLoss", MMDET_LOSSES);
    check_type(cls, "CrossEntropyLoss", "loss_cls")?;
    l.unimplemented("use_sigmoid", &Value::Bool(false))?;
    l.unimplemented("use_mask", &Value::Bool(false))?;
    l.unimplemented("reduction", &Value::Str("mean".into()))?;
    l.unimplemented("avg_non_ignore", &Value::Bool(false))?;
    l.unimplemented("ignore_index", &Value::None)?;
    let weight = l.float("loss_weight", default_weight)?;
    let mut class_weight = l.floats("class_weight")?.unwrap_or_default();
    l.finish()?;
    if class_weight.is_empty() {
        // mmdet's default [1.0] * 133 + [0.1] is for COCO panoptic.
        return Err(ModelError::config(
            head,
            "loss_cls.class_weight must be set (num_classes + 1 weights, no-object last)",
        ));
    }
    if class_weight.len() as i64 != num_classes + 1 {
        return Err(ModelError::config(head, format!(
            "loss_cls.class_weight has {} weights for num_classes {num_classes} (needs num_classes + 1)",
            class_weight.len()
        )));
    }
    class_weight.shrink_to_fit();
    Ok(ClassLossCfg {
        weight,
        class_weight,
    })
}

/// The reader of the head's loss dict `key` (an absent one reads as
/// `empty`), of mmdet type `ty`, with `use_sigmoid=True` checked (every
/// mask loss of both heads is a sigmoid loss); the caller reads the rest
/// and calls `finish`.
pub(super) fn sigmoid_loss_cfg<'a: 'b, 'b>(
    c: &mut ComponentConfig<'a>,
    key: &str,
    ty: &'static str,
    empty: &'b Dict,
) -> Result<ComponentConfig<'b>, ModelError> {
    let dict = c.dict(key)?.unwrap_or(empty);
    check_type(dict, ty, key)?;
    let mut loss = ComponentConfig::new(dict, ty, MMDET_LOSSES);
    loss.unimplemented("use_sigmoid", &Value::Bool(true))?;
    Ok(loss)
}

/// mmdet's `DiceLoss` settings: `naive_dice`, `eps` and `loss_weight`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiceLossCfg {
    pub naive: bool,
    pub eps: f64,
    pub weight: f64,
}

impl DiceLossCfg {
    /// The head's `loss_dice`, each key defaulting to `defaults`'s (the
    /// heads' defaults differ).
    pub fn read(c: &mut ComponentConfig, defaults: DiceLossCfg) -> Result<Self, ModelError> {
        let empty = Dict::new();
        let mut d = sigmoid_loss_cfg(c, "loss_dice", "DiceLoss", &empty)?;
        d.unimplemented("activate", &Value::Bool(true))?;
        d.unimplemented("reduction", &Value::Str("mean".into()))?;
        let dice = DiceLossCfg {
            naive: d.flag("naive_dice", defaults.naive),
            eps: d.float("eps", defaults.eps)?,
            weight: d.float("loss_weight", defaults.weight)?,
        };
        d.finish()?;
        Ok(dice)
    }
}

/// `train_cfg.assigner`, a `HungarianAssigner`, of `head`: its
/// `match_costs`, each at most once and in `order` (as every MMSeg config
/// has them). `read` is given each cost's position in `order`, its
/// `weight` and the reader of its other keys.
pub(super) fn read_match_costs(
    assigner: Option<&Dict>,
    head: &str,
    order: [&'static str; 3],
    mut read: impl FnMut(usize, f64, &mut ComponentConfig) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    let Some(a) = assigner else {
        return Err(ModelError::config(head, "train_cfg.assigner must be set"));
    };
    check_type(a, "HungarianAssigner", "train_cfg.assigner")?;
    let mut c = ComponentConfig::new(a, "HungarianAssigner", HUNGARIAN_SOURCE);
    let costs = c
        .value("match_costs")
        .and_then(|v| v.as_seq().map(<[Value]>::to_vec))
        .unwrap_or_default();
    c.finish()?;
    let mut next = 0;
    for cost in &costs {
        let d = cost.as_dict().ok_or_else(|| {
            ModelError::config("HungarianAssigner", "each match cost must be a dict")
        })?;
        let ty = d.get("type").and_then(Value::as_str).unwrap_or("");
        let name = ty.trim_start_matches("mmdet.");
        let pos = order.iter().position(|o| *o == name).ok_or_else(|| {
            ModelError::unsupported_in(
                "HungarianAssigner",
                MATCH_COST_SOURCE,
                "match_costs",
                format!("`{ty}` (implemented: {})", order.join(", ")),
            )
        })?;
        if pos < next {
            return Err(ModelError::unsupported(
                "HungarianAssigner",
                "match_costs",
                format!("out of the order {} or repeated", order.join(", ")),
            ));
        }
        next = pos + 1;
        let mut m = ComponentConfig::new(d, order[pos], MATCH_COST_SOURCE);
        let weight = m.float("weight", 1.0)?;
        read(pos, weight, &mut m)?;
        m.finish()?;
    }
    Ok(())
}
