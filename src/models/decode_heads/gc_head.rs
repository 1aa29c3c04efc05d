//! `GCHead`, the global-context head, as MMSeg's
//! `mmseg/models/decode_heads/gc_head.py` builds it: an FCNHead with two
//! convs and mmcv's `ContextBlock` (`mmcv/cnn/bricks/context_block.py`)
//! between them.
//!
//! Cao et al., "GCNet: Non-local Networks Meet Squeeze-Excitation Networks
//! and Beyond", ICCVW 2019, arXiv:1904.11492.
//!
//! The block pools the map to one context vector per image (attention
//! pooling: a 1x1 conv to one channel, softmax over the pixels, a weighted
//! sum; or average pooling), transforms it with a bottleneck (1x1 conv,
//! LayerNorm, ReLU, 1x1 conv) and adds it to (or multiplies it into) every
//! pixel.

use super::fcn_head::{FcnHead, FcnHeadCfg, MidBlock};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{count_flops, softmax_saved, Conv2d, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/gc_head.py";

/// The registry's constructor (`DECODE_HEADS` row `GCHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = GcHeadCfg::from_cfg(cfg)?;
    let block = cfg.block.clone();
    Ok(Box::new(FcnHead::with_block(
        p,
        cfg.fcn,
        |p, channels, _| Box::new(ContextBlock::new(&mut p.sub("gc_block"), channels, &block)),
    )))
}

/// `ContextBlock`'s settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextBlockCfg {
    pub ratio: f64,
    /// `'att'` (attention pooling) or `'avg'`.
    pub attention_pooling: bool,
    pub channel_add: bool,
    pub channel_mul: bool,
}

/// `GCHead(ratio=1/4., pooling_type='att', fusion_types=('channel_add',),
/// **kwargs)` over `FCNHead(num_convs=2, **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct GcHeadCfg {
    pub fcn: FcnHeadCfg,
    pub block: ContextBlockCfg,
}

impl GcHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<GcHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "GCHead", SOURCE);
        let ratio = c.float("ratio", 0.25)?;
        let pooling = c.string("pooling_type")?.unwrap_or("att");
        let fusion = c.strings("fusion_types", &["channel_add"])?;
        // ContextBlock.__init__'s assertions.
        if pooling != "att" && pooling != "avg" {
            return Err(c.config_error(format!(
                "pooling_type must be 'att' or 'avg', not '{pooling}'"
            )));
        }
        if fusion.is_empty()
            || fusion
                .iter()
                .any(|f| f != "channel_add" && f != "channel_mul")
        {
            return Err(c.config_error(format!(
                "fusion_types must be one or both of 'channel_add', 'channel_mul', not {fusion:?}"
            )));
        }
        let fcn = FcnHeadCfg::read(&mut c, Some(2))?;
        c.finish()?;
        Ok(GcHeadCfg {
            fcn,
            block: ContextBlockCfg {
                ratio,
                attention_pooling: pooling == "att",
                channel_add: fusion.iter().any(|f| f == "channel_add"),
                channel_mul: fusion.iter().any(|f| f == "channel_mul"),
            },
        })
    }
}

/// One fusion branch: `Sequential(Conv2d(C, planes, 1), LayerNorm([planes,
/// 1, 1]), ReLU(inplace), Conv2d(planes, C, 1))`.
struct Transform {
    expand: Conv2d,
    norm_weight: Tensor,
    norm_bias: Tensor,
    planes: i64,
    project: Conv2d,
}

impl Transform {
    fn new(p: &mut ParamScope, channels: i64, planes: i64) -> Transform {
        let expand = Conv2d::new(&mut p.sub(0), ConvSpec::new(channels, planes, 1));
        let mut norm = p.sub(1);
        let norm_weight = norm.param_ones("weight", &[planes, 1, 1]);
        let norm_bias = norm.param_zeros("bias", &[planes, 1, 1]);
        let project = Conv2d::new(&mut p.sub(3), ConvSpec::new(planes, channels, 1));
        Transform {
            expand,
            norm_weight,
            norm_bias,
            planes,
            project,
        }
    }

    /// `[B, C, 1, 1]` in and out.
    fn forward(&self, context: &Tensor) -> Tensor {
        let y = self.expand.forward(context); // [B, planes, 1, 1]
        let mut y = y.layer_norm(
            [self.planes, 1, 1],
            Some(&self.norm_weight),
            Some(&self.norm_bias),
            1e-5,
            true,
        );
        let _ = y.relu_();
        self.project.forward(&y) // [B, C, 1, 1]
    }
}

/// mmcv's `ContextBlock(in_channels, ratio, pooling_type, fusion_types)`.
pub struct ContextBlock {
    conv_mask: Option<Conv2d>,
    channel_add: Option<Transform>,
    channel_mul: Option<Transform>,
}

impl ContextBlock {
    pub fn new(p: &mut ParamScope, channels: i64, cfg: &ContextBlockCfg) -> ContextBlock {
        let planes = (channels as f64 * cfg.ratio) as i64;
        let conv_mask = cfg
            .attention_pooling
            .then(|| Conv2d::new(&mut p.sub("conv_mask"), ConvSpec::new(channels, 1, 1)));
        let channel_add = cfg
            .channel_add
            .then(|| Transform::new(&mut p.sub("channel_add_conv"), channels, planes));
        let channel_mul = cfg
            .channel_mul
            .then(|| Transform::new(&mut p.sub("channel_mul_conv"), channels, planes));
        ContextBlock {
            conv_mask,
            channel_add,
            channel_mul,
        }
    }

    /// `spatial_pool(x)`: `[B, C, 1, 1]`.
    fn spatial_pool(&self, x: &Tensor) -> Tensor {
        let s = x.size();
        let (batch, channels, pixels) = (s[0], s[1], s[2] * s[3]);
        let Some(conv_mask) = &self.conv_mask else {
            return x.adaptive_avg_pool2d([1, 1]);
        };
        let input_x = x.view([batch, channels, pixels]).unsqueeze(1); // [B, 1, C, HW]
        let mask = conv_mask.forward(x).view([batch, 1, pixels]); // [B, 1, HW]
        let weights = mask.softmax(2, None::<Kind>);
        softmax_saved(&mask, &weights);
        drop(mask);
        let weights = weights.unsqueeze(-1); // [B, 1, HW, 1]
        count_flops(2.0 * (batch * channels * pixels) as f64);
        input_x
            .matmul(&weights) // [B, 1, C, 1]
            .view([batch, channels, 1, 1])
    }
}

impl MidBlock for ContextBlock {
    fn forward(&self, x: &Tensor, _training: bool) -> Tensor {
        let context = self.spatial_pool(x); // [B, C, 1, 1]
        let mut out = x.shallow_clone();
        if let Some(mul) = &self.channel_mul {
            let term = mul.forward(&context).sigmoid();
            out = &out * term;
        }
        if let Some(add) = &self.channel_add {
            let term = add.forward(&context);
            out = &out + term;
        }
        out
    }
}

#[cfg(test)]
#[path = "gc_head_tests.rs"]
mod tests;
