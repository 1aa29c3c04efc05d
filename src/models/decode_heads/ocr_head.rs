//! `OCRHead`, the object-contextual representations head, as MMSeg's
//! `mmseg/models/decode_heads/ocr_head.py` builds it, with the
//! `SelfAttentionBlock` of `mmseg/models/utils/self_attention_block.py`.
//!
//! Yuan, Chen and Wang, "Object-Contextual Representations for Semantic
//! Segmentation", ECCV 2020, arXiv:1909.11065.
//!
//! A cascade head (`BaseCascadeDecodeHead`): it takes the previous stage's
//! logits (an FCNHead in every MMSeg config). A 3x3 ConvModule makes the
//! pixel features; the soft object regions (a spatial softmax of the
//! previous logits) gather one context vector per class
//! (`SpatialGatherModule`); each pixel attends to those class contexts
//! (`ObjectAttentionBlock`: 2-conv key/query projections, 1-conv value and
//! out projections, scaled dot-product softmax), and the attended context,
//! concatenated with the pixel features, is fused by a 1x1 ConvModule
//! before the classifier.

use super::decode_head::{DecodeHeadBase, DecodeHeadCfg};
use super::{DecodeHead, LossItems};
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{count_flops, softmax_saved, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/ocr_head.py";

/// The registry's constructor (`DECODE_HEADS` row `OCRHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = OcrHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(OcrHead::new(p, cfg)))
}

/// `OCRHead(ocr_channels, scale=1, **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct OcrHeadCfg {
    pub head: DecodeHeadCfg,
    pub ocr_channels: i64,
}

impl OcrHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<OcrHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "OCRHead", SOURCE);
        let ocr_channels = match c.value("ocr_channels") {
            Some(v) => v
                .as_i64()
                .ok_or_else(|| c.config_error("`ocr_channels` must be an int"))?,
            None => return Err(c.config_error("lacks `ocr_channels` (a required argument)")),
        };
        // With scale > 1, ObjectAttentionBlock.forward calls resize() with
        // neither a size nor a scale factor, which raises in MMSeg.
        if c.int("scale", 1)? != 1 {
            return Err(c.config_error(
                "scale != 1 fails in MMSeg 1.2.2 (ObjectAttentionBlock resizes without a size)",
            ));
        }
        let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
        c.finish()?;
        Ok(OcrHeadCfg { head, ocr_channels })
    }
}

/// `SelfAttentionBlock.build_project(..., use_conv_module=True)`: one
/// ConvModule (named directly) or an `nn.Sequential` of them.
struct Project {
    convs: Vec<ConvModule>,
}

impl Project {
    fn new(
        p: &mut ParamScope,
        from: i64,
        to: i64,
        num_convs: i64,
        norm: Option<NormCfg>,
    ) -> Project {
        let convs = (0..num_convs)
            .map(|i| {
                let spec = ConvSpec::new(if i == 0 { from } else { to }, to, 1);
                if num_convs > 1 {
                    ConvModule::new(&mut p.sub(i), spec, norm, true)
                } else {
                    ConvModule::new(p, spec, norm, true)
                }
            })
            .collect();
        Project { convs }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut x = x.shallow_clone();
        for conv in &self.convs {
            x = conv.forward(&x, training);
        }
        x
    }
}

/// `ObjectAttentionBlock(in_channels, channels, scale=1)`: a
/// `SelfAttentionBlock` with separate key/query projections (2 convs each),
/// value and out projections (1 conv each), `matmul_norm`, then
/// `bottleneck` on `cat([context, query_feats])`.
struct ObjectAttentionBlock {
    key_project: Project,
    query_project: Project,
    value_project: Project,
    out_project: Project,
    bottleneck: ConvModule,
    channels: i64,
}

