//! mmdet's `MSDeformAttnPixelDecoder`
//! (`mmdet/models/layers/msdeformattn_pixel_decoder.py`), the pixel decoder
//! of Mask2Former: the coarsest `num_levels` backbone levels are projected
//! (1x1 conv + GN), flattened and refined together by a stack of
//! deformable-attention encoder layers (`Mask2FormerTransformerEncoder`);
//! the finer levels are merged FPN-style (lateral 1x1 conv, upsampled sum,
//! 3x3 conv), and a 1x1 conv gives the per-pixel mask features.
//!
//! Cheng et al., "Masked-attention Mask Transformer for Universal Image
//! Segmentation", CVPR 2022, arXiv:2112.01527; Zhu et al., "Deformable
//! DETR", ICLR 2021, arXiv:2010.04159.

use crate::config::{Dict, Value};
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::host::from_host;
use crate::models::layers::ms_deform_attn::{MultiScaleDeformableAttention, SpatialShapes};
use crate::models::layers::positional_encoding::{grid_priors, SinePositionalEncoding};
use crate::models::layers::{
    resize_bilinear, Conv2d, ConvModule, ConvSpec, Ffn, FfnActivation, LayerNorm,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmdet/models/layers/msdeformattn_pixel_decoder.py";
const LAYERS_SOURCE: &str = "mmdet/models/layers/transformer/deformable_detr_layers.py";

/// `MSDeformAttnPixelDecoder`'s arguments (the head sets `in_channels`,
/// `feat_channels` and `out_channels`).
#[derive(Debug, Clone, PartialEq)]
pub struct PixelDecoderCfg {
    pub in_channels: Vec<i64>,
    pub strides: Vec<i64>,
    pub feat_channels: i64,
    pub out_channels: i64,
    pub num_outs: usize,
    pub norm: NormCfg,
    pub encoder: EncoderCfg,
    pub positional_encoding: SinePositionalEncoding,
}

/// `encoder=dict(num_layers, layer_cfg=dict(self_attn_cfg, ffn_cfg))`.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderCfg {
    pub num_layers: i64,
    pub embed_dims: i64,
    pub num_heads: i64,
    pub num_levels: i64,
    pub num_points: i64,
    pub attn_dropout: f64,
    pub feedforward_channels: i64,
    pub ffn_drop: f64,
}

impl PixelDecoderCfg {
    pub fn from_cfg(
        d: &Dict,
        in_channels: Vec<i64>,
        feat_channels: i64,
        out_channels: i64,
    ) -> Result<PixelDecoderCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "MSDeformAttnPixelDecoder", SOURCE);
        let strides = c.ints("strides", &[4, 8, 16, 32])?;
        let num_outs = c.int("num_outs", 3)?;
        let norm = match c.value("norm_cfg") {
            None => NormCfg::from_cfg_bn_or_gn(Some(&gn_32()))?,
            Some(v) => {
                NormCfg::from_cfg_bn_or_gn(Some(v)).map_err(|e| c.setting_error("norm_cfg", e))?
            }
        }
        .ok_or_else(|| {
            c.unsupported(
                "norm_cfg",
                "None (a conv bias instead of a norm) is not implemented",
            )
        })?;
        c.default_activation("act_cfg", "ReLU")?;
        let encoder = EncoderCfg::from_cfg(
            c.dict("encoder")?
                .ok_or_else(|| c.config_error("`encoder` must be set"))?,
        )?;
        let positional_encoding = sine_encoding(c.dict("positional_encoding")?)?;
        c.inert(&["init_cfg"]);
        c.finish()?;
        if strides.len() != in_channels.len() {
            return Err(ModelError::config(
                "MSDeformAttnPixelDecoder",
                format!(
                    "{} strides for {} input levels",
                    strides.len(),
                    in_channels.len()
                ),
            ));
        }
        if encoder.num_levels < 1 || encoder.num_levels as usize > in_channels.len() {
            return Err(ModelError::config(
                "MSDeformAttnPixelDecoder",
                format!(
                    "num_levels {} must be between 1 and the {} input levels",
                    encoder.num_levels,
                    in_channels.len()
                ),
            ));
        }
        if encoder.embed_dims != feat_channels {
            return Err(ModelError::config(
                "MSDeformAttnPixelDecoder",
                format!(
                    "the encoder's embed_dims {} must equal feat_channels {feat_channels}",
                    encoder.embed_dims
                ),
            ));
        }
        if 2 * positional_encoding.num_feats != feat_channels {
            return Err(ModelError::config(
                "MSDeformAttnPixelDecoder",
                format!(
                    "positional_encoding num_feats {} must be feat_channels / 2 ({})",
                    positional_encoding.num_feats,
                    feat_channels / 2
                ),
            ));
        }
        Ok(PixelDecoderCfg {
            in_channels,
            strides,
            feat_channels,
            out_channels,
            num_outs: num_outs.max(0) as usize,
            norm,
            encoder,
            positional_encoding,
        })
    }
}

