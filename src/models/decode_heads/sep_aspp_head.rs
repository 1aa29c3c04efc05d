//! `DepthwiseSeparableASPPHead`, the DeepLabV3+ decoder, as MMSeg's
//! `mmseg/models/decode_heads/sep_aspp_head.py` builds it.
//!
//! Chen et al., "Encoder-Decoder with Atrous Separable Convolution for
//! Semantic Image Segmentation", ECCV 2018, arXiv:1802.02611.
//!
//! ASPP with depthwise separable atrous branches (see [`super::aspp_head`]);
//! its output is upsampled to the low-level feature map `inputs[0]`,
//! concatenated with that map reduced to `c1_channels` by a 1x1 ConvModule
//! (`c1_bottleneck`), and refined by two 3x3 depthwise separable
//! ConvModules before the classifier.

use super::aspp_head::{AsppHead, AsppHeadCfg, AsppKind};
use super::decode_head::{BaseHead, DecodeHeadBase};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec, DepthwiseSeparableConvModule};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/sep_aspp_head.py";

/// The registry's constructor (`DECODE_HEADS` row `DepthwiseSeparableASPPHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = SepAsppHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(SepAsppHead::new(p, cfg)))
}

/// `DepthwiseSeparableASPPHead(c1_in_channels, c1_channels, **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct SepAsppHeadCfg {
    pub aspp: AsppHeadCfg,
    pub c1_in_channels: i64,
    pub c1_channels: i64,
}

impl SepAsppHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<SepAsppHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "DepthwiseSeparableASPPHead", SOURCE);
        let required = |c: &mut ComponentConfig, key: &str| match c.value(key) {
            Some(v) => v
                .as_i64()
                .ok_or_else(|| c.config_error(format!("`{key}` must be an int"))),
            None => Err(c.config_error(format!("lacks `{key}` (a required argument)"))),
        };
        let c1_in_channels = required(&mut c, "c1_in_channels")?;
        let c1_channels = required(&mut c, "c1_channels")?;
        if c1_in_channels < 0 {
            return Err(c.config_error("c1_in_channels must be >= 0"));
        }
        let aspp = AsppHeadCfg::from_cfg(&mut c)?;
        c.finish()?;
        Ok(SepAsppHeadCfg {
            aspp,
            c1_in_channels,
            // Without c1_bottleneck nothing is concatenated, but MMSeg still
            // sizes sep_bottleneck's input as channels + c1_channels.
            c1_channels,
        })
    }
}

pub struct SepAsppHead {
    aspp: AsppHead,
    c1_bottleneck: Option<ConvModule>,
    sep_bottleneck: [DepthwiseSeparableConvModule; 2],
}

impl SepAsppHead {
    pub fn new(p: &mut ParamScope, cfg: SepAsppHeadCfg) -> SepAsppHead {
        let (channels, norm) = (cfg.aspp.head.channels, cfg.aspp.head.norm);
        let aspp = AsppHead::new(p, cfg.aspp, AsppKind::DepthwiseSeparable);
        let c1_bottleneck = (cfg.c1_in_channels > 0).then(|| {
            ConvModule::new(
                &mut p.sub("c1_bottleneck"),
                ConvSpec::new(cfg.c1_in_channels, cfg.c1_channels, 1),
                norm,
                true,
            )
        });
        let mut sp = p.sub("sep_bottleneck");
        let sep_bottleneck = [
            DepthwiseSeparableConvModule::new(
                &mut sp.sub(0),
                ConvSpec::new(channels + cfg.c1_channels, channels, 3).padding(1),
                norm,
                true,
            ),
            DepthwiseSeparableConvModule::new(
                &mut sp.sub(1),
                ConvSpec::new(channels, channels, 3).padding(1),
                norm,
                true,
            ),
        ];
        SepAsppHead {
            aspp,
            c1_bottleneck,
            sep_bottleneck,
        }
    }
}

impl BaseHead for SepAsppHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.aspp.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let mut output = self.aspp.aspp_features(features, training); // [B, channels, h, w]
        if let Some(c1_bottleneck) = &self.c1_bottleneck {
            let c1_output = c1_bottleneck.forward(&features[0], training); // [B, c1, H1, W1]
            let size = (c1_output.size()[2], c1_output.size()[3]);
            output = resize_bilinear(&output, size, self.aspp.base.cfg.align_corners);
            output = Tensor::cat(&[&output, &c1_output], 1); // [B, channels + c1, H1, W1]
        }
        for conv in &self.sep_bottleneck {
            output = conv.forward(&output, training);
        }
        self.aspp.base.cls_seg(output, training)
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
    fn deeplabv3plus_r50_head_has_mmsegs_parameter_count() {
        // `model.decode_head` of deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024.py.
        let cfg = dict(json!({
            "type": "DepthwiseSeparableASPPHead", "in_channels": 2048, "in_index": 3,
            "channels": 512, "dilations": [1, 12, 24, 36], "c1_in_channels": 256,
            "c1_channels": 48, "dropout_ratio": 0.1, "num_classes": 19,
            "norm_cfg": {"type": "SyncBN", "requires_grad": true}, "align_corners": false,
            "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
        }));
        let mut store = ParamStore::new(Device::Cpu);
        let head = build(&mut store.scope("decode_head"), &cfg).unwrap();
        // params_all.json, deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024.py:
        // by_prefix.decode_head.total
        assert_eq!(store.total(), 17_697_923);
        let feats = vec![
            Tensor::zeros([2, 256, 16, 16], (Kind::Float, Device::Cpu)),
            Tensor::zeros([2, 512, 8, 8], (Kind::Float, Device::Cpu)),
            Tensor::zeros([2, 1024, 8, 8], (Kind::Float, Device::Cpu)),
            Tensor::zeros([2, 2048, 8, 8], (Kind::Float, Device::Cpu)),
        ];
        assert_eq!(head.forward(&feats, None, true).size(), [2, 19, 16, 16]);
        let missing =
            dict(json!({"type": "DepthwiseSeparableASPPHead", "in_channels": 8, "channels": 4}));
        let err = SepAsppHeadCfg::from_cfg(&missing)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("lacks `c1_in_channels`"), "{err}");
    }
}
