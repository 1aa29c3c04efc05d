//! `SegformerHead`, the all-MLP decoder of SegFormer, as MMSeg's
//! `mmseg/models/decode_heads/segformer_head.py` builds it.
//!
//! Xie et al., "SegFormer: Simple and Efficient Design for Semantic
//! Segmentation with Transformers", NeurIPS 2021, arXiv:2105.15203.
//!
//! Each selected encoder level goes through a 1x1 ConvModule to `channels`,
//! is upsampled to the first level's size, all are concatenated and fused by
//! another 1x1 ConvModule, then classified.

use super::decode_head::{DecodeHeadBase, DecodeHeadCfg, HeadLosses};
use super::layers::{resize_bilinear, ConvModule, ConvSpec};
use super::params::ParamScope;
use super::ModelError;
use crate::config::{Dict, Value};
use tch::Tensor;

pub struct SegformerHead {
    base: DecodeHeadBase,
    convs: Vec<ConvModule>,
    fusion_conv: ConvModule,
}

impl SegformerHead {
    pub fn new(p: &mut ParamScope, cfg: &Dict) -> Result<SegformerHead, ModelError> {
        let head = DecodeHeadCfg::from_cfg(cfg)?;
        if let Some(mode) = cfg.get("interpolate_mode").and_then(Value::as_str) {
            if mode != "bilinear" {
                return Err(ModelError::Unsupported(format!(
                    "SegformerHead interpolate_mode `{mode}`"
                )));
            }
        }
        if head.in_channels.len() != head.in_index.len() {
            return Err(ModelError::Config(
                "SegformerHead: in_channels and in_index must have the same length".into(),
            ));
        }
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
        Ok(SegformerHead {
            base,
            convs,
            fusion_conv,
        })
    }

    pub fn forward(&self, features: &[Tensor], training: bool) -> Tensor {
        let inputs: Vec<&Tensor> = self
            .base
            .cfg
            .in_index
            .iter()
            .map(|i| {
                &features[if *i < 0 {
                    (features.len() as i64 + i) as usize
                } else {
                    *i as usize
                }]
            })
            .collect();
        let size = (inputs[0].size()[2], inputs[0].size()[3]);
        let mut outs = Vec::with_capacity(inputs.len());
        for (x, conv) in inputs.iter().zip(&self.convs) {
            let y = conv.forward(x, training);
            outs.push(resize_bilinear(&y, size, self.base.cfg.align_corners));
        }
        // `outs` lives until the function returns, as the Python list does.
        let fused = self.fusion_conv.forward(&Tensor::cat(&outs, 1), training);
        let logits = self.base.cls_seg(fused, training);
        drop(outs);
        logits
    }

    pub fn loss(&self, features: &[Tensor], labels: &[Tensor], training: bool) -> HeadLosses {
        // `seg_logits` stays alive in `loss()` while `loss_by_feat` runs.
        let logits = self.forward(features, training);
        self.base.loss_by_feat(&logits, labels)
    }

    pub fn num_classes(&self) -> i64 {
        self.base.cfg.num_classes
    }

    pub fn ignore_index(&self) -> i64 {
        self.base.cfg.ignore_index
    }
}
