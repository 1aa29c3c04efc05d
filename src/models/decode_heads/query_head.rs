//! What `MaskFormerHead` and `Mask2FormerHead` share (mmdet derives the
//! second from the first): the head's own keys, the transformer decoder's
//! config (mmcv attentions and FFN of every layer), the decoder's layers
//! and post-norm, the class and mask embeddings, and the semantic scores
//! both heads predict. What differs (the pixel decoder, each layer's order
//! and masking) stays in each head's file.

use super::pixel_decoder::{ffn_cfg, layer_norm_value};
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{LayerNorm, Linear};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const ATTENTION_SOURCE: &str = "mmcv/cnn/bricks/transformer.py";

/// The keys both heads read first, with mmdet's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryHeadKeys {
    pub num_classes: i64,
    pub ignore_index: i64,
    pub in_channels: Vec<i64>,
    pub feat_channels: i64,
    pub out_channels: i64,
    pub num_queries: i64,
}

impl QueryHeadKeys {
    pub fn read(c: &mut ComponentConfig) -> Result<QueryHeadKeys, ModelError> {
        Ok(QueryHeadKeys {
            num_classes: c.int("num_classes", 150)?,
            ignore_index: c.int("ignore_index", 255)?,
            in_channels: c.ints("in_channels", &[])?,
            feat_channels: c.int("feat_channels", 256)?,
            out_channels: c.int("out_channels", 256)?,
            num_queries: c.int("num_queries", 100)?,
        })
    }
}

/// `transformer_decoder=dict(num_layers, layer_cfg=dict(self_attn_cfg,
/// cross_attn_cfg, ffn_cfg))`.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryDecoderCfg {
    pub num_layers: i64,
    pub embed_dims: i64,
    pub num_heads: i64,
    /// Both attentions' `attn_drop` (on the attention weights).
    pub attn_drop: f64,
    /// Both attentions' `proj_drop` (on their outputs).
    pub proj_drop: f64,
    pub feedforward_channels: i64,
    pub ffn_drop: f64,
}

/// How a decoder's layers take their settings.
pub(super) struct DecoderLayerKind {
    /// mmdet's class of the layer (`DetrTransformerDecoderLayer`).
    pub layer_type: &'static str,
    /// The layer class's source file.
    pub source: &'static str,
    /// The head, for the errors that name it.
    pub head: &'static str,
    /// Whether the attentions' `attn_drop`/`proj_drop` are implemented
    /// (else only their default 0 is).
    pub dropout: bool,
}

impl QueryDecoderCfg {
    /// The rest of the decoder's dict `c` (its own keys read, `num_layers`
    /// among them): `layer_cfg`, whose two attentions must agree.
    pub(super) fn read_layers(
        mut c: ComponentConfig,
        num_layers: i64,
        kind: &DecoderLayerKind,
    ) -> Result<QueryDecoderCfg, ModelError> {
        let layer = c
            .dict("layer_cfg")?
            .ok_or_else(|| c.config_error("`layer_cfg` must be set"))?;
        c.finish()?;
        let mut l = ComponentConfig::new(layer, kind.layer_type, kind.source);
        let self_attn = attention_cfg(l.dict("self_attn_cfg")?, kind)?;
        let cross_attn = attention_cfg(l.dict("cross_attn_cfg")?, kind)?;
        let ffn = l.dict("ffn_cfg")?;
        l.unimplemented("norm_cfg", &layer_norm_value())?;
        l.inert(&["init_cfg"]);
        l.finish()?;
        if self_attn != cross_attn {
            return Err(ModelError::unsupported_in(
                kind.layer_type,
                kind.source,
                "",
                format!(
                    "self- and cross-attention with different embed_dims/num_heads/attn_drop/proj_drop \
                     ({self_attn:?} vs {cross_attn:?})"
                ),
            ));
        }
        let (embed_dims, num_heads, attn_drop, proj_drop) = self_attn;
        let (feedforward_channels, ffn_drop) = ffn_cfg(ffn, embed_dims, 1024)?;
        if num_layers < 1 {
            return Err(ModelError::config(
                kind.head,
                "transformer_decoder num_layers must be at least 1",
            ));
        }
        Ok(QueryDecoderCfg {
            num_layers,
            embed_dims,
            num_heads,
            attn_drop,
            proj_drop,
            feedforward_channels,
            ffn_drop,
        })
    }
}

