//! `APCHead`, the adaptive pyramid context head, as MMSeg's
//! `mmseg/models/decode_heads/apc_head.py` builds it.
//!
//! He et al., "Adaptive Pyramid Context Network for Semantic Segmentation",
//! CVPR 2019.
//!
//! One adaptive context module (ACM) per pool scale: the map pooled to
//! `s x s` regions gives `s^2` region features, each pixel weighs them by a
//! sigmoid affinity (a 1x1 conv of the pixel plus a global context), and
//! the weighted regions go through a residual ConvModule. The input and the
//! modules' outputs are concatenated and fused by a 3x3 bottleneck.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg};
use super::psp_head::read_pool_scales;
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{count_flops, Conv2d, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/apc_head.py";

/// The registry's constructor (`DECODE_HEADS` row `APCHead`):
/// `APCHead(pool_scales=(1, 2, 3, 6), fusion=True, **kwargs)`.
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "APCHead", SOURCE);
    let pool_scales = read_pool_scales(&mut c)?;
    let fusion = c.flag("fusion", true);
    let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
    c.finish()?;
    Ok(Box::new(ApcHead::new(p, head, &pool_scales, fusion)))
}

/// `ACM(pool_scale, fusion, in_channels, channels, ...)`.
struct Acm {
    pool_scale: i64,
    channels: i64,
    pooled_redu_conv: ConvModule,
    input_redu_conv: ConvModule,
    global_info: ConvModule,
    gla: Conv2d,
    residual_conv: ConvModule,
    fusion_conv: Option<ConvModule>,
}

impl Acm {
    fn new(
        p: &mut ParamScope,
        pool_scale: i64,
        fusion: bool,
        in_channels: i64,
        channels: i64,
        norm: Option<NormCfg>,
    ) -> Acm {
        let conv1 = |p: &mut ParamScope, name: &str, from: i64| {
            ConvModule::new(
                &mut p.sub(name),
                ConvSpec::new(from, channels, 1),
                norm,
                true,
            )
        };
        let pooled_redu_conv = conv1(p, "pooled_redu_conv", in_channels);
        let input_redu_conv = conv1(p, "input_redu_conv", in_channels);
        let global_info = conv1(p, "global_info", channels);
        let gla = Conv2d::new(
            &mut p.sub("gla"),
            ConvSpec::new(channels, pool_scale * pool_scale, 1),
        );
        let residual_conv = conv1(p, "residual_conv", channels);
        let fusion_conv = fusion.then(|| conv1(p, "fusion_conv", channels));
        Acm {
            pool_scale,
            channels,
            pooled_redu_conv,
            input_redu_conv,
            global_info,
            gla,
            residual_conv,
            fusion_conv,
        }
    }

    fn forward(&self, input: &Tensor, training: bool) -> Tensor {
        let s = self.pool_scale;
        let pooled_x = input.adaptive_avg_pool2d([s, s]); // [B, C_in, s, s]
        let x = self.input_redu_conv.forward(input, training); // [B, c, h, w]
        let pooled_x = self.pooled_redu_conv.forward(&pooled_x, training);
        let size = x.size();
        let (batch, h, w) = (size[0], size[2], size[3]);
        let pooled_x = pooled_x
            .view([batch, self.channels, -1])
            .permute([0, 2, 1])
            .contiguous(); // [B, s^2, c]
                           // Python frees each temporary as soon as the op using it returns;
                           // Rust keeps a statement's temporaries to its end: one op each.
        let summed = {
            // mmseg's `resize` defaults to nearest.
            let global = self
                .global_info
                .forward(&x.adaptive_avg_pool2d([1, 1]), training)
                .upsample_nearest2d([h, w], None, None);
            &x + global
        };
        let affinity = {
            let logits =
                self.gla
                    .forward(&summed)
                    .permute([0, 2, 3, 1])
                    .reshape([batch, -1, s * s]); // [B, hw, s^2]
            logits.sigmoid()
        };
        drop(summed);
        count_flops(2.0 * (batch * h * w * s * s * self.channels) as f64);
        let z_out = affinity
            .matmul(&pooled_x)
            .permute([0, 2, 1])
            .contiguous()
            .view([batch, self.channels, h, w]);
        let z_out = self.residual_conv.forward(&z_out, training);
        let z_out = (z_out + &x).relu(); // F.relu: not in place
        match &self.fusion_conv {
            Some(fusion) => fusion.forward(&z_out, training),
            None => z_out,
        }
    }
}

pub struct ApcHead {
    base: DecodeHeadBase,
    acm_modules: Vec<Acm>,
    bottleneck: ConvModule,
}

impl ApcHead {
    pub fn new(
        p: &mut ParamScope,
        head: DecodeHeadCfg,
        pool_scales: &[i64],
        fusion: bool,
    ) -> ApcHead {
        let (channels, norm) = (head.channels, head.norm);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let mut mp = p.sub("acm_modules");
        let acm_modules = pool_scales
            .iter()
            .enumerate()
            .map(|(i, &s)| Acm::new(&mut mp.sub(i), s, fusion, in_channels, channels, norm))
            .collect();
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(
                in_channels + pool_scales.len() as i64 * channels,
                channels,
                3,
            )
            .padding(1),
            norm,
            true,
        );
        ApcHead {
            base,
            acm_modules,
            bottleneck,
        }
    }
}

impl BaseHead for ApcHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let x = self.base.transform_inputs(features);
        let outs = self.acm_modules.iter().map(|acm| acm.forward(&x, training));
        fuse_with_input(&self.base, &self.bottleneck, &x, outs, training)
    }
}

/// `outs = [x] + [module(x) ...]; cat; bottleneck; cls_seg` (APCHead,
/// DMHead): the modules run in turn, their outputs kept for the concat.
pub(super) fn fuse_with_input(
    base: &DecodeHeadBase,
    bottleneck: &ConvModule,
    x: &Tensor,
    module_outputs: impl Iterator<Item = Tensor>,
    training: bool,
) -> Tensor {
    let mut outs = vec![x.shallow_clone()];
    outs.extend(module_outputs);
    let cat = Tensor::cat(&outs, 1);
    drop(outs);
    let output = bottleneck.forward(&cat, training);
    drop(cat);
    base.cls_seg(output, training)
}

#[cfg(test)]
#[path = "apc_head_tests.rs"]
mod tests;
