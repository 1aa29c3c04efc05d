//! `SegmenterMaskTransformerHead`, Segmenter's mask transformer decoder, as
//! MMSeg's `mmseg/models/decode_heads/segmenter_mask_head.py` builds it.
//!
//! Strudel et al., "Segmenter: Transformer for Semantic Segmentation",
//! ICCV 2021, arXiv:2105.05633.
//!
//! The patch tokens projected (`dec_proj`), one learned embedding per class
//! appended, `num_layers` ViT encoder layers over both, a LayerNorm; then
//! the L2-normalised patch and class embeddings (`patch_proj`,
//! `classes_proj`) multiplied into per-class masks, normalised over classes
//! (`mask_norm`): the masks are the logits (no `conv_seg`).

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg};
use super::DecodeHead;
use crate::config::{Dict, Value};
use crate::models::backbones::vit::{EncoderLayerCfg, TransformerEncoderLayer};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{linspace_drop_path_rates, normalize, LayerNorm, LayerNormCfg, Linear};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/segmenter_mask_head.py";

/// The registry's constructor (`DECODE_HEADS` row `SegmenterMaskTransformerHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = SegmenterMaskHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(SegmenterMaskHead::new(p, cfg)))
}

/// `SegmenterMaskTransformerHead(in_channels, num_layers, num_heads,
/// embed_dims, mlp_ratio=4, drop_path_rate=0.1, drop_rate=0.0,
/// attn_drop_rate=0.0, num_fcs=2, qkv_bias=True, act_cfg=dict(type='GELU'),
/// norm_cfg=dict(type='LN'), init_std=0.02, **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmenterMaskHeadCfg {
    pub head: DecodeHeadCfg,
    pub num_layers: i64,
    pub num_heads: i64,
    pub embed_dims: i64,
    pub feedforward_channels: i64,
    pub drop_path_rate: f64,
    pub drop_rate: f64,
    pub qkv_bias: bool,
    pub norm: LayerNormCfg,
}

impl SegmenterMaskHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<SegmenterMaskHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "SegmenterMaskTransformerHead", SOURCE);
        for key in ["in_channels", "num_layers", "num_heads", "embed_dims"] {
            c.require(key)?;
        }
        let num_layers = c.int("num_layers", 0)?;
        let num_heads = c.int("num_heads", 0)?;
        let embed_dims = c.int("embed_dims", 0)?;
        let mlp_ratio = c.float("mlp_ratio", 4.0)?;
        let feedforward = mlp_ratio * embed_dims as f64;
        let drop_path_rate = c.float("drop_path_rate", 0.1)?;
        let drop_rate = c.float("drop_rate", 0.0)?;
        let qkv_bias = c.flag("qkv_bias", true);
        // The head's norm_cfg is its LayerNorms', not BaseDecodeHead's (which it never uses).
        let norm = LayerNormCfg::from_cfg(&mut c, "norm_cfg", LayerNormCfg::DEFAULT)?;
        c.unimplemented("attn_drop_rate", &Value::Float(0.0))?;
        c.unimplemented("num_fcs", &Value::Int(2))?;
        // act_cfg is the FFN's GELU (read here, so BaseDecodeHead does not see it).
        c.default_activation("act_cfg", "GELU")?;
        c.inert(&["init_std"]);
        let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
        c.finish()?;
        if head.in_channels.len() != 1 {
            return Err(ModelError::config(
                "SegmenterMaskTransformerHead",
                "in_channels must be one int",
            ));
        }
        if num_layers < 1 || num_heads < 1 || embed_dims % num_heads != 0 {
            return Err(ModelError::config("SegmenterMaskTransformerHead", format!(
                "needs num_layers >= 1 and embed_dims ({embed_dims}) divisible into num_heads ({num_heads})"
            )));
        }
        if feedforward.fract() != 0.0 {
            return Err(ModelError::config(
                "SegmenterMaskTransformerHead",
                format!("mlp_ratio * embed_dims = {feedforward} is not a whole number of channels"),
            ));
        }
        Ok(SegmenterMaskHeadCfg {
            head,
            num_layers,
            num_heads,
            embed_dims,
            feedforward_channels: feedforward as i64,
            drop_path_rate,
            drop_rate,
            qkv_bias,
            norm,
        })
    }
}

