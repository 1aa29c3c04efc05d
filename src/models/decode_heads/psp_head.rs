//! `PSPHead`, the pyramid pooling head, and its `PPM` module (also used by
//! `UPerHead`), as MMSeg's `mmseg/models/decode_heads/psp_head.py` builds
//! them.
//!
//! Zhao et al., "Pyramid Scene Parsing Network", CVPR 2017,
//! arXiv:1612.01105.
//!
//! The feature map is average-pooled to each of `pool_scales` (1, 2, 3, 6),
//! each pooled map goes through a 1x1 ConvModule and is upsampled back; the
//! map and the upsampled branches are concatenated and fused by a 3x3
//! ConvModule. The 1x1 pooled branch puts BatchNorm on one value per channel
//! and image: at batch 1 MMSeg stops with "Expected more than 1 value per
//! channel when training".

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, FeatureHead};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/psp_head.py";

/// The registry's constructor (`DECODE_HEADS` row `PSPHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = PspHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(PspHead::new(p, cfg)))
}

/// As K-Net's kernel generate head.
pub fn build_feature_head(
    p: &mut ParamScope,
    cfg: &Dict,
) -> Result<Box<dyn FeatureHead>, ModelError> {
    let cfg = PspHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(PspHead::new(p, cfg)))
}

/// `PSPHead(pool_scales=(1, 2, 3, 6), **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct PspHeadCfg {
    pub head: DecodeHeadCfg,
    pub pool_scales: Vec<i64>,
}

impl PspHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<PspHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "PSPHead", SOURCE);
        let pool_scales = read_pool_scales(&mut c)?;
        let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
        c.finish()?;
        Ok(PspHeadCfg { head, pool_scales })
    }
}

/// `pool_scales`, a non-empty tuple of positive ints (`assert
/// isinstance(pool_scales, (list, tuple))`).
pub(super) fn read_pool_scales(c: &mut ComponentConfig) -> Result<Vec<i64>, ModelError> {
    let scales = c.ints("pool_scales", &[1, 2, 3, 6])?;
    if scales.is_empty() || scales.iter().any(|&s| s <= 0) {
        return Err(c.config_error(format!("pool_scales must be positive ints, not {scales:?}")));
    }
    Ok(scales)
}

/// `PPM`: one `AdaptiveAvgPool2d(scale)` + 1x1 ConvModule branch per scale.
pub struct Ppm {
    branches: Vec<(i64, ConvModule)>,
    align_corners: bool,
}

impl Ppm {
    /// Branches named `<scope>.<i>.1` (`nn.Sequential(pool, ConvModule)`).
    pub fn new(
        p: &mut ParamScope,
        pool_scales: &[i64],
        in_channels: i64,
        channels: i64,
        norm: Option<NormCfg>,
        align_corners: bool,
    ) -> Ppm {
        let branches = pool_scales
            .iter()
            .enumerate()
            .map(|(i, &scale)| {
                let conv = ConvModule::new(
                    &mut p.sub(i).sub(1),
                    ConvSpec::new(in_channels, channels, 1),
                    norm,
                    true,
                );
                (scale, conv)
            })
            .collect();
        Ppm {
            branches,
            align_corners,
        }
    }

    /// `PPM.forward(x)`: the upsampled branch outputs, `[B, channels, h, w]` each.
    pub fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let size = (x.size()[2], x.size()[3]);
        self.branches
            .iter()
            .map(|(scale, conv)| {
                let pooled = x.adaptive_avg_pool2d([*scale, *scale]); // [B, C, s, s]
                let ppm_out = conv.forward(&pooled, training); // [B, channels, s, s]
                drop(pooled);
                resize_bilinear(&ppm_out, size, self.align_corners)
            })
            .collect()
    }
}

pub struct PspHead {
    base: DecodeHeadBase,
    psp_modules: Ppm,
    bottleneck: ConvModule,
}

impl PspHead {
    pub fn new(p: &mut ParamScope, cfg: PspHeadCfg) -> PspHead {
        let head = cfg.head;
        let (channels, norm, align_corners) = (head.channels, head.norm, head.align_corners);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let psp_modules = Ppm::new(
            &mut p.sub("psp_modules"),
            &cfg.pool_scales,
            in_channels,
            channels,
            norm,
            align_corners,
        );
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(
                in_channels + cfg.pool_scales.len() as i64 * channels,
                channels,
                3,
            )
            .padding(1),
            norm,
            true,
        );
        PspHead {
            base,
            psp_modules,
            bottleneck,
        }
    }
}

impl BaseHead for PspHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let feats = self.forward_feature(features, training);
        self.base.cls_seg(feats, training)
    }
}

impl FeatureHead for PspHead {
    fn forward_feature(&self, features: &[Tensor], training: bool) -> Tensor {
        let x = self.base.transform_inputs(features); // [B, C_in, h, w]
        let mut psp_outs = vec![x.shallow_clone()];
        psp_outs.extend(self.psp_modules.forward(&x, training));
        let cat = Tensor::cat(&psp_outs, 1); // [B, C_in + n * channels, h, w]
        drop(psp_outs);
        self.bottleneck.forward(&cat, training) // [B, channels, h, w]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use crate::models::params::ParamStore;
    use serde_json::json;
    use tch::{Device, Kind};

    /// `model.decode_head` of pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py.
    fn psp_r50() -> Dict {
        dict(json!({
            "type": "PSPHead", "in_channels": 2048, "in_index": 3, "channels": 512,
            "pool_scales": [1, 2, 3, 6], "dropout_ratio": 0.1, "num_classes": 19,
            "norm_cfg": {"type": "SyncBN", "requires_grad": true}, "align_corners": false,
            "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
        }))
    }

    #[test]
    fn pspnet_r50_head_has_mmsegs_parameter_count() {
        let mut store = ParamStore::new(Device::Cpu);
        let head = build(&mut store.scope("decode_head"), &psp_r50()).unwrap();
        // params_all.json, pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py:
        // by_prefix.decode_head.total
        assert_eq!(store.total(), 23_083_539);
        assert!(store
            .params
            .iter()
            .any(|p| p.name == "decode_head.psp_modules.3.1.conv.weight"));
        let feats: Vec<Tensor> = (0..4)
            .map(|_| Tensor::zeros([2, 2048, 8, 8], (Kind::Float, Device::Cpu)))
            .collect();
        assert_eq!(head.forward(&feats, None, true).size(), [2, 19, 8, 8]);
    }
}
