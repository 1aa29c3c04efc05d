//! MMSeg's `LearningRateDecayOptimizerConstructor` and its deprecated
//! `LayerDecayOptimizerConstructor` (BEiT's)
//! (`mmseg/engine/optimizers/layer_decay_optimizer_constructor.py`): one
//! param group per backbone layer and weight-decay kind, with the learning
//! rate decayed from the top layer down (Bao et al., "BEiT: BERT
//! Pre-Training of Image Transformers", ICLR 2022; ConvNeXt's fine-tuning
//! recipe). For memory what matters is the grouping: `torch.optim` creates
//! a group's state (Adam's moments) for every parameter of the group before
//! it updates any of them.

use super::OptimConfigError;
use crate::config::{Dict, Value};

/// How layers are numbered (`paramwise_cfg.decay_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecayType {
    /// `layer_wise` or `layer_wise_vit` (MMSeg tests `'layer_wise' in`).
    LayerWise,
    /// `stage_wise` (ConvNeXt only).
    StageWise,
}

/// The backbone family, as the constructor tells it from the backbone's
/// class name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    ConvNeXt,
    /// BEiT and MAE.
    Vit,
}

/// The settings of a layer-decay constructor.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerDecay {
    /// `paramwise_cfg.num_layers` as written.
    cfg_num_layers: i64,
    decay_rate: f64,
    decay_type: DecayType,
    family: Family,
}

/// One parameter's group: its key (`layer_{id}_{decay|no_decay}`), the
/// learning rate and the weight decay.
pub struct Group {
    pub key: String,
    pub lr: f64,
    pub weight_decay: f64,
}

impl LayerDecay {
    /// Reads the constructor `name` of `optim_wrapper` with its
    /// `paramwise_cfg`; `backbone` is the model's backbone type.
    pub fn from_cfg(
        name: &str,
        paramwise_cfg: Option<&Dict>,
        backbone: &str,
    ) -> Result<LayerDecay, OptimConfigError> {
        let bad = |why: &str| OptimConfigError::Constructor(name.to_string(), why.to_string());
        let pw = paramwise_cfg.ok_or_else(|| bad("it needs a paramwise_cfg"))?;
        let cfg_num_layers = pw
            .get("num_layers")
            .and_then(Value::as_i64)
            .ok_or_else(|| bad("paramwise_cfg.num_layers must be an int"))?;
        // The deprecated constructor renames `layer_decay_rate` and sets the type.
        let (rate_key, decay_type) = if name == "LayerDecayOptimizerConstructor" {
            ("layer_decay_rate", "layer_wise_vit")
        } else {
            (
                "decay_rate",
                pw.get("decay_type")
                    .and_then(Value::as_str)
                    .unwrap_or("layer_wise"),
            )
        };
        let decay_rate = pw
            .get(rate_key)
            .and_then(Value::as_f64)
            .ok_or_else(|| bad(&format!("paramwise_cfg.{rate_key} must be a number")))?;
        let decay_type = if decay_type.contains("layer_wise") {
            DecayType::LayerWise
        } else if decay_type == "stage_wise" {
            DecayType::StageWise
        } else {
            return Err(bad(&format!(
                "decay_type `{decay_type}` (MMSeg leaves layer_id unset: an error)"
            )));
        };
        let family = if backbone.contains("ConvNeXt") {
            Family::ConvNeXt
        } else if decay_type == DecayType::LayerWise
            && (backbone.contains("BEiT") || backbone.contains("MAE"))
        {
            Family::Vit
        } else {
            return Err(bad(&format!(
                "its {decay_type:?} grouping is for ConvNeXt, BEiT and MAE, not `{backbone}` (MMSeg raises NotImplementedError)"
            )));
        };
        Ok(LayerDecay {
            cfg_num_layers,
            decay_rate,
            decay_type,
            family,
        })
    }

    /// The group of parameter `name` with `dims` dimensions, from the
    /// optimizer's base learning rate and weight decay (`add_params`).
    pub fn group(&self, name: &str, dims: usize, base_lr: f64, base_wd: f64) -> Group {
        let no_decay =
            dims == 1 || name.ends_with(".bias") || name == "pos_embed" || name == "cls_token";
        let num_layers = self.cfg_num_layers + 2;
        let layer_id = match (self.decay_type, self.family) {
            (DecayType::LayerWise, Family::ConvNeXt) => {
                layer_id_convnext(name, self.cfg_num_layers)
            }
            (DecayType::LayerWise, Family::Vit) => layer_id_vit(name, num_layers),
            (DecayType::StageWise, _) => stage_id_convnext(name, num_layers),
        };
        let scale = self.decay_rate.powi((num_layers - layer_id - 1) as i32);
        Group {
            key: format!(
                "layer_{layer_id}_{}",
                if no_decay { "no_decay" } else { "decay" }
            ),
            lr: scale * base_lr,
            weight_decay: if no_decay { 0.0 } else { base_wd },
        }
    }
}

