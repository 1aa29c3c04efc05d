//! `DAHead`, the dual-attention head, as MMSeg's
//! `mmseg/models/decode_heads/da_head.py` builds it.
//!
//! Fu et al., "Dual Attention Network for Scene Segmentation", CVPR 2019,
//! arXiv:1809.02983.
//!
//! Two branches on the selected map: the position attention module (PAM, a
//! `SelfAttentionBlock` over pixels with a learnt `gamma` on its residual)
//! and the channel attention module (CAM, a `[C, C]` affinity of the
//! channels). Each branch is classified on its own (`pam_conv_seg`,
//! `cam_conv_seg`) and their sum by `conv_seg`; the loss is the base loss
//! of each of the three logits, prefixed `pam_cam.`, `pam.` and `cam.`.

use super::decode_head::{DecodeHeadBase, DecodeHeadCfg};
use super::{DecodeHead, LossItems};
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::self_attention_block::{SelfAttentionBlock, SelfAttentionBlockCfg};
use crate::models::layers::{count_flops, softmax_saved, Conv2d, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/da_head.py";

/// The registry's constructor (`DECODE_HEADS` row `DAHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "DAHead", SOURCE);
    // `DAHead.__init__(self, pam_channels, **kwargs)`: no default.
    c.require("pam_channels")?;
    let pam_channels = c.int("pam_channels", 0)?;
    let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
    c.finish()?;
    Ok(Box::new(DaHead::new(p, head, pam_channels)))
}

/// `Scale(0)`: one learnt scalar the branch output is multiplied by.
struct Scale {
    scale: Tensor,
}

impl Scale {
    fn new(p: &mut ParamScope) -> Scale {
        Scale {
            scale: p.param_zeros("scale", &[1]),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x * &self.scale
    }
}

/// `PAM(in_channels, channels)`: a SelfAttentionBlock with plain 1x1
/// projections, no output projection, and `gamma * out + x`.
struct Pam {
    attention: SelfAttentionBlock,
    gamma: Scale,
}

impl Pam {
    fn new(p: &mut ParamScope, in_channels: i64, channels: i64) -> Pam {
        let attention =
            SelfAttentionBlock::new(p, &SelfAttentionBlockCfg::plain(in_channels, channels));
        let gamma = Scale::new(&mut p.sub("gamma"));
        Pam { attention, gamma }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let out = self.attention.forward(x, x, None, None, training);
        self.gamma.forward(&out) + x
    }
}

/// `CAM()`: channel attention, `gamma * softmax(max(E) - E) x + x` with
/// `E = x x^T` over the pixels.
struct Cam {
    gamma: Scale,
}

impl Cam {
    fn forward(&self, x: &Tensor) -> Tensor {
        let s = x.size();
        let (batch, channels) = (s[0], s[1]);
        let proj_query = x.view([batch, channels, -1]); // [B, C, HW]
        let proj_key = x.view([batch, channels, -1]).permute([0, 2, 1]); // [B, HW, C]
        count_flops(2.0 * 2.0 * (batch * channels * channels * s[2] * s[3]) as f64);
        // `energy` stays a live local of the Python forward until it returns.
        let energy = proj_query.bmm(&proj_key); // [B, C, C]
        let (max, _) = energy.max_dim(-1, true);
        let energy_new = max.expand_as(&energy) - &energy;
        drop(max);
        let attention = energy_new.softmax(-1, None::<Kind>);
        softmax_saved(&energy_new, &attention);
        drop(energy_new);
        let out = attention
            .bmm(&x.view([batch, channels, -1])) // [B, C, HW]
            .view([batch, channels, s[2], s[3]]);
        let result = self.gamma.forward(&out) + x;
        drop(energy);
        result
    }
}

pub struct DaHead {
    base: DecodeHeadBase,
    pam_in_conv: ConvModule,
    pam: Pam,
    pam_out_conv: ConvModule,
    pam_conv_seg: Conv2d,
    cam_in_conv: ConvModule,
    cam: Cam,
    cam_out_conv: ConvModule,
    cam_conv_seg: Conv2d,
}

impl DaHead {
    pub fn new(p: &mut ParamScope, head: DecodeHeadCfg, pam_channels: i64) -> DaHead {
        let (channels, norm, classes) = (head.channels, head.norm, head.num_classes);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let conv3 = |p: &mut ParamScope, name: &str, from: i64| {
            ConvModule::new(
                &mut p.sub(name),
                ConvSpec::new(from, channels, 3).padding(1),
                norm,
                true,
            )
        };
        let pam_in_conv = conv3(p, "pam_in_conv", in_channels);
        let pam = Pam::new(&mut p.sub("pam"), channels, pam_channels);
        let pam_out_conv = conv3(p, "pam_out_conv", channels);
        let pam_conv_seg = Conv2d::new(
            &mut p.sub("pam_conv_seg"),
            ConvSpec::new(channels, classes, 1),
        );
        let cam_in_conv = conv3(p, "cam_in_conv", in_channels);
        let cam = Cam {
            gamma: Scale::new(&mut p.sub("cam").sub("gamma")),
        };
        let cam_out_conv = conv3(p, "cam_out_conv", channels);
        let cam_conv_seg = Conv2d::new(
            &mut p.sub("cam_conv_seg"),
            ConvSpec::new(channels, classes, 1),
        );
        DaHead {
            base,
            pam_in_conv,
            pam,
            pam_out_conv,
            pam_conv_seg,
            cam_in_conv,
            cam,
            cam_out_conv,
            cam_conv_seg,
        }
    }