fn gn_32() -> Value {
    let mut d = Dict::new();
    d.insert("type".into(), Value::Str("GN".into()));
    d.insert("num_groups".into(), Value::Int(32));
    Value::Dict(d)
}

/// `SinePositionalEncoding(**positional_encoding)` (mmdet's default
/// `dict(num_feats=128, normalize=True)`).
pub fn sine_encoding(d: Option<&Dict>) -> Result<SinePositionalEncoding, ModelError> {
    let Some(d) = d else {
        return Ok(SinePositionalEncoding::new(128, true));
    };
    let mut c = ComponentConfig::new(
        d,
        "SinePositionalEncoding",
        "mmdet/models/layers/positional_encoding.py",
    );
    let mut enc = SinePositionalEncoding::new(c.int("num_feats", 128)?, c.flag("normalize", false));
    enc.temperature = c.float("temperature", 10000.0)?;
    enc.scale = c.float("scale", 2.0 * std::f64::consts::PI)?;
    enc.eps = c.float("eps", 1e-6)?;
    enc.offset = c.float("offset", 0.0)?;
    c.inert(&["init_cfg"]);
    c.finish()?;
    Ok(enc)
}

impl EncoderCfg {
    fn from_cfg(d: &Dict) -> Result<EncoderCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "Mask2FormerTransformerEncoder", LAYERS_SOURCE);
        let num_layers = c.int("num_layers", 6)?;
        c.unimplemented("num_cp", &Value::Int(-1))?;
        c.inert(&["init_cfg"]);
        let layer = c
            .dict("layer_cfg")?
            .ok_or_else(|| c.config_error("`layer_cfg` must be set"))?;
        c.finish()?;
        let mut l = ComponentConfig::new(
            layer,
            "DeformableDetrTransformerEncoderLayer",
            LAYERS_SOURCE,
        );
        let attn = l.dict("self_attn_cfg")?;
        let ffn = l.dict("ffn_cfg")?;
        l.unimplemented("norm_cfg", &layer_norm_value())?;
        l.inert(&["init_cfg"]);
        l.finish()?;
        let empty = Dict::new();
        let mut a = ComponentConfig::new(
            attn.unwrap_or(&empty),
            "MultiScaleDeformableAttention",
            "mmcv/ops/multi_scale_deform_attn.py",
        );
        let embed_dims = a.int("embed_dims", 256)?;
        let num_heads = a.int("num_heads", 8)?;
        let num_levels = a.int("num_levels", 4)?;
        let num_points = a.int("num_points", 4)?;
        let attn_dropout = a.float("dropout", 0.1)?;
        // The CUDA kernel's batching of its im2col; the PyTorch path ignores it.
        a.inert(&["im2col_step", "init_cfg"]);
        a.unimplemented("batch_first", &Value::Bool(true))?;
        a.unimplemented("norm_cfg", &Value::None)?;
        a.unimplemented("value_proj_ratio", &Value::Float(1.0))?;
        a.finish()?;
        if embed_dims <= 0 || num_heads <= 0 || embed_dims % num_heads != 0 {
            return Err(ModelError::config(
                "MultiScaleDeformableAttention",
                format!(
                    "embed_dims {embed_dims} must be a positive multiple of num_heads {num_heads}"
                ),
            ));
        }
        let (feedforward_channels, ffn_drop) = ffn_cfg(ffn, embed_dims, 1024)?;
        Ok(EncoderCfg {
            num_layers,
            embed_dims,
            num_heads,
            num_levels,
            num_points,
            attn_dropout,
            feedforward_channels,
            ffn_drop,
        })
    }
}