impl ObjectAttentionBlock {
    fn new(p: &mut ParamScope, in_channels: i64, channels: i64, norm: Option<NormCfg>) -> Self {
        ObjectAttentionBlock {
            key_project: Project::new(&mut p.sub("key_project"), in_channels, channels, 2, norm),
            query_project: Project::new(
                &mut p.sub("query_project"),
                in_channels,
                channels,
                2,
                norm,
            ),
            value_project: Project::new(
                &mut p.sub("value_project"),
                in_channels,
                channels,
                1,
                norm,
            ),
            out_project: Project::new(&mut p.sub("out_project"), channels, in_channels, 1, norm),
            bottleneck: ConvModule::new(
                &mut p.sub("bottleneck"),
                ConvSpec::new(in_channels * 2, in_channels, 1),
                norm,
                true,
            ),
            channels,
        }
    }

    /// `query_feats`: `[B, C, H, W]` pixel features; `key_feats`: `[B, C, K, 1]`
    /// class contexts. Returns `[B, C, H, W]`.
    fn forward(&self, query_feats: &Tensor, key_feats: &Tensor, training: bool) -> Tensor {
        let s = query_feats.size();
        let (batch, h, w) = (s[0], s[2], s[3]);
        let query = self.query_project.forward(query_feats, training); // [B, c, H, W]
        let query = query.reshape([batch, self.channels, -1]); // [B, c, HW]
        let query = query.permute([0, 2, 1]).contiguous(); // [B, HW, c]
        let key = self.key_project.forward(key_feats, training); // [B, c, K, 1]
        let value = self.value_project.forward(key_feats, training); // [B, c, K, 1]
        let key = key.reshape([batch, self.channels, -1]); // [B, c, K]
        let value = value.reshape([batch, self.channels, -1]);
        let value = value.permute([0, 2, 1]).contiguous(); // [B, K, c]
        let classes = key.size()[2];
        count_flops(2.0 * 2.0 * (batch * h * w * classes * self.channels) as f64);
        let sim_map = query.matmul(&key); // [B, HW, K]
        let sim_map = sim_map * (self.channels as f64).powf(-0.5);
        let weights = sim_map.softmax(-1, None::<Kind>);
        softmax_saved(&sim_map, &weights);
        drop(sim_map);
        let context = weights.matmul(&value); // [B, HW, c]
        drop(weights);
        let context = context.permute([0, 2, 1]).contiguous(); // [B, c, HW]
        let context = context.reshape([batch, -1, h, w]); // [B, c, H, W]
        let context = self.out_project.forward(&context, training); // [B, C, H, W]
        let cat = Tensor::cat(&[&context, query_feats], 1); // [B, 2C, H, W]
        drop(context);
        self.bottleneck.forward(&cat, training)
    }
}

pub struct OcrHead {
    base: DecodeHeadBase,
    object_context_block: ObjectAttentionBlock,
    bottleneck: ConvModule,
}

impl OcrHead {
    pub fn new(p: &mut ParamScope, cfg: OcrHeadCfg) -> OcrHead {
        let head = cfg.head;
        let (channels, norm) = (head.channels, head.norm);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let object_context_block = ObjectAttentionBlock::new(
            &mut p.sub("object_context_block"),
            channels,
            cfg.ocr_channels,
            norm,
        );
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(in_channels, channels, 3).padding(1),
            norm,
            true,
        );
        OcrHead {
            base,
            object_context_block,
            bottleneck,
        }
    }

    /// `SpatialGatherModule(scale=1).forward(feats, probs)`: one context
    /// vector per class, `[B, C, K, 1]`.
    fn spatial_gather(feats: &Tensor, probs: &Tensor) -> Tensor {
        let s = probs.size();
        let (batch, classes) = (s[0], s[1]);
        let channels = feats.size()[1];
        let probs = probs.view([batch, classes, -1]); // [B, K, HW]
        let feats = feats.view([batch, channels, -1]).permute([0, 2, 1]); // [B, HW, C]
                                                                          // `self.scale * probs`, then a softmax over the pixels.
        let scaled = probs * 1.0;
        let probs = scaled.softmax(2, None::<Kind>);
        softmax_saved(&scaled, &probs);
        drop(scaled);
        count_flops(2.0 * (batch * classes * s[2] * s[3] * channels) as f64);
        let ocr_context = probs.matmul(&feats); // [B, K, C]
        ocr_context.permute([0, 2, 1]).contiguous().unsqueeze(3) // [B, C, K, 1]
    }

    fn logits(&self, features: &[Tensor], prev_output: &Tensor, training: bool) -> Tensor {
        let x = self.base.transform_inputs(features); // [B, C_in, h, w]
        let feats = self.bottleneck.forward(&x, training); // [B, channels, h, w]
        drop(x);
        let context = Self::spatial_gather(&feats, prev_output); // [B, channels, K, 1]
        let object_context = self
            .object_context_block
            .forward(&feats, &context, training);
        drop((feats, context));
        self.base.cls_seg(object_context, training)
    }
}

