//! `FPNHead`, the Semantic FPN head, as MMSeg's
//! `mmseg/models/decode_heads/fpn_head.py` builds it.
//!
//! Kirillov et al., "Panoptic Feature Pyramid Networks", CVPR 2019,
//! arXiv:1901.02446.
//!
//! Each pyramid level goes through 3x3 ConvModules, each followed by a 2x
//! bilinear upsampling until the level reaches the finest stride; the
//! levels are summed (each resized to the finest map) and classified.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, InputTransform};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/fpn_head.py";

/// The registry's constructor (`DECODE_HEADS` row `FPNHead`):
/// `FPNHead(feature_strides, **kwargs)` with `input_transform='multiple_select'`.
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "FPNHead", SOURCE);
    c.require("feature_strides")?;
    let strides = c.ints("feature_strides", &[])?;
    let head = DecodeHeadCfg::from_cfg(&mut c, Some(InputTransform::MultipleSelect))?;
    if strides.len() != head.in_channels.len() {
        return Err(c.config_error("feature_strides and in_channels must have the same length"));
    }
    if strides.iter().any(|&s| s <= 0) || strides.iter().min() != strides.first() {
        return Err(c.config_error("the first of feature_strides must be the smallest"));
    }
    c.finish()?;
    Ok(Box::new(FpnHead::new(p, head, &strides)))
}

/// One level's `nn.Sequential` of ConvModules and 2x `Upsample`s.
struct ScaleHead {
    convs: Vec<ConvModule>,
    upsample: bool,
}

impl ScaleHead {
    fn forward(&self, x: &Tensor, training: bool, align_corners: bool) -> Tensor {
        let mut y = x.shallow_clone();
        for conv in &self.convs {
            y = conv.forward(&y, training);
            if self.upsample {
                // mmseg's Upsample: int(size * 2), bilinear.
                let s = y.size();
                y = resize_bilinear(&y, (s[2] * 2, s[3] * 2), align_corners);
            }
        }
        y
    }
}

pub struct FpnHead {
    base: DecodeHeadBase,
    scale_heads: Vec<ScaleHead>,
}

impl FpnHead {
    pub fn new(p: &mut ParamScope, head: DecodeHeadCfg, strides: &[i64]) -> FpnHead {
        let (channels, norm) = (head.channels, head.norm);
        let in_channels = head.in_channels.clone();
        let base = DecodeHeadBase::new(p, head);
        let log2 = |s: i64| (s as f64).log2();
        let mut sp = p.sub("scale_heads");
        let scale_heads = strides
            .iter()
            .enumerate()
            .map(|(i, &stride)| {
                let length = ((log2(stride) - log2(strides[0])) as i64).max(1);
                let upsample = stride != strides[0];
                let mut hp = sp.sub(i);
                // Sequential indices count the Upsample modules too.
                let step = if upsample { 2 } else { 1 };
                let convs = (0..length)
                    .map(|k| {
                        let from = if k == 0 { in_channels[i] } else { channels };
                        ConvModule::new(
                            &mut hp.sub(k * step),
                            ConvSpec::new(from, channels, 3).padding(1),
                            norm,
                            true,
                        )
                    })
                    .collect();
                ScaleHead { convs, upsample }
            })
            .collect();
        FpnHead { base, scale_heads }
    }
}

impl BaseHead for FpnHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let x = self.base.selected_inputs(features);
        let ac = self.base.cfg.align_corners;
        let mut output = self.scale_heads[0].forward(x[0], training, ac);
        for (i, head) in self.scale_heads.iter().enumerate().skip(1) {
            let s = output.size();
            let resized = {
                let level = head.forward(x[i], training, ac);
                resize_bilinear(&level, (s[2], s[3]), ac)
            };
            output = &output + resized;
        }
        self.base.cls_seg(output, training)
    }
}

#[cfg(test)]
#[path = "fpn_head_tests.rs"]
mod tests;
