//! `ASPPHead`, DeepLabV3's atrous spatial pyramid pooling head, and its
//! `ASPPModule`, as MMSeg's `mmseg/models/decode_heads/aspp_head.py` builds
//! them.
//!
//! Chen et al., "Rethinking Atrous Convolution for Semantic Image
//! Segmentation", arXiv:1706.05587.
//!
//! Parallel branches on the feature map: an image-level pooling branch
//! (global average pool, 1x1 ConvModule, upsampled back) and one ConvModule
//! per dilation (1x1 for dilation 1, 3x3 atrous otherwise), concatenated and
//! fused by a 3x3 ConvModule. The image-pool branch puts BatchNorm on one
//! value per channel and image: at batch 1 MMSeg stops with "Expected more
//! than 1 value per channel when training".

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, FeatureHead};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec, DepthwiseSeparableConvModule};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/aspp_head.py";

/// The registry's constructor (`DECODE_HEADS` row `ASPPHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    Ok(Box::new(from_dict(p, cfg)?))
}

/// As K-Net's kernel generate head.
pub fn build_feature_head(
    p: &mut ParamScope,
    cfg: &Dict,
) -> Result<Box<dyn FeatureHead>, ModelError> {
    Ok(Box::new(from_dict(p, cfg)?))
}

fn from_dict(p: &mut ParamScope, cfg: &Dict) -> Result<AsppHead, ModelError> {
    let mut c = ComponentConfig::new(cfg, "ASPPHead", SOURCE);
    let cfg = AsppHeadCfg::from_cfg(&mut c)?;
    c.finish()?;
    Ok(AsppHead::new(p, cfg, AsppKind::Plain))
}

/// `ASPPHead(dilations=(1, 6, 12, 18), **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct AsppHeadCfg {
    pub head: DecodeHeadCfg,
    pub dilations: Vec<i64>,
}

impl AsppHeadCfg {
    /// Reads ASPPHead's settings (also the base of DepthwiseSeparableASPPHead's).
    pub fn from_cfg(c: &mut ComponentConfig) -> Result<AsppHeadCfg, ModelError> {
        let dilations = c.ints("dilations", &[1, 6, 12, 18])?;
        if dilations.is_empty() || dilations.iter().any(|&d| d <= 0) {
            return Err(c.config_error(format!(
                "dilations must be positive ints, not {dilations:?}"
            )));
        }
        let head = DecodeHeadCfg::from_cfg(c, None)?;
        Ok(AsppHeadCfg { head, dilations })
    }
}

/// Which ASPP the branches are: `ASPPModule` (plain convs) or
/// `DepthwiseSeparableASPPModule` (depthwise separable for dilation > 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsppKind {
    Plain,
    DepthwiseSeparable,
}

/// One ASPP branch.
enum Branch {
    Conv(ConvModule),
    Separable(DepthwiseSeparableConvModule),
}

impl Branch {
    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        match self {
            Branch::Conv(c) => c.forward(x, training),
            Branch::Separable(c) => c.forward(x, training),
        }
    }
}

/// `ASPPModule` / `DepthwiseSeparableASPPModule`: one branch per dilation.
pub struct AsppModule {
    branches: Vec<Branch>,
}

impl AsppModule {
    pub fn new(
        p: &mut ParamScope,
        kind: AsppKind,
        dilations: &[i64],
        in_channels: i64,
        channels: i64,
        norm: Option<NormCfg>,
    ) -> AsppModule {
        let branches = dilations
            .iter()
            .enumerate()
            .map(|(i, &dilation)| {
                let mut bp = p.sub(i);
                if dilation == 1 {
                    let spec = ConvSpec::new(in_channels, channels, 1);
                    Branch::Conv(ConvModule::new(&mut bp, spec, norm, true))
                } else {
                    let spec = ConvSpec::new(in_channels, channels, 3)
                        .dilation(dilation)
                        .padding(dilation);
                    match kind {
                        AsppKind::Plain => Branch::Conv(ConvModule::new(&mut bp, spec, norm, true)),
                        AsppKind::DepthwiseSeparable => Branch::Separable(
                            DepthwiseSeparableConvModule::new(&mut bp, spec, norm, true),
                        ),
                    }
                }
            })
            .collect();
        AsppModule { branches }
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        self.branches
            .iter()
            .map(|b| b.forward(x, training))
            .collect()
    }
}