pub struct SegmenterMaskHead {
    base: DecodeHeadBase,
    cls_emb: Tensor,
    layers: Vec<TransformerEncoderLayer>,
    dec_proj: Linear,
    patch_proj: Linear,
    classes_proj: Linear,
    decoder_norm: LayerNorm,
    mask_norm: LayerNorm,
}

impl SegmenterMaskHead {
    pub fn new(p: &mut ParamScope, cfg: SegmenterMaskHeadCfg) -> SegmenterMaskHead {
        let num_classes = cfg.head.num_classes;
        let in_channels = cfg.head.in_channels[0];
        let dims = cfg.embed_dims;
        // `delattr(self, 'conv_seg')`; the head's own parameter comes first.
        let base = DecodeHeadBase::without_conv_seg(cfg.head);
        let cls_emb = p.param_zeros("cls_emb", &[1, num_classes, dims]);
        let dpr = linspace_drop_path_rates(cfg.drop_path_rate, cfg.num_layers as usize);
        let layers = dpr
            .iter()
            .enumerate()
            .map(|(i, rate)| {
                let layer = EncoderLayerCfg {
                    embed_dims: dims,
                    num_heads: cfg.num_heads,
                    feedforward_channels: cfg.feedforward_channels,
                    drop_rate: cfg.drop_rate,
                    drop_path_rate: *rate,
                    qkv_bias: cfg.qkv_bias,
                    norm: cfg.norm,
                    with_cp: false,
                };
                TransformerEncoderLayer::new(&mut p.sub("layers").sub(i), &layer)
            })
            .collect();
        let dec_proj = Linear::new(&mut p.sub("dec_proj"), in_channels, dims, true);
        let patch_proj = Linear::new(&mut p.sub("patch_proj"), dims, dims, false);
        let classes_proj = Linear::new(&mut p.sub("classes_proj"), dims, dims, false);
        let decoder_norm = cfg.norm.build(&mut p.sub("decoder_norm"), dims);
        let mask_norm = cfg.norm.build(&mut p.sub("mask_norm"), num_classes);
        SegmenterMaskHead {
            base,
            cls_emb,
            layers,
            dec_proj,
            patch_proj,
            classes_proj,
            decoder_norm,
            mask_norm,
        }
    }
}

impl BaseHead for SegmenterMaskHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let num_classes = self.base.cfg.num_classes;
        let x = self.base.transform_inputs(features);
        let s = x.size();
        let (b, c, h, w) = (s[0], s[1], s[2], s[3]);
        let mut x = x.permute([0, 2, 3, 1]).contiguous().view([b, -1, c]);
        x = self.dec_proj.forward(&x);
        let cls_emb = self.cls_emb.expand([b, -1, -1], false);
        x = Tensor::cat(&[&x, &cls_emb], 1);
        for layer in &self.layers {
            x = layer.forward(&x, training);
        }
        x = self.decoder_norm.forward(&x);
        let len = x.size()[1];
        let patches = self
            .patch_proj
            .forward(&x.slice(1, 0, len - num_classes, 1));
        let cls_seg_feat = self
            .classes_proj
            .forward(&x.slice(1, len - num_classes, None, 1));
        let patches = normalize(&patches, 2.0, 2);
        let cls_seg_feat = normalize(&cls_seg_feat, 2.0, 2);
        let masks = patches.matmul(&cls_seg_feat.transpose(1, 2));
        let masks = self.mask_norm.forward(&masks);
        masks.permute([0, 2, 1]).contiguous().view([b, -1, h, w])
    }
}

#[cfg(test)]
#[path = "segmenter_mask_head_tests.rs"]
mod tests;
