//! `MaskFormerHead` as MMSeg 1.x builds it
//! (`mmseg/models/decode_heads/maskformer_head.py`, a subclass of mmdet
//! 3.x's `mmdet/models/dense_heads/maskformer_head.py`): mmdet's FPN-like
//! `PixelDecoder` (`mmdet/models/layers/pixel_decoder.py`) gives the
//! per-pixel mask features; a DETR transformer decoder
//! (`DetrTransformerDecoder`, `mmdet/models/layers/transformer/detr_layers.py`)
//! lets `num_queries` queries attend to the backbone's coarsest map; every
//! decoder layer's output, after the shared post-norm, is classified
//! (`num_classes` + no-object) and turned into a mask embedding whose dot
//! product with the mask features gives that query's mask; every layer is
//! supervised ([`super::maskformer_loss`]).
//!
//! Cheng et al., "Per-Pixel Classification is Not All You Need for Semantic
//! Segmentation", NeurIPS 2021, arXiv:2107.06278.

use super::mask2former_head::check_type;
use super::maskformer_loss::{MaskFormerLoss, MaskFormerLossCfg};
use super::pixel_decoder::{ffn_and_norms, layer_norm_value, sine_encoding};
use super::query_head::{
    class_and_mask_embeds, decoder_layers, semantic_scores, DecoderLayerKind, QueryDecoderCfg,
    QueryHeadKeys,
};
use super::{DecodeHead, LossItems};
use crate::config::{Dict, Value};
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::positional_encoding::SinePositionalEncoding;
use crate::models::layers::{
    resize_bilinear, Conv2d, ConvModule, ConvSpec, Ffn, LayerNorm, Linear, MultiheadAttention,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmdet/models/dense_heads/maskformer_head.py";
const PIXEL_DECODER_SOURCE: &str = "mmdet/models/layers/pixel_decoder.py";
const LAYERS_SOURCE: &str = "mmdet/models/layers/transformer/detr_layers.py";

/// The registry's constructor (`DECODE_HEADS` row `MaskFormerHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = MaskFormerHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(MaskFormerHead::new(p, cfg)))
}

/// `MaskFormerHead(num_classes, align_corners, ignore_index, **kwargs)` and
/// mmdet's arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct MaskFormerHeadCfg {
    pub keys: QueryHeadKeys,
    pub enforce_decoder_input_project: bool,
    /// The pixel decoder's `norm_cfg` (GroupNorm by default).
    pub pixel_decoder_norm: NormCfg,
    pub positional_encoding: SinePositionalEncoding,
    pub decoder: QueryDecoderCfg,
    pub loss: MaskFormerLossCfg,
}

