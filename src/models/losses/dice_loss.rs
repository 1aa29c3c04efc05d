//! `DiceLoss` (`mmseg/models/losses/dice_loss.py`): one minus the Dice
//! coefficient between the activated logits (sigmoid by default, or
//! softmax) and the one-hot labels, per image, averaged.
//!
//! Milletari, Navab and Ahmadi, "V-Net: Fully Convolutional Neural Networks
//! for Volumetric Medical Image Segmentation", 3DV 2016, arXiv:1606.04797.
//!
//! The ops are MMSeg's, one for one: the labels are clamped and one-hot
//! encoded (`int64`, `K + 1` classes, then cut to `K` and permuted), the
//! class `ignore_index` is dropped from both by boolean indexing, and the
//! sums of products are taken over the flattened maps.

use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::softmax_saved;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/losses/dice_loss.py";

/// `DiceLoss(use_sigmoid=True, activate=True, reduction='mean',
/// naive_dice=False, loss_weight=1.0, ignore_index=255, eps=1e-3,
/// loss_name='loss_dice')`.
#[derive(Debug, Clone, PartialEq)]
pub struct DiceLossCfg {
    pub use_sigmoid: bool,
    pub activate: bool,
    pub naive_dice: bool,
    pub loss_weight: f64,
    /// DiceLoss's own `ignore_index` (a class index dropped from the
    /// channels), not the head's.
    pub ignore_index: i64,
    pub eps: f64,
    pub loss_name: String,
}

impl DiceLossCfg {
    pub fn from_cfg(d: &Dict) -> Result<DiceLossCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "DiceLoss", SOURCE);
        c.unimplemented("reduction", &Value::Str("mean".into()))?;
        let cfg = DiceLossCfg {
            use_sigmoid: c.flag("use_sigmoid", true),
            activate: c.flag("activate", true),
            naive_dice: c.flag("naive_dice", false),
            loss_weight: c.float("loss_weight", 1.0)?,
            ignore_index: c.int("ignore_index", 255)?,
            eps: c.float("eps", 1e-3)?,
            loss_name: c.string("loss_name")?.unwrap_or("loss_dice").to_string(),
        };
        c.finish()?;
        Ok(cfg)
    }

    /// `DiceLoss.forward(pred, target)`: `pred` `[B, K, H, W]` logits,
    /// `label` `[B, H, W]` class indices.
    pub fn forward(&self, pred: &Tensor, label: &Tensor) -> Tensor {
        let num_classes = pred.size()[1];
        // _expand_onehot_labels_dice
        let one_hot = label
            .clamp(0, num_classes)
            .one_hot(num_classes + 1)
            .slice(3, 0, num_classes, 1)
            .permute([0, 3, 1, 2]); // [B, K, H, W] int64
        let activated;
        let pred = if !self.activate {
            pred
        } else if self.use_sigmoid {
            activated = pred.sigmoid();
            &activated
        } else if num_classes != 1 {
            activated = pred.softmax(1, None::<Kind>);
            softmax_saved(pred, &activated);
            &activated
        } else {
            pred
        };
        // dice_loss: drop the channel `ignore_index` (a no-op copy unless
        // it names a class).
        // `torch.arange(num_classes) != ignore_index`, made for each indexing.
        let keep =
            || Tensor::arange(num_classes, (Kind::Int64, pred.device())).ne(self.ignore_index);
        let pred = pred.index(&[None, Some(&keep())]);
        let target = one_hot.index(&[None, Some(&keep())]);
        let input = pred.flatten(1, -1); // [B, K * H * W]
        drop(pred);
        // Python rebinds `target`: the indexed int64 copy dies once the float one exists.
        let target = {
            let indexed = target;
            indexed.flatten(1, -1).to_kind(Kind::Float)
        };
        let a = (&input * &target).sum_dim_intlist(1, false, None::<Kind>);
        let d = if self.naive_dice {
            let b = input.sum_dim_intlist(1, false, None::<Kind>);
            let c = target.sum_dim_intlist(1, false, None::<Kind>);
            (a * 2 + self.eps) / (b + c + self.eps)
        } else {
            let b = (&input * &input).sum_dim_intlist(1, false, None::<Kind>) + self.eps;
            let c = (&target * &target).sum_dim_intlist(1, false, None::<Kind>) + self.eps;
            (a * 2) / (b + c)
        };
        let loss = d.rsub_scalar(1); // `1 - d`, [B]
        loss.mean(None::<Kind>) * self.loss_weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use serde_json::json;

    #[test]
    fn dice_of_half_sigmoids_against_one_class_matches_the_formula() {
        let cfg =
            DiceLossCfg::from_cfg(&dict(json!({"type": "DiceLoss", "loss_weight": 3.0}))).unwrap();
        let pred = Tensor::zeros([1, 2, 2, 2], (Kind::Float, tch::Device::Cpu));
        let label = Tensor::zeros([1, 2, 2], (Kind::Int64, tch::Device::Cpu));
        // sigmoid(0) = 0.5 on 8 values; class 0 is one-hot on 4 of them:
        // a = 2, b = 8 * 0.25 + eps, c = 4 + eps, loss = 1 - 2a / (b + c).
        let want = 3.0 * (1.0 - 4.0 / (2.0 + 1e-3 + 4.0 + 1e-3));
        let got = cfg.forward(&pred, &label).double_value(&[]);
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
}
