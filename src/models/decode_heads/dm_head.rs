//! `DMHead`, the dynamic multi-scale filter head, as MMSeg's
//! `mmseg/models/decode_heads/dm_head.py` builds it.
//!
//! He et al., "Dynamic Multi-scale Filters for Semantic Segmentation",
//! ICCV 2019.
//!
//! One dynamic convolution module (DCM) per filter size: the map pooled to
//! `k x k` gives, per image and channel, a `k x k` depthwise filter that is
//! convolved with the reduced map (all images in one grouped convolution),
//! then normalised and activated. The input and the modules' outputs are
//! concatenated and fused by a 3x3 bottleneck.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{count_flops, Conv2d, ConvModule, ConvNorm, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/dm_head.py";

/// The registry's constructor (`DECODE_HEADS` row `DMHead`):
/// `DMHead(filter_sizes=(1, 3, 5, 7), fusion=False, **kwargs)`.
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "DMHead", SOURCE);
    let filter_sizes = c.ints("filter_sizes", &[1, 3, 5, 7])?;
    if filter_sizes.iter().any(|&k| k <= 0) {
        return Err(c.config_error(format!(
            "filter_sizes must be positive, not {filter_sizes:?}"
        )));
    }
    let fusion = c.flag("fusion", false);
    let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
    c.finish()?;
    Ok(Box::new(DmHead::new(p, head, &filter_sizes, fusion)))
}

/// `DCM(filter_size, fusion, in_channels, channels, ...)`.
struct Dcm {
    filter_size: i64,
    filter_gen_conv: Conv2d,
    input_redu_conv: ConvModule,
    norm: Option<ConvNorm>,
    fusion_conv: Option<ConvModule>,
}

impl Dcm {
    fn new(
        p: &mut ParamScope,
        filter_size: i64,
        fusion: bool,
        in_channels: i64,
        channels: i64,
        norm: Option<NormCfg>,
    ) -> Dcm {
        let filter_gen_conv = Conv2d::new(
            &mut p.sub("filter_gen_conv"),
            ConvSpec::new(in_channels, channels, 1),
        );
        let input_redu_conv = ConvModule::new(
            &mut p.sub("input_redu_conv"),
            ConvSpec::new(in_channels, channels, 1),
            norm,
            true,
        );
        let norm_layer = norm.map(|n| ConvNorm::new(&mut p.sub("norm"), channels, &n));
        let fusion_conv = fusion.then(|| {
            ConvModule::new(
                &mut p.sub("fusion_conv"),
                ConvSpec::new(channels, channels, 1),
                norm,
                true,
            )
        });
        Dcm {
            filter_size,
            filter_gen_conv,
            input_redu_conv,
            norm: norm_layer,
            fusion_conv,
        }
    }

    fn forward(&self, input: &Tensor, training: bool) -> Tensor {
        let k = self.filter_size;
        let generated_filter = {
            let pooled = input.adaptive_avg_pool2d([k, k]);
            self.filter_gen_conv.forward(&pooled) // [B, c, k, k]
        };
        let x = self.input_redu_conv.forward(input, training); // [B, c, h, w]
        let s = x.size();
        let (b, c, h, w) = (s[0], s[1], s[2], s[3]);
        let x = x.view([1, b * c, h, w]);
        let generated_filter = generated_filter.view([b * c, 1, k, k]);
        let pad = (k - 1) / 2;
        let p2d = if (k - 1) % 2 == 0 {
            [pad, pad, pad, pad]
        } else {
            [pad + 1, pad, pad + 1, pad]
        };
        // F.pad copies even with zero padding (constant_pad_nd clones).
        let padded = x.constant_pad_nd(p2d);
        drop(x);
        count_flops(2.0 * (b * c * h * w * k * k) as f64);
        let output = padded
            .conv2d(
                &generated_filter,
                None::<Tensor>,
                [1, 1],
                [0, 0],
                [1, 1],
                b * c,
            )
            .view([b, c, h, w]);
        drop(padded);
        // Reassigned, not shadowed: each replaced tensor dies unless saved.
        let mut output = output;
        if let Some(norm) = &self.norm {
            output = norm.forward(&output, training);
        }
        // build_activation_layer(ReLU): nn.ReLU(), not in place.
        output = output.relu();
        match &self.fusion_conv {
            Some(fusion) => fusion.forward(&output, training),
            None => output,
        }
    }
}

pub struct DmHead {
    base: DecodeHeadBase,
    dcm_modules: Vec<Dcm>,
    bottleneck: ConvModule,
}

impl DmHead {
    pub fn new(
        p: &mut ParamScope,
        head: DecodeHeadCfg,
        filter_sizes: &[i64],
        fusion: bool,
    ) -> DmHead {
        let (channels, norm) = (head.channels, head.norm);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let mut mp = p.sub("dcm_modules");
        let dcm_modules = filter_sizes
            .iter()
            .enumerate()
            .map(|(i, &k)| Dcm::new(&mut mp.sub(i), k, fusion, in_channels, channels, norm))
            .collect();
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(
                in_channels + filter_sizes.len() as i64 * channels,
                channels,
                3,
            )
            .padding(1),
            norm,
            true,
        );
        DmHead {
            base,
            dcm_modules,
            bottleneck,
        }
    }
}

impl BaseHead for DmHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let x = self.base.transform_inputs(features);
        let outs = self.dcm_modules.iter().map(|dcm| dcm.forward(&x, training));
        super::apc_head::fuse_with_input(&self.base, &self.bottleneck, &x, outs, training)
    }
}

#[cfg(test)]
#[path = "dm_head_tests.rs"]
mod tests;
