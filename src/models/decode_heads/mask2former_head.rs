//! `Mask2FormerHead` as MMSeg 1.x builds it
//! (`mmseg/models/decode_heads/mask2former_head.py`, a subclass of mmdet
//! 3.x's `mmdet/models/dense_heads/mask2former_head.py`): the
//! [`MsDeformAttnPixelDecoder`], then a masked-attention transformer decoder
//! whose `num_queries` queries attend, layer by layer, to one level of the
//! pixel decoder's multi-scale features within the mask the previous layer
//! predicted; every layer's class scores and masks are supervised
//! ([`super::mask2former_loss`]).
//!
//! Cheng et al., "Masked-attention Mask Transformer for Universal Image
//! Segmentation", CVPR 2022, arXiv:2112.01527.

use super::mask2former_loss::{Mask2FormerLoss, Mask2FormerLossCfg};
use super::pixel_decoder::{
    ffn_and_norms, layer_norm_value, sine_encoding, MsDeformAttnPixelDecoder, PixelDecoderCfg,
};
use super::query_head::{
    class_and_mask_embeds, decoder_layers, semantic_scores, DecoderLayerKind, QueryDecoderCfg,
    QueryHeadKeys,
};
use super::{DecodeHead, LossItems};
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::positional_encoding::SinePositionalEncoding;
use crate::models::layers::{
    resize_bilinear, Conv2d, ConvSpec, Ffn, LayerNorm, Linear, MultiheadAttention,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/mask2former_head.py";
const LAYERS_SOURCE: &str = "mmdet/models/layers/transformer/mask2former_layers.py";

/// The registry's constructor (`DECODE_HEADS` row `Mask2FormerHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = Mask2FormerHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(Mask2FormerHead::new(p, cfg)))
}

/// `Mask2FormerHead(num_classes, align_corners, ignore_index, **kwargs)`
/// and mmdet's arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Mask2FormerHeadCfg {
    pub keys: QueryHeadKeys,
    pub num_transformer_feat_level: i64,
    pub enforce_decoder_input_project: bool,
    pub pixel_decoder: PixelDecoderCfg,
    pub positional_encoding: SinePositionalEncoding,
    pub decoder: QueryDecoderCfg,
    pub loss: Mask2FormerLossCfg,
}

impl Mask2FormerHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<Mask2FormerHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "Mask2FormerHead", SOURCE);
        let keys = QueryHeadKeys::read(&mut c)?;
        let (num_classes, num_queries) = (keys.num_classes, keys.num_queries);
        let (feat_channels, out_channels) = (keys.feat_channels, keys.out_channels);
        let num_transformer_feat_level = c.int("num_transformer_feat_level", 3)?;
        let enforce_decoder_input_project = c.flag("enforce_decoder_input_project", false);
        // The pixel decoder takes the head's strides through its own dict.
        let strides = c.ints("strides", &[4, 8, 16, 32])?;
        let pixel_decoder = {
            let mut pd = c
                .dict("pixel_decoder")?
                .ok_or_else(|| c.config_error("`pixel_decoder` must be set"))?
                .clone();
            if !pd.contains_key("strides") {
                let list = strides.iter().map(|s| Value::Int(*s)).collect();
                pd.insert("strides".into(), Value::List(list));
            }
            check_type(&pd, "MSDeformAttnPixelDecoder", "pixel_decoder")?;
            PixelDecoderCfg::from_cfg(&pd, keys.in_channels.clone(), feat_channels, out_channels)?
        };
        let positional_encoding = sine_encoding(c.dict("positional_encoding")?)?;
        let decoder = decoder_cfg(
            c.dict("transformer_decoder")?
                .ok_or_else(|| c.config_error("`transformer_decoder` must be set"))?,
        )?;
        let loss = Mask2FormerLossCfg::from_head(&mut c, num_classes)?;
        // mmdet's own class counts are replaced by MMSeg's `num_classes`;
        // `align_corners` and `test_cfg` act at inference only.
        c.inert(&[
            "num_things_classes",
            "num_stuff_classes",
            "align_corners",
            "test_cfg",
            "init_cfg",
        ]);
        c.finish()?;
        if num_classes < 1 || num_queries < 1 {
            return Err(ModelError::config(
                "Mask2FormerHead",
                format!(
                    "num_classes ({num_classes}) and num_queries ({num_queries}) must be positive"
                ),
            ));
        }
        if num_transformer_feat_level != pixel_decoder.encoder.num_levels {
            return Err(ModelError::config("Mask2FormerHead", format!(
                "num_transformer_feat_level {num_transformer_feat_level} must equal the pixel decoder's num_levels {}",
                pixel_decoder.encoder.num_levels
            )));
        }
        if pixel_decoder.num_outs < num_transformer_feat_level as usize {
            return Err(ModelError::config("Mask2FormerHead", format!(
                "the pixel decoder's num_outs {} is fewer than num_transformer_feat_level {num_transformer_feat_level}",
                pixel_decoder.num_outs
            )));
        }
        if decoder.embed_dims != out_channels {
            return Err(ModelError::config("Mask2FormerHead", format!(
                "the decoder's embed_dims {} must equal out_channels {out_channels} (mask embeddings meet the mask features)",
                decoder.embed_dims
            )));
        }
        Ok(Mask2FormerHeadCfg {
            keys,
            num_transformer_feat_level,
            enforce_decoder_input_project,
            pixel_decoder,
            positional_encoding,
            decoder,
            loss,
        })
    }
}

