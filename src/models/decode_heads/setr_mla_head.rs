//! `SETRMLAHead`, SETR's multi-level aggregation head, as MMSeg's
//! `mmseg/models/decode_heads/setr_mla_head.py` builds it (after `MLANeck`).
//!
//! Zheng et al., "Rethinking Semantic Segmentation from a Sequence-to-Sequence
//! Perspective with Transformers", CVPR 2021, arXiv:2012.15840.
//!
//! Per selected map two 3x3 ConvModules to `mla_channels` and a bilinear
//! `up_scale` upsampling; the maps concatenated (`channels` = inputs x
//! `mla_channels`) and classified.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, InputTransform};
use super::setr_up_head::upsample;
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/setr_mla_head.py";

/// The registry's constructor (`DECODE_HEADS` row `SETRMLAHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = SetrMlaHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(SetrMlaHead::new(p, cfg)))
}

/// `SETRMLAHead(mla_channels=128, up_scale=4, **kwargs)`, always
/// `input_transform='multiple_select'`.
#[derive(Debug, Clone, PartialEq)]
pub struct SetrMlaHeadCfg {
    pub head: DecodeHeadCfg,
    pub mla_channels: i64,
    pub up_scale: f64,
}

impl SetrMlaHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<SetrMlaHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "SETRMLAHead", SOURCE);
        let mla_channels = c.int("mla_channels", 128)?;
        let up_scale = c.float("up_scale", 4.0)?;
        let head = DecodeHeadCfg::from_cfg(&mut c, Some(InputTransform::MultipleSelect))?;
        let inputs = head.in_channels.len() as i64;
        if head.channels != inputs * mla_channels {
            return Err(c.config_error(format!(
                "channels ({}) must equal len(in_channels) x mla_channels ({inputs} x {mla_channels})",
                head.channels
            )));
        }
        if up_scale <= 0.0 {
            return Err(c.config_error("up_scale must be > 0"));
        }
        c.finish()?;
        Ok(SetrMlaHeadCfg {
            head,
            mla_channels,
            up_scale,
        })
    }
}

/// `Sequential(ConvModule, ConvModule, Upsample)`.
struct MlaUpConv {
    convs: [ConvModule; 2],
}

pub struct SetrMlaHead {
    base: DecodeHeadBase,
    up_convs: Vec<MlaUpConv>,
    up_scale: f64,
}

impl SetrMlaHead {
    pub fn new(p: &mut ParamScope, cfg: SetrMlaHeadCfg) -> SetrMlaHead {
        let base = DecodeHeadBase::new(p, cfg.head);
        let head = &base.cfg;
        let mla = cfg.mla_channels;
        let up_convs = head
            .in_channels
            .iter()
            .enumerate()
            .map(|(i, in_channels)| {
                let mut up_convs = p.sub("up_convs");
                let mut up = up_convs.sub(i);
                let first = ConvSpec::new(*in_channels, mla, 3).padding(1);
                let second = ConvSpec::new(mla, mla, 3).padding(1);
                MlaUpConv {
                    convs: [
                        ConvModule::new(&mut up.sub(0), first, head.norm, true),
                        ConvModule::new(&mut up.sub(1), second, head.norm, true),
                    ],
                }
            })
            .collect();
        SetrMlaHead {
            base,
            up_convs,
            up_scale: cfg.up_scale,
        }
    }
}

impl BaseHead for SetrMlaHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let inputs = self.base.selected_inputs(features);
        let align_corners = self.base.cfg.align_corners;
        let outs: Vec<Tensor> = inputs
            .iter()
            .zip(&self.up_convs)
            .map(|(x, up)| {
                // nn.Sequential keeps only its latest output.
                let x = up.convs[0].forward(x, training);
                let x = up.convs[1].forward(&x, training);
                upsample(&x, self.up_scale, align_corners)
            })
            .collect();
        let out = Tensor::cat(&outs, 1);
        // Python's list `outs` lives until forward returns.
        let logits = self.base.cls_seg(out, training);
        drop(outs);
        logits
    }
}

#[cfg(test)]
#[path = "setr_mla_head_tests.rs"]
mod tests;