fn is_token(name: &str) -> bool {
    matches!(
        name,
        "backbone.cls_token" | "backbone.mask_token" | "backbone.pos_embed"
    )
}

/// The `i`-th dot-separated part of `name` as an int (MMSeg's `int(...)`).
fn part(name: &str, i: usize) -> i64 {
    name.split('.')
        .nth(i)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// `get_layer_id_for_convnext`.
fn layer_id_convnext(name: &str, max_layer_id: i64) -> i64 {
    if is_token(name) {
        0
    } else if name.starts_with("backbone.downsample_layers") {
        match part(name, 2) {
            0 => 0,
            1 => 2,
            2 => 3,
            _ => max_layer_id,
        }
    } else if name.starts_with("backbone.stages") {
        match part(name, 2) {
            0 => 1,
            1 => 2,
            2 => 3 + part(name, 3) / 3,
            _ => max_layer_id,
        }
    } else {
        max_layer_id + 1
    }
}

/// `get_stage_id_for_convnext`.
fn stage_id_convnext(name: &str, max_stage_id: i64) -> i64 {
    if is_token(name) || name.starts_with("backbone.downsample_layers") {
        0
    } else if name.starts_with("backbone.stages") {
        part(name, 2) + 1
    } else {
        max_stage_id - 1
    }
}

/// `get_layer_id_for_vit`.
fn layer_id_vit(name: &str, max_layer_id: i64) -> i64 {
    if is_token(name) || name.starts_with("backbone.patch_embed") {
        0
    } else if name.starts_with("backbone.layers") {
        part(name, 2) + 1
    } else {
        max_layer_id - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::dump::from_json;

    fn pw(json: serde_json::Value) -> Dict {
        match from_json(&json) {
            Value::Dict(d) => d,
            _ => unreachable!(),
        }
    }

    /// BEiT's recipe: 12 layers + 2, rate 0.9; MMSeg's groups and rates.
    #[test]
    fn beit_layers_and_weight_decay() {
        let p = pw(serde_json::json!({"num_layers": 12, "layer_decay_rate": 0.9}));
        let ld = LayerDecay::from_cfg("LayerDecayOptimizerConstructor", Some(&p), "BEiT").unwrap();
        let g = ld.group("backbone.cls_token", 3, 1.0, 0.05);
        assert_eq!((g.key.as_str(), g.weight_decay), ("layer_0_decay", 0.05));
        assert!((g.lr - 0.9f64.powi(13)).abs() < 1e-12);
        let g = ld.group("backbone.layers.3.attn.qkv.weight", 2, 1.0, 0.05);
        assert_eq!(g.key, "layer_4_decay");
        let g = ld.group("backbone.layers.3.attn.qkv.bias", 1, 1.0, 0.05);
        assert_eq!((g.key.as_str(), g.weight_decay), ("layer_4_no_decay", 0.0));
        let g = ld.group("decode_head.conv_seg.weight", 4, 1.0, 0.05);
        assert_eq!(g.key, "layer_13_decay");
        assert!((g.lr - 1.0).abs() < 1e-12);
    }

    #[test]
    fn convnext_layer_and_stage_ids() {
        assert_eq!(layer_id_convnext("backbone.stages.2.7.gamma", 6), 5);
        assert_eq!(
            layer_id_convnext("backbone.downsample_layers.3.1.weight", 6),
            6
        );
        assert_eq!(layer_id_convnext("decode_head.conv_seg.weight", 6), 7);
        assert_eq!(stage_id_convnext("backbone.stages.1.0.gamma", 8), 2);
        assert_eq!(stage_id_convnext("auxiliary_head.conv.weight", 8), 7);
    }

    #[test]
    fn other_backbones_are_refused_as_mmseg_refuses_them() {
        let p = pw(serde_json::json!({"num_layers": 12, "decay_rate": 0.9}));
        let e = LayerDecay::from_cfg(
            "LearningRateDecayOptimizerConstructor",
            Some(&p),
            "ResNetV1c",
        )
        .unwrap_err();
        assert!(e.to_string().contains("NotImplementedError"), "{e}");
    }
}
