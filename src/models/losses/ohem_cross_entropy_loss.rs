//! `OhemCrossEntropy` (`mmseg/models/losses/ohem_cross_entropy_loss.py`,
//! from PIDNet's `utils/criterion.py`): a cross-entropy over the hard
//! pixels only, those whose predicted probability of their label is below
//! a threshold (at least `thres`, raised to keep `min_kept` pixels).
//!
//! Xu et al., "PIDNet: A Real-time Semantic Segmentation Network Inspired
//! by PID Controllers", CVPR 2023, arXiv:2206.02066 (after Shrivastava et
//! al.'s online hard example mining, CVPR 2016).
//!
//! Its `forward(score, target)` takes no `weight` or `ignore_index`: only
//! heads that call their losses themselves (DDRHead, PIDHead) can use it,
//! BaseDecodeHead's `loss_by_feat` would pass them (a `TypeError`).

use super::cross_entropy_loss::{pixel_cross_entropy, read_class_weight};
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::host::{from_host, scalar_from_host, values_unavailable};
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/losses/ohem_cross_entropy_loss.py";

/// `OhemCrossEntropy(ignore_label=255, thres=0.7, min_kept=100000,
/// loss_weight=1.0, class_weight=None, loss_name='loss_ohem')`.
#[derive(Debug, Clone, PartialEq)]
pub struct OhemCrossEntropyCfg {
    pub ignore_label: i64,
    pub thresh: f64,
    /// `max(1, min_kept)`.
    pub min_kept: i64,
    pub loss_weight: f64,
    pub class_weight: Option<Vec<f64>>,
    pub loss_name: String,
}

impl OhemCrossEntropyCfg {
    pub fn from_cfg(d: &Dict) -> Result<OhemCrossEntropyCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "OhemCrossEntropy", SOURCE);
        let class_weight = read_class_weight(&mut c)?;
        let loss = OhemCrossEntropyCfg {
            ignore_label: c.int("ignore_label", 255)?,
            thresh: c.float("thres", 0.7)?,
            min_kept: c.int("min_kept", 100_000)?.max(1),
            loss_weight: c.float("loss_weight", 1.0)?,
            class_weight,
            loss_name: c.string("loss_name")?.unwrap_or("loss_ohem").to_string(),
        };
        c.finish()?;
        Ok(loss)
    }

    /// `forward(score, target)`: `score` `[N, C, H, W]`, `target` `[N, H,
    /// W]`; the mean cross-entropy of the hard pixels times `loss_weight`.
    /// Each local lives as long as the Python's (the softmax, the sorted
    /// probabilities and their indices until the return).
    pub fn forward(&self, score: &Tensor, target: &Tensor) -> Tensor {
        let pred = score.softmax(1, None::<Kind>); // [N, C, H, W]
        let class_weight = self.class_weight.as_ref().map(|w| {
            // score.new_tensor(self.class_weight)
            let w: Vec<f32> = w.iter().map(|x| *x as f32).collect();
            from_host(&w)
                .to_kind(score.kind())
                .to_device(score.device())
        });
        let mut pixel_losses =
            pixel_cross_entropy(score, target, class_weight.as_ref(), self.ignore_label)
                .contiguous()
                .view([-1]); // [N*H*W]
        let mask = target.contiguous().view([-1]).ne(self.ignore_label); // [N*H*W]
        let mut tmp_target = target.copy(); // [N, H, W]
        {
            let ignored = tmp_target.eq(self.ignore_label);
            let _ = tmp_target.index_put_(&[Some(&ignored)], &scalar_from_host(0i64), false);
        }
        // `pred = pred.gather(...)` releases the softmax (autograd keeps
        // it), and rebinding `pred` to the sorted values releases the
        // gathered map.
        let (pred, ind) = {
            let gathered = pred.gather(1, &tmp_target.unsqueeze(1), false); // [N, 1, H, W]
            drop(pred);
            gathered
                .contiguous()
                .view([-1])
                .index(&[Some(&mask)])
                .contiguous()
                .sort(-1, false) // [M] each
        };
        let n = pred.numel() as i64;
        if n == 0 {
            return scalar_from_host(0.0f32).to_device(score.device());
        }
        let min_value = pred.select(0, self.min_kept.min(n - 1));
        // threshold = max(min_value, self.thresh): the tensor unless thresh
        // is larger (a shape-only trace cannot read it and takes thresh).
        let use_min = !values_unavailable() && min_value.double_value(&[]) >= self.thresh;
        pixel_losses = pixel_losses.index(&[Some(&mask)]).index(&[Some(&ind)]);
        pixel_losses = pixel_losses.index(&[Some(&if use_min {
            pred.lt_tensor(&min_value)
        } else {
            pred.lt(self.thresh)
        })]);
        let mean = pixel_losses.mean(None::<Kind>);
        drop((pixel_losses, tmp_target, mask));
        mean * self.loss_weight
    }
}

#[cfg(test)]
#[path = "ohem_cross_entropy_loss_tests.rs"]
mod tests;