    /// `pam_cls_seg` / `cam_cls_seg`: the head's dropout, then the branch's
    /// own classifier.
    fn branch_cls_seg(&self, feat: &Tensor, conv_seg: &Conv2d, training: bool) -> Tensor {
        let ratio = self.base.cfg.dropout_ratio;
        if ratio > 0.0 {
            conv_seg.forward(&feat.feature_dropout(ratio, training))
        } else {
            conv_seg.forward(feat)
        }
    }

    /// `forward(inputs)`: `(pam_cam_out, pam_out, cam_out)`.
    fn outputs(&self, features: &[Tensor], training: bool) -> [Tensor; 3] {
        let x = self.base.transform_inputs(features); // [B, C_in, h, w]
                                                      // Python rebinds: each step's input dies unless autograd saved it.
        let mut pam_feat = self.pam_in_conv.forward(&x, training);
        pam_feat = self.pam.forward(&pam_feat, training);
        pam_feat = self.pam_out_conv.forward(&pam_feat, training); // [B, channels, h, w]
        let pam_out = self.branch_cls_seg(&pam_feat, &self.pam_conv_seg, training);
        let mut cam_feat = self.cam_in_conv.forward(&x, training);
        cam_feat = self.cam.forward(&cam_feat);
        cam_feat = self.cam_out_conv.forward(&cam_feat, training);
        let cam_out = self.branch_cls_seg(&cam_feat, &self.cam_conv_seg, training);
        let feat_sum = &pam_feat + &cam_feat;
        let pam_cam_out = self.base.cls_seg(feat_sum, training);
        [pam_cam_out, pam_out, cam_out]
    }
}

impl DecodeHead for DaHead {
    /// `predict` takes `forward(inputs)[0]`; the other two are computed too.
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        let [pam_cam_out, _, _] = self.outputs(features, training);
        pam_cam_out
    }

    fn loss(&self, features: &[Tensor], _prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        // The three logits stay alive while `loss_by_feat` runs on each.
        let logits = self.outputs(features, true);
        let mut losses = Vec::new();
        for (prefix, logit) in ["pam_cam", "pam", "cam"].iter().zip(&logits) {
            for (name, value) in self.base.loss_by_feat(logit, labels) {
                losses.push((format!("{prefix}.{name}"), value));
            }
        }
        losses
    }

    crate::models::decode_heads::decode_head::settings_from_base!();
}

#[cfg(test)]
#[path = "da_head_tests.rs"]
mod tests;