impl MaskFormerHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<MaskFormerHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "MaskFormerHead", SOURCE);
        let keys = QueryHeadKeys::read(&mut c)?;
        let (in_channels, num_classes) = (&keys.in_channels, keys.num_classes);
        let num_queries = keys.num_queries;
        let (feat_channels, out_channels) = (keys.feat_channels, keys.out_channels);
        let enforce_decoder_input_project = c.flag("enforce_decoder_input_project", false);
        let pixel_decoder_norm = pixel_decoder_cfg(
            c.dict("pixel_decoder")?
                .ok_or_else(|| c.config_error("`pixel_decoder` must be set"))?,
        )?;
        let positional_encoding = sine_encoding(c.dict("positional_encoding")?)?;
        let decoder = decoder_cfg(
            c.dict("transformer_decoder")?
                .ok_or_else(|| c.config_error("`transformer_decoder` must be set"))?,
        )?;
        let loss = MaskFormerLossCfg::from_head(&mut c, num_classes)?;
        // mmdet's own class counts are replaced by MMSeg's `num_classes`;
        // `in_index` is not read (every input level goes to the pixel
        // decoder); `align_corners` and `test_cfg` act at inference only.
        c.inert(&[
            "num_things_classes",
            "num_stuff_classes",
            "in_index",
            "align_corners",
            "test_cfg",
            "init_cfg",
        ]);
        c.finish()?;
        if num_classes < 1 || num_queries < 1 || in_channels.len() < 2 {
            return Err(ModelError::config(
                "MaskFormerHead",
                format!(
                    "num_classes ({num_classes}) and num_queries ({num_queries}) must be positive \
                     and in_channels ({in_channels:?}) name at least two levels"
                ),
            ));
        }
        if 2 * positional_encoding.num_feats != decoder.embed_dims {
            return Err(ModelError::config(
                "MaskFormerHead",
                format!(
                    "positional_encoding num_feats {} must be the decoder's embed_dims / 2 ({})",
                    positional_encoding.num_feats,
                    decoder.embed_dims / 2
                ),
            ));
        }
        if decoder.embed_dims != out_channels || decoder.embed_dims != feat_channels {
            return Err(ModelError::config("MaskFormerHead", format!(
                "the decoder's embed_dims {} must equal feat_channels {feat_channels} and out_channels {out_channels} \
                 (query_embed is out_channels wide, cls_embed and mask_embed read feat_channels)",
                decoder.embed_dims
            )));
        }
        Ok(MaskFormerHeadCfg {
            keys,
            enforce_decoder_input_project,
            pixel_decoder_norm,
            positional_encoding,
            decoder,
            loss,
        })
    }
}

/// mmdet's `PixelDecoder(norm_cfg, act_cfg)` (the head sets its channels):
/// its norm.
fn pixel_decoder_cfg(d: &Dict) -> Result<NormCfg, ModelError> {
    let ty = d.get("type").and_then(Value::as_str).unwrap_or("");
    if ty.trim_start_matches("mmdet.") == "TransformerEncoderPixelDecoder" {
        return Err(ModelError::unsupported(
            "MaskFormerHead",
            "pixel_decoder",
            "type `TransformerEncoderPixelDecoder` (only PixelDecoder is implemented; \
             no MMSeg config uses the transformer-encoder one)",
        ));
    }
    check_type(d, "PixelDecoder", "pixel_decoder")?;
    let mut c = ComponentConfig::new(d, "PixelDecoder", PIXEL_DECODER_SOURCE);
    let mut gn = Dict::new();
    gn.insert("type".into(), Value::Str("GN".into()));
    gn.insert("num_groups".into(), Value::Int(32));
    let gn = Value::Dict(gn);
    let norm = NormCfg::from_cfg_bn_or_gn(Some(c.value("norm_cfg").unwrap_or(&gn)))
        .map_err(|e| c.setting_error("norm_cfg", e))?
        .ok_or_else(|| {
            c.unsupported(
                "norm_cfg",
                "None (conv biases instead of norms) is not implemented",
            )
        })?;
    c.default_activation("act_cfg", "ReLU")?;
    c.inert(&["init_cfg"]);
    c.finish()?;
    Ok(norm)
}

/// `DetrTransformerDecoder`'s config.
fn decoder_cfg(d: &Dict) -> Result<QueryDecoderCfg, ModelError> {
    let mut c = ComponentConfig::new(d, "DetrTransformerDecoder", LAYERS_SOURCE);
    let num_layers = c.int("num_layers", 6)?;
    c.unimplemented("post_norm_cfg", &layer_norm_value())?;
    // Without it the decoder returns only the last layer's output and
    // the head supervises that one alone.
    c.unimplemented("return_intermediate", &Value::Bool(true))?;
    c.inert(&["init_cfg"]);
    let kind = DecoderLayerKind {
        layer_type: "DetrTransformerDecoderLayer",
        source: LAYERS_SOURCE,
        head: "MaskFormerHead",
        dropout: true,
    };
    QueryDecoderCfg::read_layers(c, num_layers, &kind)
}