/// `type` must name `expected`, with or without mmdet's scope.
pub(super) fn check_type(d: &Dict, expected: &str, role: &str) -> Result<(), ModelError> {
    let ty = d.get("type").and_then(Value::as_str).unwrap_or("");
    if ty.trim_start_matches("mmdet.") == expected {
        Ok(())
    } else {
        Err(ModelError::unsupported(
            "Mask2FormerHead",
            role,
            format!("type `{ty}` (only {expected} is implemented)"),
        ))
    }
}

/// `Mask2FormerTransformerDecoder`'s config.
fn decoder_cfg(d: &Dict) -> Result<QueryDecoderCfg, ModelError> {
    let mut c = ComponentConfig::new(d, "Mask2FormerTransformerDecoder", LAYERS_SOURCE);
    let num_layers = c.int("num_layers", 9)?;
    c.unimplemented("post_norm_cfg", &layer_norm_value())?;
    // Every layer's prediction is computed by the head either way.
    c.inert(&["return_intermediate", "init_cfg"]);
    let kind = DecoderLayerKind {
        layer_type: "Mask2FormerTransformerDecoderLayer",
        source: LAYERS_SOURCE,
        head: "Mask2FormerHead",
        dropout: false,
    };
    QueryDecoderCfg::read_layers(c, num_layers, &kind)
}

/// mmcv's `MultiheadAttention(batch_first=True)` wrapper: positions added
/// to query and key, `nn.MultiheadAttention` on `(L, B, E)` views, the
/// identity added.
struct MmcvAttention {
    attn: MultiheadAttention,
}

impl MmcvAttention {
    fn new(p: &mut ParamScope, embed_dims: i64, num_heads: i64) -> MmcvAttention {
        MmcvAttention {
            attn: MultiheadAttention::new(&mut p.sub("attn"), embed_dims, num_heads, true),
        }
    }

    /// `query` `[B, L, E]`; `key_value` `[B, S, E]`, the key and the value
    /// (one tensor in every call of the layer); `attn_mask` bool
    /// `[B*heads, L, S]`.
    fn forward(
        &self,
        query: &Tensor,
        key_value: &Tensor,
        [query_pos, key_pos]: [&Tensor; 2],
        attn_mask: Option<&Tensor>,
    ) -> Tensor {
        let identity = query;
        let q = query + query_pos;
        let k = key_value + key_pos;
        let out = self.attn.forward_separate(
            &q.transpose(0, 1),
            &k.transpose(0, 1),
            &key_value.transpose(0, 1),
            attn_mask,
        );
        identity + out.transpose(0, 1)
    }
}

/// `Mask2FormerTransformerDecoderLayer`: masked cross-attention, LN,
/// self-attention, LN, FFN, LN.
struct DecoderLayer {
    cross_attn: MmcvAttention,
    self_attn: MmcvAttention,
    ffn: Ffn,
    norms: [LayerNorm; 3],
}

impl DecoderLayer {
    fn new(p: &mut ParamScope, c: &QueryDecoderCfg) -> DecoderLayer {
        let self_attn = MmcvAttention::new(&mut p.sub("self_attn"), c.embed_dims, c.num_heads);
        let cross_attn = MmcvAttention::new(&mut p.sub("cross_attn"), c.embed_dims, c.num_heads);
        let (ffn, norms) = ffn_and_norms(p, c.embed_dims, c.feedforward_channels, c.ffn_drop);
        DecoderLayer {
            cross_attn,
            self_attn,
            ffn,
            norms,
        }
    }

