//! `FCNHead`, the fully convolutional head, as MMSeg's
//! `mmseg/models/decode_heads/fcn_head.py` builds it; also the auxiliary head
//! of most ResNet-family configs.
//!
//! Long, Shelhamer and Darrell, "Fully Convolutional Networks for Semantic
//! Segmentation", CVPR 2015, arXiv:1411.4038.
//!
//! `num_convs` 3x3 ConvModules (dilated by `dilation`) on the selected
//! feature map, optionally concatenated with that input and fused by
//! `conv_cat`, then classified.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, FeatureHead};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{ConvModule, ConvSpec, DepthwiseSeparableConvModule};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/fcn_head.py";

/// The registry's constructor (`DECODE_HEADS` row `FCNHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = FcnHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(FcnHead::new(p, cfg)))
}

/// As K-Net's kernel generate head.
pub fn build_feature_head(
    p: &mut ParamScope,
    cfg: &Dict,
) -> Result<Box<dyn FeatureHead>, ModelError> {
    let cfg = FcnHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(FcnHead::new(p, cfg)))
}

/// `FCNHead(num_convs=2, kernel_size=3, concat_input=True, dilation=1, **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct FcnHeadCfg {
    pub head: DecodeHeadCfg,
    pub num_convs: i64,
    pub kernel_size: i64,
    pub concat_input: bool,
    pub dilation: i64,
}

impl FcnHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<FcnHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "FCNHead", SOURCE);
        let cfg = Self::read(&mut c, None)?;
        c.finish()?;
        Ok(cfg)
    }

    /// FCNHead's keys from `c`; a subclass that calls
    /// `super().__init__(num_convs=2, **kwargs)` passes `Some(2)`, and a
    /// `num_convs` in its config is then left unread (refused by name).
    pub fn read(c: &mut ComponentConfig, num_convs: Option<i64>) -> Result<FcnHeadCfg, ModelError> {
        let num_convs = match num_convs {
            Some(n) => n,
            None => c.int("num_convs", 2)?,
        };
        let kernel_size = c.int("kernel_size", 3)?;
        let concat_input = c.flag("concat_input", true);
        let dilation = c.int("dilation", 1)?;
        // FCNHead.__init__'s assertions.
        if num_convs < 0 || dilation <= 0 || kernel_size <= 0 {
            return Err(c.config_error("needs num_convs >= 0, dilation > 0 and kernel_size > 0"));
        }
        let head = DecodeHeadCfg::from_cfg(c, None)?;
        if num_convs == 0 && head.in_channels.iter().sum::<i64>() != head.channels {
            return Err(c.config_error("with num_convs=0, in_channels must equal channels"));
        }
        Ok(FcnHeadCfg {
            head,
            num_convs,
            kernel_size,
            concat_input,
            dilation,
        })
    }
}

/// The block an FCNHead subclass (GCHead, NLHead, DNLHead, ...) applies
/// between `convs[0]` and `convs[1]`.
pub trait MidBlock {
    /// `[B, C, h, w]` in and out.
    fn forward(&self, x: &Tensor, training: bool) -> Tensor;
}

/// One of FCNHead's convs: mmcv's `ConvModule`, or the
/// `DepthwiseSeparableConvModule` that `DepthwiseSeparableFCNHead` puts in
/// its place (`sep_fcn_head.rs`).
pub enum FcnConv {
    Plain(ConvModule),
    Separable(DepthwiseSeparableConvModule),
}

impl FcnConv {
    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        match self {
            FcnConv::Plain(c) => c.forward(x, training),
            FcnConv::Separable(c) => c.forward(x, training),
        }
    }
}

pub struct FcnHead {
    base: DecodeHeadBase,
    convs: Vec<FcnConv>,
    conv_cat: Option<FcnConv>,
    /// A subclass's block after `convs[0]`.
    mid_block: Option<Box<dyn MidBlock>>,
}

impl FcnHead {
    /// A subclass's head: the FCN modules, then (as the subclass's
    /// `__init__` registers it, named by `build_block`) its block, built
    /// from the head's `channels` and `norm_cfg`.
    pub fn with_block(
        p: &mut ParamScope,
        cfg: FcnHeadCfg,
        build_block: impl FnOnce(&mut ParamScope, i64, Option<NormCfg>) -> Box<dyn MidBlock>,
    ) -> FcnHead {
        let (channels, norm) = (cfg.head.channels, cfg.head.norm);
        let mut head = FcnHead::new(p, cfg);
        head.mid_block = Some(build_block(p, channels, norm));
        head
    }

    /// The head with other convs in place of its own (as a subclass
    /// replaces them), `base` built first (its `conv_seg` named first).
    pub fn with_convs(
        base: DecodeHeadBase,
        convs: Vec<FcnConv>,
        conv_cat: Option<FcnConv>,
    ) -> FcnHead {
        FcnHead {
            base,
            convs,
            conv_cat,
            mid_block: None,
        }
    }

