//! `UPerHead`, the Unified Perceptual Parsing decoder, as MMSeg's
//! `mmseg/models/decode_heads/uper_head.py` builds it.
//!
//! Xiao et al., "Unified Perceptual Parsing for Scene Understanding", ECCV
//! 2018, arXiv:1807.10221.
//!
//! A pyramid pooling module (see [`super::psp_head`]) on the last feature
//! map, 1x1 lateral ConvModules on the others, a top-down path adding each
//! level to the upsampled one above, 3x3 ConvModules on every level but the
//! top, all levels upsampled to the finest, concatenated and fused by a 3x3
//! ConvModule. The lateral and FPN convs use an out-of-place ReLU
//! (`inplace=False`), as in MMSeg.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, FeatureHead, InputTransform};
use super::psp_head::{read_pool_scales, Ppm};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/uper_head.py";

/// The registry's constructor (`DECODE_HEADS` row `UPerHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = UperHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(UperHead::new(p, cfg)))
}

/// As K-Net's kernel generate head.
pub fn build_feature_head(
    p: &mut ParamScope,
    cfg: &Dict,
) -> Result<Box<dyn FeatureHead>, ModelError> {
    let cfg = UperHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(UperHead::new(p, cfg)))
}

/// `UPerHead(pool_scales=(1, 2, 3, 6), **kwargs)`, always `multiple_select`.
#[derive(Debug, Clone, PartialEq)]
pub struct UperHeadCfg {
    pub head: DecodeHeadCfg,
    pub pool_scales: Vec<i64>,
}

impl UperHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<UperHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "UPerHead", SOURCE);
        let pool_scales = read_pool_scales(&mut c)?;
        let head = DecodeHeadCfg::from_cfg(&mut c, Some(InputTransform::MultipleSelect))?;
        c.finish()?;
        Ok(UperHeadCfg { head, pool_scales })
    }
}

pub struct UperHead {
    base: DecodeHeadBase,
    psp_modules: Ppm,
    bottleneck: ConvModule,
    lateral_convs: Vec<ConvModule>,
    fpn_convs: Vec<ConvModule>,
    fpn_bottleneck: ConvModule,
}

impl UperHead {
    pub fn new(p: &mut ParamScope, cfg: UperHeadCfg) -> UperHead {
        let head = cfg.head;
        let (channels, norm, align_corners) = (head.channels, head.norm, head.align_corners);
        let in_channels = head.in_channels.clone();
        let top = *in_channels.last().expect("in_channels is not empty");
        let base = DecodeHeadBase::new(p, head);
        let psp_modules = Ppm::new(
            &mut p.sub("psp_modules"),
            &cfg.pool_scales,
            top,
            channels,
            norm,
            align_corners,
        );
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(top + cfg.pool_scales.len() as i64 * channels, channels, 3).padding(1),
            norm,
            true,
        );
        let levels = &in_channels[..in_channels.len() - 1];
        let lateral_convs = levels
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                ConvModule::new(
                    &mut p.sub("lateral_convs").sub(i),
                    ConvSpec::new(c, channels, 1),
                    norm,
                    true,
                )
                .out_of_place()
            })
            .collect();
        let fpn_convs = (0..levels.len())
            .map(|i| {
                ConvModule::new(
                    &mut p.sub("fpn_convs").sub(i),
                    ConvSpec::new(channels, channels, 3).padding(1),
                    norm,
                    true,
                )
                .out_of_place()
            })
            .collect();
        let fpn_bottleneck = ConvModule::new(
            &mut p.sub("fpn_bottleneck"),
            ConvSpec::new(in_channels.len() as i64 * channels, channels, 3).padding(1),
            norm,
            true,
        );
        UperHead {
            base,
            psp_modules,
            bottleneck,
            lateral_convs,
            fpn_convs,
            fpn_bottleneck,
        }
    }

    /// `psp_forward(inputs)`: PPM on the top level, fused: `[B, channels, h, w]`.
    fn psp_forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut psp_outs = vec![x.shallow_clone()];
        psp_outs.extend(self.psp_modules.forward(x, training));
        let cat = Tensor::cat(&psp_outs, 1);
        drop(psp_outs);
        self.bottleneck.forward(&cat, training)
    }
}

impl BaseHead for UperHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let feats = self.forward_feature(features, training);
        self.base.cls_seg(feats, training)
    }
}

impl FeatureHead for UperHead {
    fn forward_feature(&self, features: &[Tensor], training: bool) -> Tensor {
        let align_corners = self.base.cfg.align_corners;
        let inputs = self.base.selected_inputs(features);
        let mut laterals: Vec<Tensor> = self
            .lateral_convs
            .iter()
            .enumerate()
            .map(|(i, conv)| conv.forward(inputs[i], training))
            .collect();
        laterals.push(self.psp_forward(inputs[inputs.len() - 1], training));
        let levels = laterals.len();
        for i in (1..levels).rev() {
            let size = (laterals[i - 1].size()[2], laterals[i - 1].size()[3]);
            let up = resize_bilinear(&laterals[i], size, align_corners);
            laterals[i - 1] = &laterals[i - 1] + up;
        }
        let mut fpn_outs: Vec<Tensor> = (0..levels - 1)
            .map(|i| self.fpn_convs[i].forward(&laterals[i], training))
            .collect();
        fpn_outs.push(laterals[levels - 1].shallow_clone());
        let size = (fpn_outs[0].size()[2], fpn_outs[0].size()[3]);
        for i in (1..levels).rev() {
            fpn_outs[i] = resize_bilinear(&fpn_outs[i], size, align_corners);
        }
        let cat = Tensor::cat(&fpn_outs, 1); // [B, levels * channels, H_0, W_0]
        drop(fpn_outs);
        let feats = self.fpn_bottleneck.forward(&cat, training);
        drop(cat);
        drop(laterals);
        feats
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
    fn upernet_r50_head_has_mmsegs_parameter_count() {
        // `model.decode_head` of upernet/upernet_r50_4xb2-40k_cityscapes-512x1024.py.
        let cfg = dict(json!({
            "type": "UPerHead", "in_channels": [256, 512, 1024, 2048], "in_index": [0, 1, 2, 3],
            "pool_scales": [1, 2, 3, 6], "channels": 512, "dropout_ratio": 0.1,
            "num_classes": 19, "norm_cfg": {"type": "SyncBN", "requires_grad": true},
            "align_corners": false,
            "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
        }));
        let mut store = ParamStore::new(Device::Cpu);
        let head = build(&mut store.scope("decode_head"), &cfg).unwrap();
        // params_all.json, upernet/upernet_r50_4xb2-40k_cityscapes-512x1024.py:
        // by_prefix.decode_head.total
        assert_eq!(store.total(), 40_523_283);
        let feats: Vec<Tensor> = [(256, 16), (512, 8), (1024, 4), (2048, 2)]
            .iter()
            .map(|&(c, s)| Tensor::zeros([2, c, s, s], (Kind::Float, Device::Cpu)))
            .collect();
        assert_eq!(head.forward(&feats, None, true).size(), [2, 19, 16, 16]);
    }
}