    fn forward(
        &self,
        query: &Tensor,
        memory: &Tensor,
        query_pos: &Tensor,
        key_pos: &Tensor,
        cross_attn_mask: &Tensor,
        training: bool,
    ) -> Tensor {
        let positions = [query_pos, key_pos];
        let mut query = self
            .cross_attn
            .forward(query, memory, positions, Some(cross_attn_mask));
        query = self.norms[0].forward(&query);
        query = self
            .self_attn
            .forward(&query, &query, [query_pos, query_pos], None);
        query = self.norms[1].forward(&query);
        query = self.ffn.forward(&query, &query, training);
        self.norms[2].forward(&query)
    }
}

/// The head (parameters under `decode_head`).
pub struct Mask2FormerHead {
    cfg: Mask2FormerHeadCfg,
    pixel_decoder: MsDeformAttnPixelDecoder,
    layers: Vec<DecoderLayer>,
    post_norm: LayerNorm,
    decoder_input_projs: Vec<Option<Conv2d>>,
    query_embed: Tensor,
    query_feat: Tensor,
    level_embed: Tensor,
    cls_embed: Linear,
    mask_embed: [Linear; 3],
    loss: Mask2FormerLoss,
}

impl Mask2FormerHead {
    pub fn new(p: &mut ParamScope, cfg: Mask2FormerHeadCfg) -> Mask2FormerHead {
        let pixel_decoder =
            MsDeformAttnPixelDecoder::new(&mut p.sub("pixel_decoder"), cfg.pixel_decoder.clone());
        let (layers, post_norm) = decoder_layers(p, &cfg.decoder, DecoderLayer::new);
        let dims = cfg.decoder.embed_dims;
        let project = dims != cfg.keys.feat_channels || cfg.enforce_decoder_input_project;
        let decoder_input_projs = (0..cfg.num_transformer_feat_level)
            .map(|i| {
                project.then(|| {
                    Conv2d::new(
                        &mut p.sub("decoder_input_projs").sub(i),
                        ConvSpec::new(cfg.keys.feat_channels, dims, 1).bias(true),
                    )
                })
            })
            .collect();
        let feat = cfg.keys.feat_channels;
        let query_embed =
            p.sub("query_embed")
                .param_normal("weight", &[cfg.keys.num_queries, feat], 1.0);
        let query_feat =
            p.sub("query_feat")
                .param_normal("weight", &[cfg.keys.num_queries, feat], 1.0);
        let level_embed = p.sub("level_embed").param_normal(
            "weight",
            &[cfg.num_transformer_feat_level, feat],
            1.0,
        );
        let (cls_embed, mask_embed) = class_and_mask_embeds(p, &cfg.keys);
        let loss = Mask2FormerLoss::new(
            cfg.loss.clone(),
            cfg.keys.num_classes,
            cfg.keys.ignore_index,
        );
        Mask2FormerHead {
            cfg,
            pixel_decoder,
            layers,
            post_norm,
            decoder_input_projs,
            query_embed,
            query_feat,
            level_embed,
            cls_embed,
            mask_embed,
            loss,
        }
    }

    /// `_forward_head`: class scores `[B, Q, num_classes+1]`, masks
    /// `[B, Q, H_0, W_0]` and the next layer's attention mask (bool
    /// `[B*heads, Q, h*w]`, true where the predicted mask is below 0.5).
    fn forward_head(
        &self,
        decoder_out: &Tensor,
        mask_feature: &Tensor,
        attn_mask_size: (i64, i64),
    ) -> (Tensor, Tensor, Tensor) {
        let decoder_out = self.post_norm.forward(decoder_out);
        let cls_pred = self.cls_embed.forward(&decoder_out);
        let mut mask_embed = self.mask_embed[0].forward(&decoder_out);
        let _ = mask_embed.relu_();
        mask_embed = self.mask_embed[1].forward(&mask_embed);
        let _ = mask_embed.relu_();
        mask_embed = self.mask_embed[2].forward(&mask_embed);
        let (b, q) = (mask_embed.size()[0], mask_embed.size()[1]);
        let fs = mask_feature.size();
        crate::models::layers::count_flops(2.0 * (b * q * fs[1] * fs[2] * fs[3]) as f64);
        let mask_pred = Tensor::einsum("bqc,bchw->bqhw", &[&mask_embed, mask_feature], None::<i64>);
        let attn_mask = {
            let resized = mask_pred.upsample_bilinear2d(
                [attn_mask_size.0, attn_mask_size.1],
                false,
                None,
                None,
            );
            let repeated = resized
                .flatten(2, -1)
                .unsqueeze(1)
                .repeat([1, self.cfg.decoder.num_heads, 1, 1])
                .flatten(0, 1);
            drop(resized);
            let below = repeated.sigmoid().lt(0.5);
            drop(repeated);
            below.detach()
        };
        (cls_pred, mask_pred, attn_mask)
    }