    pub fn new(p: &mut ParamScope, cfg: FcnHeadCfg) -> FcnHead {
        let head = cfg.head;
        let (channels, norm) = (head.channels, head.norm);
        // resize_concat heads see the sum of the selected maps' channels.
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let k = cfg.kernel_size;
        let mut cp = p.sub("convs");
        let convs = (0..cfg.num_convs)
            .map(|i| {
                let from = if i == 0 { in_channels } else { channels };
                let spec = ConvSpec::new(from, channels, k)
                    .padding((k / 2) * cfg.dilation)
                    .dilation(cfg.dilation);
                FcnConv::Plain(ConvModule::new(&mut cp.sub(i), spec, norm, true))
            })
            .collect();
        let conv_cat = cfg.concat_input.then(|| {
            let spec = ConvSpec::new(in_channels + channels, channels, k).padding(k / 2);
            FcnConv::Plain(ConvModule::new(&mut p.sub("conv_cat"), spec, norm, true))
        });
        FcnHead {
            base,
            convs,
            conv_cat,
            mid_block: None,
        }
    }
}

impl BaseHead for FcnHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let feats = self.forward_feature(features, training);
        self.base.cls_seg(feats, training) // [B, num_classes, h, w]
    }
}

impl FeatureHead for FcnHead {
    fn forward_feature(&self, features: &[Tensor], training: bool) -> Tensor {
        let x = self.base.transform_inputs(features); // [B, C_in, h, w]
                                                      // nn.Sequential rebinds its input: each intermediate dies when the next exists.
        let mut feats = x.shallow_clone();
        for (i, conv) in self.convs.iter().enumerate() {
            feats = conv.forward(&feats, training); // [B, channels, h, w]
            if let (0, Some(block)) = (i, &self.mid_block) {
                feats = block.forward(&feats, training);
            }
        }
        if let Some(conv_cat) = &self.conv_cat {
            let cat = Tensor::cat(&[&x, &feats], 1); // [B, C_in + channels, h, w]
            let fused = conv_cat.forward(&cat, training); // [B, channels, h, w]
            drop(cat);
            feats = fused;
        }
        feats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use crate::models::params::ParamStore;
    use serde_json::json;

    /// `model.decode_head` and `model.auxiliary_head` of
    /// fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024.py, resolved.
    fn fcn_r50_heads() -> (Dict, Dict) {
        let common = |j: serde_json::Value| {
            let mut d = json!({
                "type": "FCNHead",
                "dropout_ratio": 0.1,
                "num_classes": 19,
                "norm_cfg": {"type": "SyncBN", "requires_grad": true},
                "align_corners": false,
            });
            d.as_object_mut()
                .unwrap()
                .extend(j.as_object().unwrap().clone());
            dict(d)
        };
        (
            common(
                json!({"in_channels": 2048, "in_index": 3, "channels": 512, "num_convs": 2,
                "concat_input": true,
                "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}}),
            ),
            common(
                json!({"in_channels": 1024, "in_index": 2, "channels": 256, "num_convs": 1,
                "concat_input": false,
                "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 0.4}}),
            ),
        )
    }

    fn head(cfg: &Dict, scope: &str) -> (ParamStore, Box<dyn DecodeHead>) {
        let mut store = ParamStore::new(tch::Device::Cpu);
        let head = build(&mut store.scope(scope), cfg).unwrap();
        (store, head)
    }

    #[test]
    fn fcn_r50_heads_have_mmsegs_parameter_counts() {
        let (decode, aux) = fcn_r50_heads();
        // params_all.json, fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024.py:
        // by_prefix.decode_head.total and by_prefix.auxiliary_head.total
        assert_eq!(head(&decode, "decode_head").0.total(), 23_605_779);
        assert_eq!(head(&aux, "auxiliary_head").0.total(), 2_364_691);
    }

    #[test]
    fn the_head_classifies_the_selected_map_at_its_resolution() {
        let (_, aux) = fcn_r50_heads();
        let (_, head) = head(&aux, "auxiliary_head");
        let features: Vec<Tensor> = [256, 512, 1024, 2048]
            .iter()
            .map(|c| Tensor::zeros([2, *c, 8, 8], (tch::Kind::Float, tch::Device::Cpu)))
            .collect();
        assert_eq!(head.forward(&features, None, true).size(), [2, 19, 8, 8]);
        let labels: Vec<Tensor> = (0..2)
            .map(|_| Tensor::zeros([1, 64, 64], (tch::Kind::Int64, tch::Device::Cpu)))
            .collect();
        let names: Vec<String> = head
            .loss(&features, None, &labels)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["loss_ce", "acc_seg"]);
    }

    #[test]
    fn keys_fcn_head_does_not_take_are_refused_by_name() {
        let (mut decode, _) = fcn_r50_heads();
        decode.insert("pool_scales".into(), crate::config::Value::Int(1));
        let err = FcnHeadCfg::from_cfg(&decode).unwrap_err().to_string();
        assert!(
            err.contains("`pool_scales`") && err.contains(SOURCE),
            "{err}"
        );
    }
}
