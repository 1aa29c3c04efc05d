//! `PIDHead`, PIDNet's decode head, as MMSeg's
//! `mmseg/models/decode_heads/pid_head.py` builds it.
//!
//! Xu et al., "PIDNet: A Real-time Semantic Segmentation Network Inspired
//! by PID Controllers", CVPR 2023, arXiv:2206.02066.
//!
//! Three `BasePIDHead`s (a ConvModule in `order=('norm', 'act', 'conv')`,
//! a BN, a ReLU, a classifier): `i_head` + `cls_seg` on the fused map,
//! and in training `p_head` + `p_cls_seg` on the P branch's copy and
//! `d_head` + `d_cls_seg` (one boundary channel) on the D branch's. Its own
//! `loss_by_feat` takes the label and the edge map (`gt_edge_map`, made by
//! the pipeline's `GenerateEdge`): `loss_decode[0]` on the P logits
//! (`loss_sem_p`), `[1]` on the I logits (`loss_sem_i`), `[2]` on the
//! boundary logits against the edges (`loss_bd`) and `[3]` on the I logits
//! against the label kept where the boundary is confident (`loss_sem_bd`).

use super::ddr_head::BaseHeadBlock;
use super::decode_head::{DecodeHeadBase, DecodeHeadCfg};
use super::{DecodeHead, LossItems};
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, Conv2d, ConvSpec};
use crate::models::losses::{accuracy, DecodeLoss};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/pid_head.py";

/// The registry's constructor (`DECODE_HEADS` row `PIDHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "PIDHead", SOURCE);
    // `PIDHead.__init__(self, in_channels, channels, num_classes, ...)`.
    for key in ["in_channels", "channels", "num_classes"] {
        c.require(key)?;
    }
    if matches!(cfg.get("norm_cfg"), Some(Value::None)) {
        return Err(c.unsupported("norm_cfg", "None (the heads' BN needs a norm dict)"));
    }
    let head = DecodeHeadCfg::from_cfg_own_loss(&mut c)?;
    if head.losses.len() < 4 {
        // loss_by_feat indexes self.loss_decode[0] to [3].
        return Err(c.config_error(
            "needs four losses in `loss_decode` (P semantics, I semantics, boundary, boundary-guided semantics)",
        ));
    }
    if !head.losses[0].takes_base_head_call() {
        // loss_decode[0] is called with ignore_index=.
        return Err(c.unsupported(
            "loss_decode",
            format!(
                "{} first (PIDHead passes it ignore_index=: MMSeg raises a TypeError)",
                head.losses[0].type_name()
            ),
        ));
    }
    c.finish()?;
    Ok(Box::new(PidHead::new(p, head)))
}

/// `BasePIDHead(in_channels, channels, norm_cfg, act_cfg)` and its
/// classifier: `conv`, `norm`, the in-place ReLU, then the classifier.
struct PidBranchHead {
    block: BaseHeadBlock,
}

impl PidBranchHead {
    fn new(p: &mut ParamScope, in_channels: i64, channels: i64, norm: &NormCfg) -> Self {
        PidBranchHead {
            block: BaseHeadBlock::with_names(p, in_channels, channels, norm, ("conv", "norm")),
        }
    }
}

pub struct PidHead {
    base: DecodeHeadBase,
    i_head: PidBranchHead,
    p_head: PidBranchHead,
    d_head: PidBranchHead,
    p_cls_seg: Conv2d,
    d_cls_seg: Conv2d,
}

impl PidHead {
    pub fn new(p: &mut ParamScope, cfg: DecodeHeadCfg) -> PidHead {
        let (in_channels, channels) = (cfg.in_channels[0], cfg.channels);
        let norm = cfg.norm.unwrap_or(NormCfg::BN_DEFAULT);
        let num_classes = cfg.num_classes;
        let base = DecodeHeadBase::new(p, cfg);
        let i_head = PidBranchHead::new(&mut p.sub("i_head"), in_channels, channels, &norm);
        let p_head = PidBranchHead::new(&mut p.sub("p_head"), in_channels / 2, channels, &norm);
        let d_head = PidBranchHead::new(
            &mut p.sub("d_head"),
            in_channels / 2,
            in_channels / 4,
            &norm,
        );
        let p_cls_seg = Conv2d::new(
            &mut p.sub("p_cls_seg"),
            ConvSpec::new(channels, num_classes, 1),
        );
        let d_cls_seg = Conv2d::new(
            &mut p.sub("d_cls_seg"),
            ConvSpec::new(in_channels / 4, 1, 1),
        );
        PidHead {
            base,
            i_head,
            p_head,
            d_head,
            p_cls_seg,
            d_cls_seg,
        }
    }

