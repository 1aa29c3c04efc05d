//! `SegformerHead`, the all-MLP decoder of SegFormer, as MMSeg's
//! `mmseg/models/decode_heads/segformer_head.py` builds it.
//!
//! Xie et al., "SegFormer: Simple and Efficient Design for Semantic
//! Segmentation with Transformers", NeurIPS 2021, arXiv:2105.15203.
//!
//! Each selected encoder level goes through a 1x1 ConvModule to `channels`,
//! is upsampled to the first level's size, all are concatenated and fused by
//! another 1x1 ConvModule, then classified.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, InputTransform};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/segformer_head.py";

/// The registry's constructor (`DECODE_HEADS` row `SegformerHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = SegformerHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(SegformerHead::new(p, cfg)))
}

/// `SegformerHead(interpolate_mode='bilinear', **kwargs)`: BaseDecodeHead's
/// settings with `input_transform='multiple_select'`.
#[derive(Debug, Clone, PartialEq)]
pub struct SegformerHeadCfg {
    pub head: DecodeHeadCfg,
}

impl SegformerHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<SegformerHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "SegformerHead", SOURCE);
        if let Some(mode) = c.string("interpolate_mode")? {
            if mode != "bilinear" {
                return Err(c.unsupported(
                    "interpolate_mode",
                    format!("`{mode}` (only 'bilinear' is implemented)"),
                ));
            }
        }
        let head = DecodeHeadCfg::from_cfg(&mut c, Some(InputTransform::MultipleSelect))?;
        c.finish()?;
        Ok(SegformerHeadCfg { head })
    }
}

pub struct SegformerHead {
    base: DecodeHeadBase,
    convs: Vec<ConvModule>,
    fusion_conv: ConvModule,
}

impl SegformerHead {
    pub fn new(p: &mut ParamScope, cfg: SegformerHeadCfg) -> SegformerHead {
        let head = cfg.head;
        let (channels, norm) = (head.channels, head.norm);
        let in_channels = head.in_channels.clone();
        let base = DecodeHeadBase::new(p, head);
        let mut cp = p.sub("convs");
        let convs = in_channels
            .iter()
            .enumerate()
            .map(|(i, c)| {
                ConvModule::new(&mut cp.sub(i), ConvSpec::new(*c, channels, 1), norm, true)
            })
            .collect();
        let fusion_conv = ConvModule::new(
            &mut p.sub("fusion_conv"),
            ConvSpec::new(channels * in_channels.len() as i64, channels, 1),
            norm,
            true,
        );
        SegformerHead {
            base,
            convs,
            fusion_conv,
        }
    }
}

impl BaseHead for SegformerHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let inputs = self.base.selected_inputs(features); // [B, C_i, H_i, W_i]
        let size = (inputs[0].size()[2], inputs[0].size()[3]); // (H_0, W_0)
        let mut outs = Vec::with_capacity(inputs.len());
        for (x, conv) in inputs.iter().zip(&self.convs) {
            let y = conv.forward(x, training); // [B, channels, H_i, W_i]
            outs.push(resize_bilinear(&y, size, self.base.cfg.align_corners)); // [B, channels, H_0, W_0]
        }
        // `outs` lives until the function returns, as the Python list does.
        let fused = self.fusion_conv.forward(&Tensor::cat(&outs, 1), training); // [B, channels, H_0, W_0]
        let logits = self.base.cls_seg(fused, training); // [B, num_classes, H_0, W_0]
        drop(outs);
        logits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use crate::models::params::ParamStore;
    use serde_json::json;

    /// `model.decode_head` of the SegFormer-B0 configs.
    fn b0_head(num_classes: i64) -> Dict {
        dict(json!({
            "type": "SegformerHead",
            "in_channels": [32, 64, 160, 256],
            "in_index": [0, 1, 2, 3],
            "channels": 256,
            "dropout_ratio": 0.1,
            "num_classes": num_classes,
            "norm_cfg": {"type": "SyncBN", "requires_grad": true},
            "align_corners": false,
            "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
        }))
    }

    fn head_params(cfg: &Dict) -> i64 {
        let mut store = ParamStore::new(tch::Device::Cpu);
        build(&mut store.scope("decode_head"), cfg).unwrap();
        store.total()
    }

    #[test]
    fn the_b0_head_has_mmsegs_parameter_count() {
        // params_all.json, segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py:
        // by_prefix.decode_head.total
        assert_eq!(head_params(&b0_head(150)), 434_326);
        // params_all.json, segformer/segformer_mit-b0_8xb1-160k_cityscapes-1024x1024.py:
        // by_prefix.decode_head.total
        assert_eq!(head_params(&b0_head(19)), 400_659);
    }

    #[test]
    fn keys_segformer_head_does_not_take_are_refused_by_name() {
        let mut cfg = b0_head(150);
        cfg.insert("pool_scales".into(), crate::config::Value::Int(1));
        let err = SegformerHeadCfg::from_cfg(&cfg).unwrap_err().to_string();
        assert!(
            err.contains("`pool_scales`") && err.contains(SOURCE),
            "{err}"
        );
        let mut cfg = b0_head(150);
        cfg.insert(
            "input_transform".into(),
            crate::config::Value::Str("resize_concat".into()),
        );
        assert!(SegformerHeadCfg::from_cfg(&cfg).is_err());
    }
}
