//! `BoundaryLoss` (`mmseg/models/losses/boundary_loss.py`, from PIDNet's
//! `utils/criterion.py`): a binary cross-entropy of the boundary logits
//! against the edge map, each class of pixels (edge, non-edge) weighted by
//! the other's share.
//!
//! Xu et al., "PIDNet: A Real-time Semantic Segmentation Network Inspired
//! by PID Controllers", CVPR 2023, arXiv:2206.02066.
//!
//! Like `OhemCrossEntropy`, its `forward(bd_pre, bd_gt)` takes no `weight`
//! or `ignore_index`: only PIDHead, which calls it itself, can use it.

use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::ModelError;
use tch::{Kind, Reduction, Tensor};

const SOURCE: &str = "mmseg/models/losses/boundary_loss.py";

/// `BoundaryLoss(loss_weight=1.0, loss_name='loss_boundary')`.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundaryLossCfg {
    pub loss_weight: f64,
    pub loss_name: String,
}

impl BoundaryLossCfg {
    pub fn from_cfg(d: &Dict) -> Result<BoundaryLossCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "BoundaryLoss", SOURCE);
        let loss = BoundaryLossCfg {
            loss_weight: c.float("loss_weight", 1.0)?,
            loss_name: c
                .string("loss_name")?
                .unwrap_or("loss_boundary")
                .to_string(),
        };
        c.finish()?;
        Ok(loss)
    }

    /// `forward(bd_pre, bd_gt)`: `bd_pre` `[N, 1, H, W]` logits, `bd_gt`
    /// `[N, H, W]` (the uint8 edge map); a scalar.
    pub fn forward(&self, bd_pre: &Tensor, bd_gt: &Tensor) -> Tensor {
        let log_p = bd_pre.permute([0, 2, 3, 1]).contiguous().view([1, -1]); // [1, N*H*W]
        let target_t = bd_gt.view([1, -1]).to_kind(Kind::Float); // [1, N*H*W]
        let pos_index = target_t.eq(1.0);
        let neg_index = target_t.eq(0.0);
        let mut weight = log_p.zeros_like();
        let pos_num = pos_index.sum(None::<Kind>);
        let neg_num = neg_index.sum(None::<Kind>);
        let sum_num = &pos_num + &neg_num;
        // weight[pos_index] = neg_num * 1.0 / sum_num, and the converse.
        let pos_share = (&neg_num * 1.0) / &sum_num;
        let _ = weight.index_put_(&[Some(&pos_index)], &pos_share, false);
        drop(pos_share);
        let neg_share = (&pos_num * 1.0) / &sum_num;
        let _ = weight.index_put_(&[Some(&neg_index)], &neg_share, false);
        drop(neg_share);
        let loss = log_p.binary_cross_entropy_with_logits(
            &target_t,
            Some(&weight),
            None::<&Tensor>,
            Reduction::Mean,
        );
        drop((weight, pos_index, neg_index, target_t, log_p));
        loss * self.loss_weight
    }
}

#[cfg(test)]
#[path = "boundary_loss_tests.rs"]
mod tests;
