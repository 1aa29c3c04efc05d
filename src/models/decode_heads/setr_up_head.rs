//! `SETRUPHead`, SETR's naive and progressive-upsampling heads, as MMSeg's
//! `mmseg/models/decode_heads/setr_up_head.py` builds it.
//!
//! Zheng et al., "Rethinking Semantic Segmentation from a Sequence-to-Sequence
//! Perspective with Transformers", CVPR 2021, arXiv:2012.15840.
//!
//! A LayerNorm over the selected map's channels (through the token layout
//! and back), then `num_convs` blocks of a ConvModule and a bilinear
//! `up_scale` upsampling (SETR-PUP: four x2 blocks; SETR-Naive: one x4
//! block with 1x1 convs), then the classifier.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{
    channel_layer_norm, resize_bilinear, ConvModule, ConvSpec, LayerNorm, LayerNormCfg,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/setr_up_head.py";

/// The registry's constructor (`DECODE_HEADS` row `SETRUPHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = SetrUpHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(SetrUpHead::new(p, cfg)))
}

/// `SETRUPHead(norm_layer=dict(type='LN', eps=1e-6, requires_grad=True),
/// num_convs=1, up_scale=4, kernel_size=3, **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct SetrUpHeadCfg {
    pub head: DecodeHeadCfg,
    pub norm_layer: LayerNormCfg,
    pub num_convs: i64,
    pub up_scale: f64,
    pub kernel_size: i64,
}

impl SetrUpHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<SetrUpHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "SETRUPHead", SOURCE);
        let norm_layer = LayerNormCfg {
            eps: 1e-6,
            requires_grad: true,
        };
        let norm_layer = LayerNormCfg::from_cfg(&mut c, "norm_layer", norm_layer)?;
        let num_convs = c.int("num_convs", 1)?;
        let up_scale = c.float("up_scale", 4.0)?;
        let kernel_size = c.int("kernel_size", 3)?;
        if kernel_size != 1 && kernel_size != 3 {
            return Err(c.config_error(format!("kernel_size must be 1 or 3, not {kernel_size}")));
        }
        if num_convs < 0 || up_scale <= 0.0 {
            return Err(c.config_error("needs num_convs >= 0 and up_scale > 0"));
        }
        let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
        if head.in_channels.len() != 1 {
            return Err(c.config_error("takes one input map (in_channels must be an int)"));
        }
        if num_convs == 0 && head.in_channels[0] != head.channels {
            // conv_seg classifies `channels`, but the map keeps in_channels.
            return Err(c.config_error("with num_convs=0, in_channels must equal channels"));
        }
        c.finish()?;
        Ok(SetrUpHeadCfg {
            head,
            norm_layer,
            num_convs,
            up_scale,
            kernel_size,
        })
    }
}

/// `Sequential(ConvModule, Upsample(scale_factor, mode='bilinear'))`.
pub struct UpConv {
    conv: ConvModule,
    up_scale: f64,
    align_corners: bool,
}

impl UpConv {
    pub fn new(p: &mut ParamScope, spec: ConvSpec, head: &DecodeHeadCfg, up_scale: f64) -> UpConv {
        UpConv {
            conv: ConvModule::new(&mut p.sub(0), spec, head.norm, true),
            up_scale,
            align_corners: head.align_corners,
        }
    }

    /// The conv's output dies once upsampled (`nn.Sequential`).
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        upsample(
            &self.conv.forward(x, training),
            self.up_scale,
            self.align_corners,
        )
    }
}

/// mmseg's `Upsample(scale_factor=s, mode='bilinear')`: to
/// `int(size * s)`, as a size (no scale passed on).
pub fn upsample(x: &Tensor, scale: f64, align_corners: bool) -> Tensor {
    let (h, w) = (x.size()[2], x.size()[3]);
    let size = ((h as f64 * scale) as i64, (w as f64 * scale) as i64);
    resize_bilinear(x, size, align_corners)
}

pub struct SetrUpHead {
    base: DecodeHeadBase,
    norm: LayerNorm,
    up_convs: Vec<UpConv>,
}

impl SetrUpHead {
    pub fn new(p: &mut ParamScope, cfg: SetrUpHeadCfg) -> SetrUpHead {
        let base = DecodeHeadBase::new(p, cfg.head);
        let head = &base.cfg;
        let norm = cfg
            .norm_layer
            .build(&mut p.sub("norm"), head.in_channels[0]);
        let k = cfg.kernel_size;
        let up_convs = (0..cfg.num_convs)
            .map(|i| {
                let from = if i == 0 {
                    head.in_channels[0]
                } else {
                    head.channels
                };
                let spec = ConvSpec::new(from, head.channels, k).padding((k - 1) / 2);
                UpConv::new(&mut p.sub("up_convs").sub(i), spec, head, cfg.up_scale)
            })
            .collect();
        SetrUpHead {
            base,
            norm,
            up_convs,
        }
    }
}

impl BaseHead for SetrUpHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let x = self.base.transform_inputs(features);
        let mut x = channel_layer_norm(&self.norm, &x);
        for up_conv in &self.up_convs {
            x = up_conv.forward(&x, training);
        }
        self.base.cls_seg(x, training)
    }
}

#[cfg(test)]
#[path = "setr_up_head_tests.rs"]
mod tests;