    /// `forward(x, batch_data_samples)`: every decoder layer's class scores
    /// and masks (the query embeddings' own prediction first).
    pub fn forward_all(&self, features: &[Tensor], training: bool) -> (Vec<Tensor>, Vec<Tensor>) {
        let batch = features[0].size()[0];
        let device = features[0].device();
        let (mask_features, multi_scale) = self.pixel_decoder.forward(features, training);
        let levels = self.cfg.num_transformer_feat_level as usize;
        let mut decoder_inputs = Vec::with_capacity(levels);
        let mut decoder_pos = Vec::with_capacity(levels);
        for (i, proj) in self.decoder_input_projs.iter().enumerate() {
            let memory = &multi_scale[i];
            let projected = proj.as_ref().map(|conv| conv.forward(memory));
            let flat = projected
                .as_ref()
                .unwrap_or(memory)
                .flatten(2, -1)
                .permute([0, 2, 1]);
            let level_embed = self.level_embed.select(0, i as i64).view([1, 1, -1]);
            decoder_inputs.push(flat + level_embed);
            let (h, w) = (memory.size()[2], memory.size()[3]);
            let mask = Tensor::zeros([batch, h, w], (Kind::Bool, device));
            let pos = self.cfg.positional_encoding.forward(&mask);
            decoder_pos.push(pos.flatten(2, -1).permute([0, 2, 1]));
        }
        let query_embed = self.query_embed.unsqueeze(0).repeat([batch, 1, 1]);
        let mut query_feat = self.query_feat.unsqueeze(0).repeat([batch, 1, 1]);
        let hw = |i: usize| (multi_scale[i].size()[2], multi_scale[i].size()[3]);
        let (mut cls_list, mut mask_list) = (Vec::new(), Vec::new());
        let (cls_pred, mask_pred, mut attn_mask) =
            self.forward_head(&query_feat, &mask_features, hw(0));
        cls_list.push(cls_pred);
        mask_list.push(mask_pred);
        for (i, layer) in self.layers.iter().enumerate() {
            let level = i % levels;
            let src_len = *attn_mask.size().last().expect("a 3-d mask");
            let mask_sum = attn_mask
                .sum_dim_intlist(-1, false, None::<Kind>)
                .ne(src_len)
                .unsqueeze(-1);
            attn_mask = attn_mask.bitwise_and_tensor(&mask_sum);
            drop(mask_sum);
            query_feat = layer.forward(
                &query_feat,
                &decoder_inputs[level],
                &query_embed,
                &decoder_pos[level],
                &attn_mask,
                training,
            );
            let (cls_pred, mask_pred, next_mask) =
                self.forward_head(&query_feat, &mask_features, hw((i + 1) % levels));
            attn_mask = next_mask;
            cls_list.push(cls_pred);
            mask_list.push(mask_pred);
        }
        (cls_list, mask_list)
    }
}

impl DecodeHead for Mask2FormerHead {
    /// `predict`'s segmentation scores at the masks' resolution.
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        let (cls, masks) = self.forward_all(features, training);
        semantic_scores(cls.last().expect("a layer"), masks.last().expect("a layer"))
    }

    fn loss(&self, features: &[Tensor], _prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        self.loss.loss(labels, || self.forward_all(features, true))
    }

    /// `Mask2FormerHead.predict`: the last layer's masks upsampled to the
    /// input's `size` first, then the semantic scores; every layer's
    /// predictions stay alive until it returns.
    fn predict(&self, features: &[Tensor], _prev: Option<&Tensor>, size: (i64, i64)) -> Tensor {
        let (cls, masks) = self.forward_all(features, false);
        let mask_pred_results = resize_bilinear(masks.last().expect("a layer"), size, false);
        semantic_scores(cls.last().expect("a layer"), &mask_pred_results)
    }

    fn num_classes(&self) -> i64 {
        self.cfg.keys.num_classes
    }

    fn ignore_index(&self) -> i64 {
        self.cfg.keys.ignore_index
    }
}

#[cfg(test)]
#[path = "mask2former_head_tests.rs"]
mod tests;