/// mmdet's `PixelDecoder`: lateral 1x1 ConvModules (norm, no activation)
/// and 3x3 output ConvModules for every level but the last, a 3x3
/// `last_feat_conv` on the last, FPN-style top-down sums (nearest
/// upsampling) and a 3x3 `mask_feature` conv.
struct PixelDecoder {
    lateral_convs: Vec<ConvModule>,
    output_convs: Vec<ConvModule>,
    last_feat_conv: ConvModule,
    mask_feature: Conv2d,
}

impl PixelDecoder {
    fn new(p: &mut ParamScope, c: &MaskFormerHeadCfg) -> PixelDecoder {
        let (feat, norm) = (c.keys.feat_channels, Some(c.pixel_decoder_norm));
        let n = c.keys.in_channels.len();
        let (mut lateral_convs, mut output_convs) = (Vec::new(), Vec::new());
        for i in 0..n - 1 {
            lateral_convs.push(ConvModule::new(
                &mut p.sub("lateral_convs").sub(i),
                ConvSpec::new(c.keys.in_channels[i], feat, 1),
                norm,
                false,
            ));
            output_convs.push(ConvModule::new(
                &mut p.sub("output_convs").sub(i),
                ConvSpec::new(feat, feat, 3).padding(1),
                norm,
                true,
            ));
        }
        let last_feat_conv = ConvModule::new(
            &mut p.sub("last_feat_conv"),
            ConvSpec::new(c.keys.in_channels[n - 1], feat, 3).padding(1),
            norm,
            true,
        );
        let mask_feature = Conv2d::new(
            &mut p.sub("mask_feature"),
            ConvSpec::new(feat, c.keys.out_channels, 3)
                .padding(1)
                .bias(true),
        );
        PixelDecoder {
            lateral_convs,
            output_convs,
            last_feat_conv,
            mask_feature,
        }
    }

    /// `forward(feats)`: the mask features at the finest level's resolution
    /// (the memory is the backbone's last map itself).
    fn forward(&self, feats: &[Tensor], training: bool) -> Tensor {
        let mut y = self
            .last_feat_conv
            .forward(&feats[feats.len() - 1], training);
        // Python's loop variable `cur_feat` lives until forward returns.
        let mut cur_feat = Tensor::new();
        for i in (0..self.lateral_convs.len()).rev() {
            cur_feat = self.lateral_convs[i].forward(&feats[i], training);
            let size = cur_feat.size();
            let up = y.upsample_nearest2d([size[2], size[3]], None, None);
            y = &cur_feat + up;
            y = self.output_convs[i].forward(&y, training);
        }
        let mask_feature = self.mask_feature.forward(&y);
        drop(cur_feat);
        mask_feature
    }
}

/// mmcv's `MultiheadAttention(batch_first=True)` as DETR's layers call it:
/// positions added to query and key, `nn.MultiheadAttention` (attention
/// dropout, key padding mask) on `(L, B, E)` views, `proj_drop` on its
/// output, the identity added.
struct MmcvAttention {
    attn: MultiheadAttention,
    attn_drop: f64,
    proj_drop: f64,
}

impl MmcvAttention {
    fn new(p: &mut ParamScope, c: &QueryDecoderCfg) -> MmcvAttention {
        MmcvAttention {
            attn: MultiheadAttention::new(&mut p.sub("attn"), c.embed_dims, c.num_heads, true),
            attn_drop: c.attn_drop,
            proj_drop: c.proj_drop,
        }
    }

    /// `query` `[B, L, E]`, `key`/`value` `[B, S, E]`; `key_padding_mask`
    /// bool `[B, S]`.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        query_pos: &Tensor,
        key_pos: &Tensor,
        key_padding_mask: Option<&Tensor>,
        training: bool,
    ) -> Tensor {
        let q = query + query_pos;
        let k = key + key_pos;
        let out = self.attn.forward_detr(
            &q.transpose(0, 1),
            &k.transpose(0, 1),
            &value.transpose(0, 1),
            key_padding_mask,
            self.attn_drop,
            training,
        );
        drop((q, k));
        let out = out.transpose(0, 1).dropout(self.proj_drop, training);
        query + out
    }
}