/// `dict(type='LN')`, the default `norm_cfg` of mmdet's DETR layers.
pub fn layer_norm_value() -> Value {
    let mut d = Dict::new();
    d.insert("type".into(), Value::Str("LN".into()));
    Value::Dict(d)
}

/// An mmcv `FFN` config with two fcs and a ReLU: `(feedforward_channels,
/// ffn_drop)`.
pub fn ffn_cfg(
    d: Option<&Dict>,
    embed_dims: i64,
    default_channels: i64,
) -> Result<(i64, f64), ModelError> {
    let empty = Dict::new();
    let mut f = ComponentConfig::new(d.unwrap_or(&empty), "FFN", "mmcv/cnn/bricks/transformer.py");
    let dims = f.int("embed_dims", embed_dims)?;
    if dims != embed_dims {
        return Err(f.config_error(format!(
            "embed_dims {dims} differs from the attention's {embed_dims}"
        )));
    }
    let channels = f.int("feedforward_channels", default_channels)?;
    f.unimplemented("num_fcs", &Value::Int(2))?;
    let drop = f.float("ffn_drop", 0.0)?;
    f.default_activation("act_cfg", "ReLU")?;
    f.unimplemented("dropout_layer", &Value::None)?;
    f.unimplemented("add_identity", &Value::Bool(true))?;
    f.unimplemented("layer_scale_init_value", &Value::Float(0.0))?;
    f.inert(&["init_cfg"]);
    f.finish()?;
    Ok((channels, drop))
}

/// A DETR layer's `ffn` (two fcs, ReLU) and its `N` LayerNorms (`norms.<i>`),
/// as mmdet's `_init_layers` builds them.
pub fn ffn_and_norms<const N: usize>(
    p: &mut ParamScope,
    embed_dims: i64,
    feedforward_channels: i64,
    ffn_drop: f64,
) -> (Ffn, [LayerNorm; N]) {
    let ffn = Ffn::new(
        &mut p.sub("ffn"),
        embed_dims,
        feedforward_channels,
        FfnActivation::Relu,
        ffn_drop,
        0.0,
    );
    let mut np = p.sub("norms");
    let norms = std::array::from_fn(|i| LayerNorm::new(&mut np.sub(i), embed_dims, 1e-5));
    (ffn, norms)
}

/// `DeformableDetrTransformerEncoderLayer`: deformable self-attention, LN,
/// FFN, LN.
struct EncoderLayer {
    self_attn: MultiScaleDeformableAttention,
    ffn: Ffn,
    norms: [LayerNorm; 2],
}

impl EncoderLayer {
    fn new(p: &mut ParamScope, c: &EncoderCfg) -> EncoderLayer {
        let self_attn = MultiScaleDeformableAttention::new(
            &mut p.sub("self_attn"),
            c.embed_dims,
            c.num_heads,
            c.num_levels,
            c.num_points,
            c.attn_dropout,
        );
        let (ffn, norms) = ffn_and_norms(p, c.embed_dims, c.feedforward_channels, c.ffn_drop);
        EncoderLayer {
            self_attn,
            ffn,
            norms,
        }
    }

