//! `DDRHead`, DDRNet's decode head, as MMSeg's
//! `mmseg/models/decode_heads/ddr_head.py` builds it.
//!
//! Hong et al., "Deep Dual-resolution Networks for Real-time and Accurate
//! Semantic Segmentation of Road Scenes", arXiv:2101.06085.
//!
//! Two heads of the same form, a ConvModule in `order=('norm', 'act',
//! 'conv')` then a BN and a ReLU: `head` + `cls_seg` on the backbone's
//! final map and, in training, `aux_head` + `aux_cls_seg` on its copy of
//! the spatial branch. Its own `loss_by_feat` calls `loss_decode[0]` on the
//! context logits (`loss_context`) and `loss_decode[1]` on the spatial ones
//! (`loss_spatial`), positionally; `acc_seg` is the context logits'.

use super::decode_head::{DecodeHeadBase, DecodeHeadCfg};
use super::{DecodeHead, LossItems};
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, BatchNorm2d, Conv2d, ConvModule, ConvSpec};
use crate::models::losses::accuracy;
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/ddr_head.py";

/// The registry's constructor (`DECODE_HEADS` row `DDRHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "DDRHead", SOURCE);
    // `DDRHead.__init__(self, in_channels, channels, num_classes, ...)`.
    for key in ["in_channels", "channels", "num_classes"] {
        c.require(key)?;
    }
    if matches!(cfg.get("norm_cfg"), Some(Value::None)) {
        return Err(c.unsupported("norm_cfg", "None (the heads' BN needs a norm dict)"));
    }
    let head = DecodeHeadCfg::from_cfg_own_loss(&mut c)?;
    if head.losses.len() < 2 {
        // loss_by_feat indexes self.loss_decode[1].
        return Err(c.config_error("needs two losses in `loss_decode` (context, spatial)"));
    }
    c.finish()?;
    Ok(Box::new(DdrHead::new(p, head)))
}

/// `_make_base_head(in_channels, channels)`: `ConvModule(in, channels, 3,
/// padding=1, order=('norm', 'act', 'conv'))`, `build_norm_layer`, the
/// activation (`.0`, `.1`, `.2`).
pub(crate) struct BaseHeadBlock {
    conv: ConvModule,
    norm: BatchNorm2d,
}

impl BaseHeadBlock {
    /// `bias='auto'`: a conv bias only without a norm (never here: the
    /// block's BN needs `norm_cfg`).
    pub(crate) fn new(p: &mut ParamScope, in_channels: i64, channels: i64, norm: &NormCfg) -> Self {
        Self::with_names(p, in_channels, channels, norm, ("0", "1"))
    }

    /// The same block with its ConvModule and norm named `names`
    /// (PIDHead's `BasePIDHead`: `conv`, `norm`).
    pub(crate) fn with_names(
        p: &mut ParamScope,
        in_channels: i64,
        channels: i64,
        norm: &NormCfg,
        names: (&str, &str),
    ) -> Self {
        let spec = ConvSpec::new(in_channels, channels, 3).padding(1);
        BaseHeadBlock {
            conv: ConvModule::norm_act_conv(&mut p.sub(names.0), spec, *norm, true),
            norm: BatchNorm2d::from_cfg(&mut p.sub(names.1), channels, norm),
        }
    }

    /// `[B, in, h, w]` -> `[B, channels, h, w]`; the ReLU in place.
    pub(crate) fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let x = self.conv.forward(x, training);
        let mut x = self.norm.forward(&x, training);
        let _ = x.relu_();
        x
    }
}

pub struct DdrHead {
    base: DecodeHeadBase,
    head: BaseHeadBlock,
    aux_head: BaseHeadBlock,
    aux_cls_seg: Conv2d,
}

impl DdrHead {
    pub fn new(p: &mut ParamScope, cfg: DecodeHeadCfg) -> DdrHead {
        let (in_channels, channels) = (cfg.in_channels[0], cfg.channels);
        let norm = cfg.norm.unwrap_or(NormCfg::BN_DEFAULT);
        let num_classes = cfg.num_classes;
        let base = DecodeHeadBase::new(p, cfg);
        let head = BaseHeadBlock::new(&mut p.sub("head"), in_channels, channels, &norm);
        let aux_head = BaseHeadBlock::new(&mut p.sub("aux_head"), in_channels / 2, channels, &norm);
        let aux_cls_seg = Conv2d::new(
            &mut p.sub("aux_cls_seg"),
            ConvSpec::new(channels, num_classes, 1),
        );
        DdrHead {
            base,
            head,
            aux_head,
            aux_cls_seg,
        }
    }

    /// The training forward: `(x_c, x_s)`, the context and spatial logits,
    /// from `(c3_feat, c5_feat)`.
    fn forward_train(&self, features: &[Tensor]) -> (Tensor, Tensor) {
        let (c3_feat, c5_feat) = (&features[0], &features[1]);
        let mut x_c = self.head.forward(c5_feat, true);
        x_c = self.base.cls_seg(x_c, true); // [B, K, H/8, W/8]
        let mut x_s = self.aux_head.forward(c3_feat, true);
        x_s = self.aux_cls_seg.forward(&x_s); // [B, K, H/8, W/8]
        (x_c, x_s)
    }
}

impl DecodeHead for DdrHead {
    /// Inference: `cls_seg(head(inputs))` on the one map the backbone gives.
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        if training {
            return self.forward_train(features).0;
        }
        let x = self.head.forward(&features[0], false);
        self.base.cls_seg(x, false)
    }

    /// `loss`: the logits stay alive while `loss_by_feat` runs.
    fn loss(&self, features: &[Tensor], _prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        let (context, spatial) = self.forward_train(features);
        let _part = crate::models::scope::enter("loss");
        let ac = self.base.cfg.align_corners;
        let seg_label = Tensor::stack(labels, 0); // [B, 1, H, W]
        let size = (seg_label.size()[2], seg_label.size()[3]);
        let context_logit = resize_bilinear(&context, size, ac); // [B, K, H, W]
        let spatial_logit = resize_bilinear(&spatial, size, ac);
        let seg_label = seg_label.squeeze_dim(1); // [B, H, W]
        let losses = &self.base.cfg.losses;
        let loss_context = losses[0].call(&context_logit, &seg_label);
        let loss_spatial = losses[1].call(&spatial_logit, &seg_label);
        let acc_seg = accuracy(&context_logit, &seg_label, self.base.cfg.ignore_index);
        vec![
            ("loss_context".into(), loss_context),
            ("loss_spatial".into(), loss_spatial),
            ("acc_seg".into(), acc_seg),
        ]
    }

    crate::models::decode_heads::decode_head::settings_from_base!();
}

#[cfg(test)]
#[path = "ddr_head_tests.rs"]
mod tests;