/// `DetrTransformerDecoderLayer`: self-attention, LN, cross-attention, LN,
/// FFN, LN.
struct DecoderLayer {
    self_attn: MmcvAttention,
    cross_attn: MmcvAttention,
    ffn: Ffn,
    norms: [LayerNorm; 3],
}

impl DecoderLayer {
    fn new(p: &mut ParamScope, c: &QueryDecoderCfg) -> DecoderLayer {
        let self_attn = MmcvAttention::new(&mut p.sub("self_attn"), c);
        let cross_attn = MmcvAttention::new(&mut p.sub("cross_attn"), c);
        let (ffn, norms) = ffn_and_norms(p, c.embed_dims, c.feedforward_channels, c.ffn_drop);
        DecoderLayer {
            self_attn,
            cross_attn,
            ffn,
            norms,
        }
    }

    fn forward(&self, query: &Tensor, memory: &DecoderMemory, training: bool) -> Tensor {
        let pos = &memory.query_pos;
        let mut query = self
            .self_attn
            .forward(query, query, query, pos, pos, None, training);
        query = self.norms[0].forward(&query);
        query = self.cross_attn.forward(
            &query,
            &memory.memory,
            &memory.memory,
            pos,
            &memory.pos_embed,
            Some(&memory.padding_mask),
            training,
        );
        query = self.norms[1].forward(&query);
        query = self.ffn.forward(&query, &query, training);
        self.norms[2].forward(&query)
    }
}

/// What every decoder layer reads: the flattened memory `[B, S, E]`, its
/// positions, its padding mask `[B, S]` and the query positions.
struct DecoderMemory {
    memory: Tensor,
    pos_embed: Tensor,
    padding_mask: Tensor,
    query_pos: Tensor,
}

/// The head (parameters under `decode_head`).
pub struct MaskFormerHead {
    cfg: MaskFormerHeadCfg,
    pixel_decoder: PixelDecoder,
    layers: Vec<DecoderLayer>,
    post_norm: LayerNorm,
    decoder_input_proj: Option<Conv2d>,
    query_embed: Tensor,
    cls_embed: Linear,
    mask_embed: [Linear; 3],
    loss: MaskFormerLoss,
}

impl MaskFormerHead {
    pub fn new(p: &mut ParamScope, cfg: MaskFormerHeadCfg) -> MaskFormerHead {
        let pixel_decoder = PixelDecoder::new(&mut p.sub("pixel_decoder"), &cfg);
        let (layers, post_norm) = decoder_layers(p, &cfg.decoder, DecoderLayer::new);
        let dims = cfg.decoder.embed_dims;
        let last = *cfg.keys.in_channels.last().expect("two levels at least");
        let decoder_input_proj = (dims != last || cfg.enforce_decoder_input_project).then(|| {
            Conv2d::new(
                &mut p.sub("decoder_input_proj"),
                ConvSpec::new(last, dims, 1).bias(true),
            )
        });
        let query_embed = p.sub("query_embed").param_normal(
            "weight",
            &[cfg.keys.num_queries, cfg.keys.out_channels],
            1.0,
        );
        // mmdet registers `cls_embed` here; MMSeg's replacement (for its
        // `num_classes`) keeps the place.
        let (cls_embed, mask_embed) = class_and_mask_embeds(p, &cfg.keys);
        let loss = MaskFormerLoss::new(
            cfg.loss.clone(),
            cfg.keys.num_classes,
            cfg.keys.ignore_index,
        );
        MaskFormerHead {
            cfg,
            pixel_decoder,
            layers,
            post_norm,
            decoder_input_proj,
            query_embed,
            cls_embed,
            mask_embed,
            loss,
        }
    }

