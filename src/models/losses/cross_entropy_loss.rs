//! `CrossEntropyLoss` (`mmseg/models/losses/cross_entropy_loss.py`): softmax
//! cross-entropy per pixel (`F.cross_entropy(..., reduction='none')`) reduced
//! by MMSeg's `weight_reduce_loss` (a sum divided by the pixel count, or by
//! the summed class weights); with `use_sigmoid=True`, MMSeg's
//! `binary_cross_entropy`: one-hot targets, a sigmoid cross-entropy per
//! class and pixel, weighted by the valid-pixel mask.

use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{softmax_keeps_input, softmax_saved};
use crate::models::ModelError;
use tch::{Kind, Reduction, Tensor};

const SOURCE: &str = "mmseg/models/losses/cross_entropy_loss.py";

/// One `CrossEntropyLoss` of a head's `loss_decode`.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossEntropyCfg {
    /// `use_sigmoid`: `binary_cross_entropy` instead of `cross_entropy`.
    pub use_sigmoid: bool,
    pub loss_weight: f64,
    pub class_weight: Option<Vec<f64>>,
    pub avg_non_ignore: bool,
    pub loss_name: String,
}

impl Default for CrossEntropyCfg {
    /// `dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)`,
    /// BaseDecodeHead's default `loss_decode`.
    fn default() -> Self {
        CrossEntropyCfg {
            use_sigmoid: false,
            loss_weight: 1.0,
            class_weight: None,
            avg_non_ignore: false,
            loss_name: "loss_ce".into(),
        }
    }
}

/// A loss's `class_weight`: `None`, or one weight per class (a list or
/// tuple); a file name is refused.
pub(super) fn read_class_weight(c: &mut ComponentConfig) -> Result<Option<Vec<f64>>, ModelError> {
    Ok(match c.value("class_weight") {
        None | Some(Value::None) => None,
        Some(Value::List(l)) | Some(Value::Tuple(l)) => {
            Some(l.iter().filter_map(Value::as_f64).collect())
        }
        Some(Value::Str(_)) => {
            return Err(c.unsupported(
                "class_weight",
                "a file name (class weights read from a file are not implemented)",
            ))
        }
        Some(other) => {
            return Err(c.config_error(format!(
                "class_weight must be a list, not {}",
                other.type_name()
            )))
        }
    })
}

impl CrossEntropyCfg {
    pub fn from_cfg(d: &Dict) -> Result<CrossEntropyCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "CrossEntropyLoss", SOURCE);
        let use_sigmoid = c.flag("use_sigmoid", false);
        if c.flag("use_mask", false) {
            return Err(c.unsupported("use_mask", "True (only the default False is implemented)"));
        }
        c.unimplemented("reduction", &Value::Str("mean".into()))?;
        let class_weight = read_class_weight(&mut c)?;
        let loss = CrossEntropyCfg {
            use_sigmoid,
            loss_weight: c.float("loss_weight", 1.0)?,
            class_weight,
            avg_non_ignore: c.flag("avg_non_ignore", false),
            loss_name: c.string("loss_name")?.unwrap_or("loss_ce").to_string(),
        };
        c.finish()?;
        Ok(loss)
    }

    /// `CrossEntropyLoss.forward(pred, label, weight=None,
    /// ignore_index=..., reduction_override='none')`, as a pixel sampler
    /// calls it: the per-pixel loss times `loss_weight`, `[B, H, W]`.
    pub fn per_pixel(&self, pred: &Tensor, label: &Tensor, ignore_index: i64) -> Tensor {
        let class_weight = self.class_weight.as_ref().map(|w| {
            crate::models::layers::host::from_host(w)
                .to_kind(pred.kind())
                .to_device(pred.device())
        });
        let loss = pred.cross_entropy_loss(
            label,
            class_weight.as_ref(),
            Reduction::None,
            ignore_index,
            0.0,
        );
        loss * self.loss_weight
    }

    /// `CrossEntropyLoss.forward(pred, label, weight, ignore_index=...)` ->
    /// `cross_entropy` -> `weight_reduce_loss`; `pred` is `[B, K, H, W]`,
    /// `label` `[B, H, W]`, `weight` the `[B, H, W]` pixel weights of a
    /// sampler.
    pub fn forward(
        &self,
        pred: &Tensor,
        label: &Tensor,
        weight: Option<&Tensor>,
        ignore_index: i64,
    ) -> Tensor {
        if self.use_sigmoid {
            return self.binary(pred, label, weight, ignore_index);
        }
        let class_weight = self.class_weight.as_ref().map(|w| {
            crate::models::layers::host::from_host(w)
                .to_kind(pred.kind())
                .to_device(pred.device())
        });
        let loss = pixel_cross_entropy(pred, label, class_weight.as_ref(), ignore_index);
        let eps = f32::EPSILON as f64;
        let avg_factor = match &class_weight {
            None if self.avg_non_ignore => {
                let ignored = label.eq(ignore_index).sum(Kind::Int64).int64_value(&[]);
                label.numel() as f64 - ignored as f64
            }
            None => label.numel() as f64,
            Some(w) => {
                // torch.stack([class_weight[cls] for cls in label]) gathers one weight per pixel.
                let safe = label.clamp(0, w.size()[0] - 1);
                let mut weights = w.index(&[Some(&safe)]);
                if self.avg_non_ignore {
                    let _ = weights.masked_fill_(&label.eq(ignore_index), 0.0);
                }
                weights.sum(Kind::Float).double_value(&[])
            }
        };
        // weight_reduce_loss: `loss = loss * weight` before the reduction.
        let loss = match weight {
            Some(w) => loss * w.to_kind(Kind::Float),
            None => loss,
        };
        let reduced = loss.sum(loss.kind()) / (avg_factor + eps);
        drop(loss);
        reduced * self.loss_weight
    }
}