/// mmcv's `MultiheadAttention` config: `(embed_dims, num_heads, attn_drop,
/// proj_drop)`; a `dropout_layer` (a drop path) is not implemented.
fn attention_cfg(
    d: Option<&Dict>,
    kind: &DecoderLayerKind,
) -> Result<(i64, i64, f64, f64), ModelError> {
    let empty = Dict::new();
    let mut a = ComponentConfig::new(d.unwrap_or(&empty), "MultiheadAttention", ATTENTION_SOURCE);
    let embed_dims = a.int("embed_dims", 256)?;
    let num_heads = a.int("num_heads", 8)?;
    let (attn_drop, proj_drop) = if kind.dropout {
        (a.float("attn_drop", 0.0)?, a.float("proj_drop", 0.0)?)
    } else {
        a.unimplemented("attn_drop", &Value::Float(0.0))?;
        a.unimplemented("proj_drop", &Value::Float(0.0))?;
        (0.0, 0.0)
    };
    // mmcv's deprecated `dropout` sets attn_drop and the dropout_layer.
    a.unimplemented("dropout", &Value::Float(0.0))?;
    a.unimplemented("dropout_layer", &Value::None)?;
    if !a.flag("batch_first", true) {
        // DetrTransformerDecoderLayer's check (Mask2Former's layer derives from it).
        return Err(ModelError::config(
            kind.layer_type,
            "First dimension of all DETRs in mmdet is `batch`, please set `batch_first` flag.",
        ));
    }
    a.inert(&["init_cfg"]);
    a.finish()?;
    if embed_dims <= 0 || num_heads <= 0 || embed_dims % num_heads != 0 {
        return Err(ModelError::config(
            "MultiheadAttention",
            format!("embed_dims {embed_dims} must be a positive multiple of num_heads {num_heads}"),
        ));
    }
    Ok((embed_dims, num_heads, attn_drop, proj_drop))
}

/// The decoder's `layers.<i>` (each made by `new_layer`) and its
/// `post_norm`, under `transformer_decoder`.
pub(super) fn decoder_layers<L>(
    p: &mut ParamScope,
    cfg: &QueryDecoderCfg,
    new_layer: impl Fn(&mut ParamScope, &QueryDecoderCfg) -> L,
) -> (Vec<L>, LayerNorm) {
    let mut tp = p.sub("transformer_decoder");
    let layers = (0..cfg.num_layers)
        .map(|i| new_layer(&mut tp.sub("layers").sub(i), cfg))
        .collect();
    let post_norm = LayerNorm::new(&mut tp.sub("post_norm"), cfg.embed_dims, 1e-5);
    (layers, post_norm)
}

/// `cls_embed` (`feat` -> `num_classes + 1`) and the three-layer
/// `mask_embed` MLP (`feat` -> `feat` -> `feat` -> `out_channels`).
pub(super) fn class_and_mask_embeds(
    p: &mut ParamScope,
    keys: &QueryHeadKeys,
) -> (Linear, [Linear; 3]) {
    let feat = keys.feat_channels;
    let cls_embed = Linear::new(&mut p.sub("cls_embed"), feat, keys.num_classes + 1, true);
    let mut mp = p.sub("mask_embed");
    let mask_embed = [
        Linear::new(&mut mp.sub(0), feat, feat, true),
        Linear::new(&mut mp.sub(2), feat, feat, true),
        Linear::new(&mut mp.sub(4), feat, keys.out_channels, true),
    ];
    (cls_embed, mask_embed)
}

/// `einsum('bqc,bqhw->bchw', softmax(cls)[..., :-1], sigmoid(masks))`: one
/// layer's class scores `[B, Q, C+1]` and mask logits `[B, Q, h, w]` as
/// per-class scores `[B, C, h, w]`.
pub(super) fn semantic_scores(cls: &Tensor, masks: &Tensor) -> Tensor {
    let scores = cls.softmax(-1, None::<Kind>).slice(-1, 0, -1, 1);
    let masks = masks.sigmoid();
    Tensor::einsum("bqc,bqhw->bchw", &[&scores, &masks], None::<i64>)
}