    /// `forward(x, batch_data_samples)`: every decoder layer's class scores
    /// `[L, B, Q, num_classes+1]` and masks `[L, B, Q, H_0, W_0]`.
    pub fn forward_all(&self, features: &[Tensor], training: bool) -> (Tensor, Tensor) {
        let last = &features[features.len() - 1];
        let batch = last.size()[0];
        let (hl, wl) = (last.size()[2], last.size()[3]);
        // The padded input's size: the finest (stride-4) map's, times 4.
        let (ih, iw) = (features[0].size()[2] * 4, features[0].size()[3] * 4);
        let padding_mask = {
            let ones = Tensor::ones([batch, ih, iw], (Kind::Float, last.device()));
            for i in 0..batch {
                let _ = ones.select(0, i).fill_(0.0);
            }
            let resized = ones.unsqueeze(1).upsample_nearest2d([hl, wl], None, None);
            drop(ones);
            resized.to_kind(Kind::Bool).squeeze_dim(1)
        };
        let mask_features = self.pixel_decoder.forward(features, training);
        let pos_embed = self.cfg.positional_encoding.forward(&padding_mask);
        let memory = match &self.decoder_input_proj {
            Some(conv) => conv.forward(last),
            None => last.shallow_clone(),
        };
        let query_embed = self.query_embed.unsqueeze(0).repeat([batch, 1, 1]);
        let target = query_embed.zeros_like();
        let inputs = DecoderMemory {
            memory: memory.flatten(2, -1).permute([0, 2, 1]),
            pos_embed: pos_embed.flatten(2, -1).permute([0, 2, 1]),
            padding_mask: padding_mask.flatten(1, -1),
            query_pos: query_embed,
        };
        drop((memory, pos_embed, padding_mask));
        let out_dec = {
            let mut query = target.shallow_clone();
            let mut intermediate = Vec::with_capacity(self.layers.len());
            for layer in &self.layers {
                query = layer.forward(&query, &inputs, training);
                intermediate.push(self.post_norm.forward(&query));
            }
            // `query = self.post_norm(query)`, unused with return_intermediate.
            drop(self.post_norm.forward(&query));
            Tensor::stack(&intermediate, 0)
        };
        let all_cls_scores = self.cls_embed.forward(&out_dec);
        let mut mask_embed = self.mask_embed[0].forward(&out_dec);
        let _ = mask_embed.relu_();
        mask_embed = self.mask_embed[1].forward(&mask_embed);
        let _ = mask_embed.relu_();
        mask_embed = self.mask_embed[2].forward(&mask_embed);
        let (l, b, q) = (
            mask_embed.size()[0],
            mask_embed.size()[1],
            mask_embed.size()[2],
        );
        let fs = mask_features.size();
        crate::models::layers::count_flops(2.0 * (l * b * q * fs[1] * fs[2] * fs[3]) as f64);
        let all_mask_preds = Tensor::einsum(
            "lbqc,bchw->lbqhw",
            &[&mask_embed, &mask_features],
            None::<i64>,
        );
        (all_cls_scores, all_mask_preds)
    }
}

impl DecodeHead for MaskFormerHead {
    /// `predict`'s segmentation scores at the masks' resolution.
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        let (cls, masks) = self.forward_all(features, training);
        semantic_scores(&cls.select(0, -1), &masks.select(0, -1))
    }

    fn loss(&self, features: &[Tensor], _prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        self.loss.loss(labels, || self.forward_all(features, true))
    }

    /// MMSeg's `MaskFormerHead.predict`: the last layer's masks upsampled to
    /// the input's `size` first, then the semantic scores.
    fn predict(&self, features: &[Tensor], _prev: Option<&Tensor>, size: (i64, i64)) -> Tensor {
        let (cls, masks) = self.forward_all(features, false);
        let mask_pred_results = resize_bilinear(&masks.select(0, -1), size, false);
        semantic_scores(&cls.select(0, -1), &mask_pred_results)
    }

    fn num_classes(&self) -> i64 {
        self.cfg.keys.num_classes
    }

    fn ignore_index(&self) -> i64 {
        self.cfg.keys.ignore_index
    }
}

#[cfg(test)]
#[path = "maskformer_head_tests.rs"]
mod tests;