/// ASPPHead's layers before the classifier, shared with
/// DepthwiseSeparableASPPHead.
pub struct AsppHead {
    pub(super) base: DecodeHeadBase,
    image_pool: ConvModule,
    aspp_modules: AsppModule,
    bottleneck: ConvModule,
}

impl AsppHead {
    pub fn new(p: &mut ParamScope, cfg: AsppHeadCfg, kind: AsppKind) -> AsppHead {
        let head = cfg.head;
        let (channels, norm) = (head.channels, head.norm);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        // nn.Sequential(nn.AdaptiveAvgPool2d(1), ConvModule(...)): item 1.
        let image_pool = ConvModule::new(
            &mut p.sub("image_pool").sub(1),
            ConvSpec::new(in_channels, channels, 1),
            norm,
            true,
        );
        let aspp_modules = AsppModule::new(
            &mut p.sub("aspp_modules"),
            kind,
            &cfg.dilations,
            in_channels,
            channels,
            norm,
        );
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new((cfg.dilations.len() as i64 + 1) * channels, channels, 3).padding(1),
            norm,
            true,
        );
        AsppHead {
            base,
            image_pool,
            aspp_modules,
            bottleneck,
        }
    }

    /// The pooled branch, the atrous branches, concatenated and fused:
    /// `[B, channels, h, w]`.
    pub fn aspp_features(&self, features: &[Tensor], training: bool) -> Tensor {
        let x = self.base.transform_inputs(features); // [B, C_in, h, w]
        let size = (x.size()[2], x.size()[3]);
        let pooled = x.adaptive_avg_pool2d([1, 1]); // [B, C_in, 1, 1]
        let pooled = self.image_pool.forward(&pooled, training); // [B, channels, 1, 1]
        let mut aspp_outs = vec![resize_bilinear(&pooled, size, self.base.cfg.align_corners)];
        drop(pooled);
        aspp_outs.extend(self.aspp_modules.forward(&x, training));
        let cat = Tensor::cat(&aspp_outs, 1); // [B, (n + 1) * channels, h, w]
        drop(aspp_outs);
        self.bottleneck.forward(&cat, training)
    }
}

impl BaseHead for AsppHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let feats = self.aspp_features(features, training);
        self.base.cls_seg(feats, training)
    }
}

impl FeatureHead for AsppHead {
    fn forward_feature(&self, features: &[Tensor], training: bool) -> Tensor {
        self.aspp_features(features, training)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use crate::models::params::ParamStore;
    use serde_json::json;
    use tch::{Device, Kind};

    #[test]
    fn deeplabv3_r50_head_has_mmsegs_parameter_count() {
        // `model.decode_head` of deeplabv3/deeplabv3_r50-d8_4xb2-40k_cityscapes-512x1024.py.
        let cfg = dict(json!({
            "type": "ASPPHead", "in_channels": 2048, "in_index": 3, "channels": 512,
            "dilations": [1, 12, 24, 36], "dropout_ratio": 0.1, "num_classes": 19,
            "norm_cfg": {"type": "SyncBN", "requires_grad": true}, "align_corners": false,
            "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
        }));
        let mut store = ParamStore::new(Device::Cpu);
        let head = build(&mut store.scope("decode_head"), &cfg).unwrap();
        // params_all.json, deeplabv3/deeplabv3_r50-d8_4xb2-40k_cityscapes-512x1024.py:
        // by_prefix.decode_head.total
        assert_eq!(store.total(), 42_221_075);
        let feats: Vec<Tensor> = (0..4)
            .map(|_| Tensor::zeros([2, 2048, 8, 8], (Kind::Float, Device::Cpu)))
            .collect();
        assert_eq!(head.forward(&feats, None, true).size(), [2, 19, 8, 8]);
    }
}