    /// The training forward: `(p_logits, i_logits, d_logits)` from
    /// `(p_feat, i_feat, d_feat)`, each at the features' resolution.
    fn forward_train(&self, features: &[Tensor]) -> [Tensor; 3] {
        let x_p = self.p_head.block.forward(&features[0], true);
        let x_p = self.p_cls_seg.forward(&x_p); // [B, K, H/8, W/8]
        let x_i = self.i_head.block.forward(&features[1], true);
        let x_i = self.base.cls_seg(x_i, true); // [B, K, H/8, W/8]
        let x_d = self.d_head.block.forward(&features[2], true);
        let x_d = self.d_cls_seg.forward(&x_d); // [B, 1, H/8, W/8]
        [x_p, x_i, x_d]
    }

    /// `loss_by_feat(seg_logits, batch_data_samples)` with the stacked
    /// labels and edge maps; the resized logits, the labels, `filler` and
    /// `sem_bd_label` live until it returns.
    fn loss_by_feat(
        &self,
        logits: &[Tensor; 3],
        labels: &[Tensor],
        edges: &[Tensor],
    ) -> Vec<(String, Tensor)> {
        let _part = crate::models::scope::enter("loss");
        let (ac, ignore_index) = (self.base.cfg.align_corners, self.base.cfg.ignore_index);
        let sem_label = Tensor::stack(labels, 0); // [B, 1, H, W]
        let bd_label = Tensor::stack(edges, 0); // [B, 1, H, W]
        let size = (sem_label.size()[2], sem_label.size()[3]);
        let p_logit = resize_bilinear(&logits[0], size, ac); // [B, K, H, W]
        let i_logit = resize_bilinear(&logits[1], size, ac);
        let bd_size = (bd_label.size()[2], bd_label.size()[3]);
        let d_logit = resize_bilinear(&logits[2], bd_size, ac); // [B, 1, H, W]
        let sem_label = sem_label.squeeze_dim(1); // [B, H, W]
        let bd_label = bd_label.squeeze_dim(1);
        let losses = &self.base.cfg.losses;
        let loss_sem_p = match &losses[0] {
            DecodeLoss::CrossEntropy(l) => l.forward(&p_logit, &sem_label, None, ignore_index),
            other => other.call(&p_logit, &sem_label),
        };
        let loss_sem_i = losses[1].call(&i_logit, &sem_label);
        let loss_bd = losses[2].call(&d_logit, &bd_label);
        let filler = sem_label.ones_like() * ignore_index;
        let sem_bd_label = {
            let confident = d_logit.select(1, 0).sigmoid().gt(0.8);
            sem_label.where_self(&confident, &filler)
        };
        let loss_sem_bd = losses[3].call(&i_logit, &sem_bd_label);
        let acc_seg = accuracy(&i_logit, &sem_label, ignore_index);
        drop((filler, sem_bd_label, p_logit, i_logit, d_logit, bd_label));
        vec![
            ("loss_sem_p".into(), loss_sem_p),
            ("loss_sem_i".into(), loss_sem_i),
            ("loss_bd".into(), loss_bd),
            ("loss_sem_bd".into(), loss_sem_bd),
            ("acc_seg".into(), acc_seg),
        ]
    }
}

impl DecodeHead for PidHead {
    /// Inference: `i_head(inputs, cls_seg)` on the one fused map.
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        if training {
            let [_, x_i, _] = self.forward_train(features);
            return x_i;
        }
        let x = self.i_head.block.forward(&features[0], false);
        self.base.cls_seg(x, false)
    }

    /// Without edge maps PIDHead cannot compute its loss (MMSeg raises an
    /// `AttributeError` on `gt_edge_map`); the segmentor refuses a
    /// pipeline without `GenerateEdge` (the row's fact `takes_edge_maps`)
    /// and calls [`DecodeHead::loss_with_edges`].
    fn loss(&self, _features: &[Tensor], _prev: Option<&Tensor>, _labels: &[Tensor]) -> LossItems {
        panic!("'SegDataSample' object has no attribute 'gt_edge_map' (PIDHead needs the pipeline's GenerateEdge)")
    }

    fn loss_with_edges(
        &self,
        features: &[Tensor],
        labels: &[Tensor],
        edges: &[Tensor],
    ) -> LossItems {
        if edges.is_empty() {
            return self.loss(features, None, labels);
        }
        // `seg_logits` stays alive in `loss()` while `loss_by_feat` runs.
        let logits = self.forward_train(features);
        self.loss_by_feat(&logits, labels, edges)
    }

    crate::models::decode_heads::decode_head::settings_from_base!();
}

#[cfg(test)]
#[path = "pid_head_tests.rs"]
mod tests;