    fn forward(&self, query: &Tensor, inputs: &EncoderInputs, training: bool) -> Tensor {
        let mut query = self.self_attn.forward(
            query,
            &inputs.query_pos,
            Some(&inputs.padding_mask),
            &inputs.reference_points,
            &inputs.shapes,
            training,
        );
        query = self.norms[0].forward(&query);
        query = self.ffn.forward(&query, &query, training);
        self.norms[1].forward(&query)
    }
}

/// What every encoder layer reads besides the query.
struct EncoderInputs {
    query_pos: Tensor,
    padding_mask: Tensor,
    reference_points: Tensor,
    shapes: SpatialShapes,
}

/// `MSDeformAttnPixelDecoder` (parameters under `pixel_decoder`).
pub struct MsDeformAttnPixelDecoder {
    cfg: PixelDecoderCfg,
    input_convs: Vec<ConvModule>,
    encoder: Vec<EncoderLayer>,
    level_encoding: Tensor,
    lateral_convs: Vec<ConvModule>,
    output_convs: Vec<ConvModule>,
    mask_feature: Conv2d,
}

impl MsDeformAttnPixelDecoder {
    pub fn new(p: &mut ParamScope, cfg: PixelDecoderCfg) -> MsDeformAttnPixelDecoder {
        let n_in = cfg.in_channels.len();
        let n_enc = cfg.encoder.num_levels as usize;
        let feat = cfg.feat_channels;
        let norm = Some(cfg.norm);
        let mut ip = p.sub("input_convs");
        let input_convs = (0..n_enc)
            .map(|k| {
                let i = n_in - 1 - k;
                ConvModule::with_conv_bias(
                    &mut ip.sub(k),
                    ConvSpec::new(cfg.in_channels[i], feat, 1),
                    norm,
                    false,
                    true,
                )
            })
            .collect();
        let mut ep = p.sub("encoder.layers");
        let encoder = (0..cfg.encoder.num_layers)
            .map(|i| EncoderLayer::new(&mut ep.sub(i), &cfg.encoder))
            .collect();
        let level_encoding =
            p.sub("level_encoding")
                .param_normal("weight", &[n_enc as i64, feat], 1.0);
        let (mut lp, mut op) = (Vec::new(), Vec::new());
        for (k, i) in (0..n_in - n_enc).rev().enumerate() {
            lp.push(ConvModule::new(
                &mut p.sub("lateral_convs").sub(k),
                ConvSpec::new(cfg.in_channels[i], feat, 1),
                norm,
                false,
            ));
            op.push(ConvModule::new(
                &mut p.sub("output_convs").sub(k),
                ConvSpec::new(feat, feat, 3).padding(1),
                norm,
                true,
            ));
        }
        let mask_feature = Conv2d::new(
            &mut p.sub("mask_feature"),
            ConvSpec::new(feat, cfg.out_channels, 1).bias(true),
        );
        MsDeformAttnPixelDecoder {
            cfg,
            input_convs,
            encoder,
            level_encoding,
            lateral_convs: lp,
            output_convs: op,
            mask_feature,
        }
    }