/// `F.cross_entropy(pred, label, weight=class_weight, reduction='none',
/// ignore_index=...)`: `pred` `[B, K, H, W]`, `label` `[B, H, W]`, the
/// per-pixel loss `[B, H, W]`.
pub(crate) fn pixel_cross_entropy(
    pred: &Tensor,
    label: &Tensor,
    class_weight: Option<&Tensor>,
    ignore_index: i64,
) -> Tensor {
    if softmax_keeps_input() {
        // F.cross_entropy = nll_loss(log_softmax(pred, 1)), as ATen composes
        // it; spelled out to reach the log_softmax.
        let log_probs = pred.log_softmax(1, pred.kind());
        softmax_saved(pred, &log_probs);
        log_probs.nll_loss_nd(label, class_weight, Reduction::None, ignore_index)
    } else {
        // One op, as CPU autocast has its own rule for it.
        pred.cross_entropy_loss(label, class_weight, Reduction::None, ignore_index, 0.0)
    }
}

impl CrossEntropyCfg {
    /// `binary_cross_entropy(pred, label, weight, class_weight=...,
    /// ignore_index=..., avg_non_ignore=...)`: `pred` `[B, K, H, W]` (or
    /// `[B, 1, H, W]`, squeezed, for one class), `label` `[B, H, W]`.
    fn binary(
        &self,
        pred: &Tensor,
        label: &Tensor,
        weight: Option<&Tensor>,
        ignore_index: i64,
    ) -> Tensor {
        let valid = label.ge(0).logical_and(&label.ne(ignore_index)); // [B, H, W] bool
        let (pred, target, valid_mask) = if pred.size()[1] == 1 {
            let valid_mask = valid.to_kind(Kind::Float); // [B, H, W]
            (pred.squeeze_dim(1), label.shallow_clone(), valid_mask)
        } else {
            // _expand_onehot_labels sets bin_labels[n, label, h, w] = 1 on the
            // valid pixels by their nonzero() indices; a scatter of the valid
            // mask gives the same targets without value-dependent shapes
            // (meta traces), at the cost of its [B, 1, H, W] index instead
            // of those indices.
            let classes = pred.size()[1];
            let index = label.clamp(0, classes - 1).unsqueeze(1); // [B, 1, H, W]
            let on = valid.unsqueeze(1).to_kind(label.kind()); // [B, 1, H, W]
            let target = label
                .new_zeros(pred.size(), (label.kind(), label.device()))
                .scatter(1, &index, &on);
            drop((index, on));
            let valid_mask = valid
                .unsqueeze(1)
                .expand(pred.size(), false)
                .to_kind(Kind::Float); // [B, K, H, W]
            (pred.shallow_clone(), target, valid_mask)
        };
        let weight = match weight {
            Some(w) if pred.dim() == 4 => w.unsqueeze(1).expand(pred.size(), false) * &valid_mask,
            Some(w) => w * &valid_mask,
            None => valid_mask.shallow_clone(),
        };
        let avg_factor = self
            .avg_non_ignore
            .then(|| valid_mask.sum(Kind::Float).double_value(&[]));
        drop(valid_mask);
        // MMSeg passes class_weight as pos_weight, which broadcasts over
        // the last dimension (the width), as it does here.
        let pos_weight = self.class_weight.as_ref().map(|w| {
            crate::models::layers::host::from_host(w)
                .to_kind(pred.kind())
                .to_device(pred.device())
        });
        let target = target.to_kind(pred.kind());
        let loss = pred.binary_cross_entropy_with_logits(
            &target,
            None::<&Tensor>,
            pos_weight.as_ref(),
            Reduction::None,
        );
        drop(target);
        // weight_reduce_loss: `loss * weight`, then the mean or the sum over avg_factor.
        let loss = loss * weight;
        let reduced = match avg_factor {
            None => loss.mean(loss.kind()),
            Some(n) => loss.sum(loss.kind()) / (n + f32::EPSILON as f64),
        };
        drop(loss);
        reduced * self.loss_weight
    }
}

#[cfg(test)]
#[path = "cross_entropy_loss_tests.rs"]
mod tests;