impl DecodeHead for OcrHead {
    fn forward(&self, features: &[Tensor], prev_output: Option<&Tensor>, training: bool) -> Tensor {
        let prev = prev_output.expect("a cascade head is given the previous stage's logits");
        self.logits(features, prev, training)
    }

    /// `BaseCascadeDecodeHead.loss(inputs, prev_output, ...)`.
    fn loss(&self, features: &[Tensor], prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        let logits = self.forward(features, prev, true);
        self.base.loss_by_feat(&logits, labels)
    }

    fn is_cascade(&self) -> bool {
        true
    }

    crate::models::decode_heads::decode_head::settings_from_base!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use crate::models::params::ParamStore;
    use serde_json::json;
    use tch::Device;

    #[test]
    fn ocrnet_hr18s_ocr_head_has_mmsegs_parameter_count() {
        // `model.decode_head[1]` of ocrnet/ocrnet_hr18s_4xb2-40k_cityscapes-512x1024.py.
        let cfg = dict(json!({
            "type": "OCRHead", "in_channels": [18, 36, 72, 144], "in_index": [0, 1, 2, 3],
            "input_transform": "resize_concat", "channels": 512, "ocr_channels": 256,
            "dropout_ratio": -1, "num_classes": 19,
            "norm_cfg": {"type": "SyncBN", "requires_grad": true}, "align_corners": false,
            "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
        }));
        let mut store = ParamStore::new(Device::Cpu);
        let head = build(&mut store.scope("decode_head.1"), &cfg).unwrap();
        assert!(head.is_cascade());
        assert!(store
            .params
            .iter()
            .any(|p| p.name == "decode_head.1.object_context_block.value_project.conv.weight"));
        assert!(store
            .params
            .iter()
            .any(|p| p.name == "decode_head.1.object_context_block.key_project.1.bn.bias"));
        let feats: Vec<Tensor> = [(18, 16), (36, 8), (72, 4), (144, 2)]
            .iter()
            .map(|&(c, s)| Tensor::zeros([2, c, s, s], (Kind::Float, Device::Cpu)))
            .collect();
        let prev = Tensor::zeros([2, 19, 16, 16], (Kind::Float, Device::Cpu));
        assert_eq!(
            head.forward(&feats, Some(&prev), true).size(),
            [2, 19, 16, 16]
        );
        // The FCN stage of the same config: `model.decode_head[0]`, counted
        // with it against params_all.json's by_prefix.decode_head.total
        // (2,517,776) in tests/model_params.rs; alone, the OCR stage has:
        assert_eq!(store.total(), 2_517_776 - FCN_STAGE_HR18S);
    }

    /// FCNHead(in_channels=270, channels=270, num_convs=1, concat_input=False,
    /// kernel_size=1, num_classes=19): 270*270 + 2*270 (conv + BN) + 270*19 + 19.
    const FCN_STAGE_HR18S: i64 = 270 * 270 + 2 * 270 + 270 * 19 + 19;
}