    /// `forward(feats)`: `(mask_feature [B, out_channels, H_0, W_0],
    /// multi_scale_features)`, the latter the first `num_outs` of the
    /// encoder's levels (coarsest first) and the FPN outputs.
    pub fn forward(&self, feats: &[Tensor], training: bool) -> (Tensor, Vec<Tensor>) {
        let n_in = self.cfg.in_channels.len();
        let n_enc = self.cfg.encoder.num_levels as usize;
        let batch = feats[0].size()[0];
        let device = feats[0].device();
        let mut encoder_input_list = Vec::with_capacity(n_enc);
        let mut padding_mask_list = Vec::with_capacity(n_enc);
        let mut level_pos_list = Vec::with_capacity(n_enc);
        let mut hw = Vec::with_capacity(n_enc);
        let mut shape_list = Vec::with_capacity(n_enc);
        let mut reference_points_list = Vec::with_capacity(n_enc);
        // Python's `pos_embed` holds the last level's code until the end.
        let mut pos_embed = Tensor::new();
        for (i, input_conv) in self.input_convs.iter().enumerate() {
            let level_idx = n_in - i - 1;
            let feat = &feats[level_idx];
            let (h, w) = (feat.size()[2], feat.size()[3]);
            let feat_projected = input_conv.forward(feat, training);
            let feat_hw = from_host(&feat.size()).slice(0, 2, None, 1);
            let padding_mask = Tensor::zeros([batch, h, w], (Kind::Bool, device));
            pos_embed = self.cfg.positional_encoding.forward(&padding_mask);
            let level_embed = self.level_encoding.select(0, i as i64);
            let level_pos_embed = level_embed.view([1, -1, 1, 1]) + &pos_embed;
            let stride = self.cfg.strides[level_idx];
            let reference_points = grid_priors(h, w, stride, device);
            let feat_wh = feat_hw.unsqueeze(0).flip([0, 1]);
            let factor = feat_wh * stride;
            let reference_points = reference_points / factor;
            encoder_input_list.push(feat_projected.flatten(2, -1).permute([0, 2, 1]));
            level_pos_list.push(level_pos_embed.flatten(2, -1).permute([0, 2, 1]));
            padding_mask_list.push(padding_mask.flatten(1, -1));
            hw.push((h, w));
            shape_list.push(feat_hw);
            reference_points_list.push(reference_points);
        }
        let padding_masks = Tensor::cat(&padding_mask_list, 1);
        let encoder_inputs = Tensor::cat(&encoder_input_list, 1);
        let level_positional_encodings = Tensor::cat(&level_pos_list, 1);
        let shapes = SpatialShapes {
            hw: hw.clone(),
            tensor: Tensor::cat(&shape_list, 0).view([-1, 2]),
        };
        let reference_points = Tensor::cat(&reference_points_list, 0)
            .unsqueeze(0)
            .unsqueeze(2)
            .repeat([batch, 1, n_enc as i64, 1]);
        let inputs = EncoderInputs {
            query_pos: level_positional_encodings,
            padding_mask: padding_masks,
            reference_points,
            shapes,
        };
        let mut memory = encoder_inputs.shallow_clone();
        for layer in &self.encoder {
            memory = layer.forward(&memory, &inputs, training);
        }
        let memory = memory.permute([0, 2, 1]);
        let sizes: Vec<i64> = hw.iter().map(|(h, w)| h * w).collect();
        let mut outs: Vec<Tensor> = memory
            .split_with_sizes(sizes.as_slice(), -1)
            .iter()
            .zip(&hw)
            .map(|(x, (h, w))| x.reshape([batch, -1, *h, *w]))
            .collect();
        // Python's `cur_feat` and `y` live until the function returns.
        let mut fpn_temporaries = Vec::new();
        for (k, i) in (0..n_in - n_enc).rev().enumerate() {
            let cur_feat = self.lateral_convs[k].forward(&feats[i], training);
            let size = (cur_feat.size()[2], cur_feat.size()[3]);
            let up = resize_bilinear(outs.last().expect("an encoder level"), size, false);
            let y = &cur_feat + up;
            outs.push(self.output_convs[k].forward(&y, training));
            fpn_temporaries.push((cur_feat, y));
        }
        let mask_feature = self
            .mask_feature
            .forward(outs.last().expect("an output level"));
        let multi_scale: Vec<Tensor> = outs
            .iter()
            .take(self.cfg.num_outs)
            .map(Tensor::shallow_clone)
            .collect();
        drop((
            encoder_input_list,
            level_pos_list,
            padding_mask_list,
            reference_points_list,
            inputs,
            encoder_inputs,
            pos_embed,
            fpn_temporaries,
        ));
        (mask_feature, multi_scale)
    }
}

#[cfg(test)]
#[path = "pixel_decoder_tests.rs"]
mod tests;
