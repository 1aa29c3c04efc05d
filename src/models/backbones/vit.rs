//! Vision Transformer, as MMSeg's `mmseg/models/backbones/vit.py` builds it
//! (`PatchEmbed` from `mmseg/models/utils/embed.py`; mmcv's
//! `MultiheadAttention` and `FFN`).
//!
//! Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for
//! Image Recognition at Scale", ICLR 2021, arXiv:2010.11929.
//!
//! Non-overlapping patches (a strided conv without bias), a class token
//! prepended, a learned position embedding for the `img_size` grid (resized
//! by bicubic or bilinear interpolation, with its gradient, when the crop's
//! grid differs), then `num_layers` pre-norm encoder layers at one
//! resolution. Each output index gives the tokens without the class token as
//! a `[B, C, H/16, W/16]` map. The backbone of SETR, Segmenter, DPT and the
//! ViT/DeiT UPerNet configs; [`TransformerEncoderLayer`] is also Segmenter's
//! mask transformer layer.
//!
//! With `output_cls_token` (DPT) vit.py's outputs are `[map, cls_token]`
//! pairs, the class token `x[:, 0]` a `[B, C]` view of the layer's tokens:
//! the [`Backbone`] list then holds each pair flat, the map followed by its
//! class token (see `decode_heads/dpt_head.rs`).

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{
    checkpoint_if, linspace_drop_path_rates, Ffn, LayerNorm, LayerNormCfg, MultiheadAttention,
    PatchEmbed, PatchPadding,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/vit.py";

/// The registry's constructor (`BACKBONES` row `VisionTransformer`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = VitConfig::from_cfg(cfg)?;
    Ok(Box::new(VisionTransformer::new(p, &cfg)))
}

/// How the position embedding is resized to another grid (`interpolate_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PosInterpolation {
    Bicubic,
    Bilinear,
}

/// The backbone's settings (`model.backbone` of the config).
#[derive(Debug, Clone, PartialEq)]
pub struct VitConfig {
    pub img_size: (i64, i64),
    pub patch_size: i64,
    pub patch_pad: PatchPadding,
    pub in_channels: i64,
    pub embed_dims: i64,
    pub num_layers: i64,
    pub num_heads: i64,
    pub feedforward_channels: i64,
    pub out_origin: bool,
    pub out_indices: Vec<i64>,
    pub qkv_bias: bool,
    pub drop_rate: f64,
    pub drop_path_rate: f64,
    pub with_cls_token: bool,
    /// Each output a `[map, cls_token]` pair (two entries of the list).
    pub output_cls_token: bool,
    pub norm: LayerNormCfg,
    pub patch_norm: bool,
    pub patch_bias: bool,
    pub pre_norm: bool,
    pub final_norm: bool,
    pub interpolate_mode: PosInterpolation,
    /// Gradient checkpointing of each encoder layer (`with_cp`).
    pub with_cp: bool,
}

/// An int or a one- or two-element list of ints, as `img_size` takes it.
pub(crate) fn size_pair(
    r: &mut ComponentConfig,
    key: &str,
    default: i64,
) -> Result<(i64, i64), ModelError> {
    match r.value(key) {
        None => Ok((default, default)),
        Some(v) => match v.as_i64() {
            Some(s) => Ok((s, s)),
            None => match r.ints(key, &[])?[..] {
                [s] => Ok((s, s)),
                [h, w] => Ok((h, w)),
                _ => Err(r.config_error(format!("`{key}` must be an int or a pair of ints"))),
            },
        },
    }
}

impl VitConfig {
    pub fn from_cfg(cfg: &Dict) -> Result<VitConfig, ModelError> {
        let mut r = ComponentConfig::new(cfg, "VisionTransformer", SOURCE);
        let img_size = size_pair(&mut r, "img_size", 224)?;
        let patch_size = r.int("patch_size", 16)?;
        let patch_pad = match r.value("patch_pad") {
            None => PatchPadding::Corner,
            Some(Value::Str(s)) if s == "corner" => PatchPadding::Corner,
            Some(Value::Int(pad)) => PatchPadding::Fixed(*pad),
            Some(_) => {
                return Err(r.unsupported(
                    "patch_pad",
                    "only 'corner' or an int padding is implemented",
                ))
            }
        };
        let embed_dims = r.int("embed_dims", 768)?;
        let num_layers = r.int("num_layers", 12)?;
        let mlp_ratio = r.float("mlp_ratio", 4.0)?;
        let feedforward = mlp_ratio * embed_dims as f64;
        if feedforward.fract() != 0.0 {
            // nn.Linear refuses a float feature count.
            return Err(r.config_error(format!(
                "mlp_ratio * embed_dims = {feedforward} is not a whole number of channels"
            )));
        }
        let out_indices = match r.value("out_indices") {
            None => vec![num_layers - 1],
            Some(Value::Int(-1)) => vec![num_layers - 1],
            Some(Value::Int(i)) => vec![*i],
            Some(_) => r.ints("out_indices", &[])?,
        };
        let interpolate_mode = match r.string("interpolate_mode")? {
            None | Some("bicubic") => PosInterpolation::Bicubic,
            Some("bilinear") => PosInterpolation::Bilinear,
            Some(other) => {
                return Err(r.unsupported(
                    "interpolate_mode",
                    format!("`{other}` (bicubic and bilinear are implemented)"),
                ))
            }
        };
        let c = VitConfig {
            img_size,
            patch_size,
            patch_pad,
            in_channels: r.int("in_channels", 3)?,
            embed_dims,
            num_layers,
            num_heads: r.int("num_heads", 12)?,
            feedforward_channels: feedforward as i64,
            out_origin: r.flag("out_origin", false),
            out_indices,
            qkv_bias: r.flag("qkv_bias", true),
            drop_rate: r.float("drop_rate", 0.0)?,
            drop_path_rate: r.float("drop_path_rate", 0.0)?,
            with_cls_token: r.flag("with_cls_token", true),
            output_cls_token: r.flag("output_cls_token", false),
            norm: LayerNormCfg::from_cfg(&mut r, "norm_cfg", LayerNormCfg::DEFAULT)?,
            patch_norm: r.flag("patch_norm", false),
            patch_bias: r.flag("patch_bias", false),
            pre_norm: r.flag("pre_norm", false),
            final_norm: r.flag("final_norm", false),
            interpolate_mode,
            with_cp: r.flag("with_cp", false),
        };
        // The attention-weight dropout (inside nn.MultiheadAttention) is not reproduced.
        r.unimplemented("attn_drop_rate", &Value::Float(0.0))?;
        r.unimplemented("num_fcs", &Value::Int(2))?;
        if r.strings("frozen_exclude", &["all"])?
            .iter()
            .all(|s| s != "all")
        {
            return Err(r.unsupported(
                "frozen_exclude",
                "freezing parameters by name is not implemented (only ['all'], nothing frozen)",
            ));
        }
        r.default_activation("act_cfg", "GELU")?;
        // norm_eval puts LayerNorms in eval mode: they have no running statistics.
        r.inert(&["pretrained", "init_cfg", "norm_eval"]);
        r.finish()?;
        c.checked()
    }

    /// The settings `vit.py` cannot build a model of, refused by name
    /// before libtorch would fail on them.
    fn checked(self) -> Result<VitConfig, ModelError> {
        let num_layers = self.num_layers;
        if self.output_cls_token && !self.with_cls_token {
            // vit.py's assert (its f-string lacks the space).
            return Err(ModelError::config(
                "VisionTransformer",
                "with_cls_token must be True ifset output_cls_token to True, but got False",
            ));
        }
        ModelError::require_positive(
            "VisionTransformer",
            &[
                ("img_size", self.img_size.0.min(self.img_size.1)),
                ("patch_size", self.patch_size),
                ("embed_dims", self.embed_dims),
                ("num_layers", self.num_layers),
                ("num_heads", self.num_heads),
            ],
        )?;
        if self.embed_dims % self.num_heads != 0 {
            return Err(ModelError::config(
                "VisionTransformer",
                format!(
                    "embed_dims={} is not divisible into num_heads={}",
                    self.embed_dims, self.num_heads
                ),
            ));
        }
        if let Some(i) = self
            .out_indices
            .iter()
            .find(|i| !(0..num_layers).contains(*i))
        {
            return Err(ModelError::config(
                "VisionTransformer",
                format!(
                    "out_indices entry {i} is not a layer index below \
                     num_layers={num_layers} (vit.py would drop that output)"
                ),
            ));
        }
        Ok(self)
    }
}

/// mmseg's `TransformerEncoderLayer` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncoderLayerCfg {
    pub embed_dims: i64,
    pub num_heads: i64,
    pub feedforward_channels: i64,
    pub drop_rate: f64,
    pub drop_path_rate: f64,
    pub qkv_bias: bool,
    pub norm: LayerNormCfg,
    pub with_cp: bool,
}

/// `TransformerEncoderLayer`: `x + attn(ln1(x))`, then `x + ffn(ln2(x))`,
/// the attention through mmcv's batch-first `MultiheadAttention` wrapper.
pub struct TransformerEncoderLayer {
    ln1: LayerNorm,
    attn: MultiheadAttention,
    proj_drop: f64,
    ln2: LayerNorm,
    ffn: Ffn,
    with_cp: bool,
}

impl TransformerEncoderLayer {
    /// `p`: the layer's scope (`layers.<i>`).
    pub fn new(p: &mut ParamScope, c: &EncoderLayerCfg) -> TransformerEncoderLayer {
        let ln1 = c.norm.build(&mut p.sub("ln1"), c.embed_dims);
        let attn = MultiheadAttention::new(
            &mut p.sub("attn").sub("attn"),
            c.embed_dims,
            c.num_heads,
            c.qkv_bias,
        );
        let ln2 = c.norm.build(&mut p.sub("ln2"), c.embed_dims);
        // vit.py gives the FFN no DropPath where the layer's rate is 0.
        let ffn = Ffn::gelu(
            &mut p.sub("ffn"),
            c.embed_dims,
            c.feedforward_channels,
            c.drop_rate,
            c.drop_path_rate,
        );
        TransformerEncoderLayer {
            ln1,
            attn,
            proj_drop: c.drop_rate,
            ln2,
            ffn,
            with_cp: c.with_cp,
        }
    }

    /// `x`: `[B, L, C]`. Through a checkpoint under `with_cp` when `x`
    /// requires grad.
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        // SAFETY: the block borrows this module, which outlives the step's graph
        // (a trial keeps its model for all its steps).
        unsafe {
            checkpoint_if(self.with_cp, x, move |x: &Tensor| {
                self.inner_forward(x, training)
            })
        }
    }

    fn inner_forward(&self, input: &Tensor, training: bool) -> Tensor {
        // Python's argument holds ln1's output until the attention returns.
        let x = {
            let normed = self.ln1.forward(input);
            self.attention(&normed, input, training)
        };
        let normed = self.ln2.forward(&x);
        self.ffn.forward(&normed, &x, training)
    }

    /// mmcv's `MultiheadAttention.forward(query, identity=...)` with
    /// `batch_first=True`: query, key and value are three transposed views
    /// of one tensor, so `nn.MultiheadAttention` projects them separately.
    fn attention(&self, query: &Tensor, identity: &Tensor, training: bool) -> Tensor {
        let (q, k, v) = (
            query.transpose(0, 1),
            query.transpose(0, 1),
            query.transpose(0, 1),
        );
        let out = self.attn.forward_separate(&q, &k, &v, None).transpose(0, 1);
        // proj_drop, then the default dropout_layer (a zero-probability Dropout).
        identity + out.dropout(self.proj_drop, training)
    }
}

/// The ViT encoder.
pub struct VisionTransformer {
    cls_token: Tensor,
    pos_embed: Tensor,
    /// The `img_size` grid the position embedding was made for.
    pos_grid: (i64, i64),
    patch_embed: PatchEmbed,
    pre_ln: Option<LayerNorm>,
    layers: Vec<TransformerEncoderLayer>,
    /// `ln1` after the last layer (`final_norm`).
    final_ln: Option<LayerNorm>,
    embed_dims: i64,
    drop_rate: f64,
    with_cls_token: bool,
    output_cls_token: bool,
    out_origin: bool,
    out_indices: Vec<i64>,
    interpolate_mode: PosInterpolation,
}

impl VisionTransformer {
    pub fn new(p: &mut ParamScope, c: &VitConfig) -> VisionTransformer {
        // nn.Module lists its own parameters before its children's.
        let pos_grid = (c.img_size.0 / c.patch_size, c.img_size.1 / c.patch_size);
        let cls_token = p.param_zeros("cls_token", &[1, 1, c.embed_dims]);
        let pos_embed = p.param_zeros("pos_embed", &[1, pos_grid.0 * pos_grid.1 + 1, c.embed_dims]);
        let patch_embed = PatchEmbed::patchify(
            &mut p.sub("patch_embed"),
            c.in_channels,
            c.embed_dims,
            c.patch_size,
            c.patch_pad,
            c.patch_bias,
            c.patch_norm.then_some(c.norm),
        );
        let pre_ln = c
            .pre_norm
            .then(|| c.norm.build(&mut p.sub("ln_pre"), c.embed_dims));
        let dpr = linspace_drop_path_rates(c.drop_path_rate, c.num_layers as usize);
        let layers = dpr
            .iter()
            .enumerate()
            .map(|(i, drop_path_rate)| {
                let layer = EncoderLayerCfg {
                    embed_dims: c.embed_dims,
                    num_heads: c.num_heads,
                    feedforward_channels: c.feedforward_channels,
                    drop_rate: c.drop_rate,
                    drop_path_rate: *drop_path_rate,
                    qkv_bias: c.qkv_bias,
                    norm: c.norm,
                    with_cp: c.with_cp,
                };
                TransformerEncoderLayer::new(&mut p.sub("layers").sub(i), &layer)
            })
            .collect();
        let final_ln = c
            .final_norm
            .then(|| c.norm.build(&mut p.sub("ln1"), c.embed_dims));
        VisionTransformer {
            cls_token,
            pos_embed,
            pos_grid,
            patch_embed,
            pre_ln,
            layers,
            final_ln,
            embed_dims: c.embed_dims,
            drop_rate: c.drop_rate,
            with_cls_token: c.with_cls_token,
            output_cls_token: c.output_cls_token,
            out_origin: c.out_origin,
            out_indices: c.out_indices.clone(),
            interpolate_mode: c.interpolate_mode,
        }
    }

    /// `resize_pos_embed`: the grid part of the embedding interpolated to
    /// `hw`, the class token's part put back in front.
    fn resized_pos_embed(&self, hw: (i64, i64)) -> Tensor {
        let (pos_h, pos_w) = self.pos_grid;
        let cls_token_weight = self.pos_embed.select(1, 0);
        let grid = self
            .pos_embed
            .slice(1, -(pos_h * pos_w), None, 1)
            .reshape([1, pos_h, pos_w, self.embed_dims])
            .permute([0, 3, 1, 2]);
        let grid = match self.interpolate_mode {
            PosInterpolation::Bicubic => grid.upsample_bicubic2d([hw.0, hw.1], false, None, None),
            PosInterpolation::Bilinear => grid.upsample_bilinear2d([hw.0, hw.1], false, None, None),
        };
        let cls_token_weight = cls_token_weight.unsqueeze(1);
        let grid = grid.flatten(2, -1).transpose(1, 2);
        Tensor::cat(&[cls_token_weight, grid], 1)
    }

    /// `_pos_embeding`: the tokens plus the (resized) position embedding,
    /// then `drop_after_pos`.
    fn add_pos_embed(&self, tokens: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        let with_pos = if tokens.size()[1] != self.pos_embed.size()[1] {
            tokens + self.resized_pos_embed(hw)
        } else {
            tokens + &self.pos_embed
        };
        with_pos.dropout(self.drop_rate, training)
    }

    /// An output: the tokens without the class token as a `[B, C, h, w]`
    /// map, then (`output_cls_token`) the class token `x[:, 0]`.
    fn push_output(&self, outs: &mut Vec<Tensor>, x: &Tensor, hw: (i64, i64)) {
        outs.push(self.output_map(x, hw));
        if self.output_cls_token {
            outs.push(x.select(1, 0));
        }
    }

    /// The tokens without the class token as a `[B, C, h, w]` map.
    fn output_map(&self, x: &Tensor, hw: (i64, i64)) -> Tensor {
        let out = if self.with_cls_token {
            x.slice(1, 1, None, 1)
        } else {
            x.shallow_clone()
        };
        let (b, _, c) = out.size3().expect("ViT tokens are [B, L, C]");
        out.reshape([b, hw.0, hw.1, c])
            .permute([0, 3, 1, 2])
            .contiguous()
    }
}

impl Backbone for VisionTransformer {
    /// One `[B, embed_dims, H / patch, W / patch]` map per output index
    /// (after the embedding first, with `out_origin`), each followed by its
    /// `[B, embed_dims]` class token with `output_cls_token`.
    fn forward(&self, inputs: &Tensor, training: bool) -> Vec<Tensor> {
        let b = inputs.size()[0];
        let (tokens, hw) = {
            let (patches, hw) = self.patch_embed.forward(inputs);
            let cls_tokens = self.cls_token.expand([b, -1, -1], false);
            (Tensor::cat(&[cls_tokens, patches], 1), hw)
        };
        let mut x = self.add_pos_embed(&tokens, hw, training);
        drop(tokens);
        if !self.with_cls_token {
            x = x.slice(1, 1, None, 1);
        }
        if let Some(pre_ln) = &self.pre_ln {
            x = pre_ln.forward(&x);
        }
        let mut outs = Vec::new();
        if self.out_origin {
            self.push_output(&mut outs, &x, hw);
        }
        let encoder = Encoder::new(&self.layers, self.final_ln.as_ref(), &self.out_indices);
        encoder.run(
            x,
            |layer, x| layer.forward(x, training),
            |x| self.push_output(&mut outs, x, hw),
        );
        outs
    }
}

/// The encoder stage of ViT and BEiT's `forward`: the `layers` in order
/// (scopes `layer<i>`), `final_ln` after the last, the tokens after every
/// layer of `out_indices`.
pub(super) struct Encoder<'a, L> {
    layers: &'a [L],
    final_ln: Option<&'a LayerNorm>,
    out_indices: &'a [i64],
}

impl<'a, L> Encoder<'a, L> {
    pub fn new(
        layers: &'a [L],
        final_ln: Option<&'a LayerNorm>,
        out_indices: &'a [i64],
    ) -> Encoder<'a, L> {
        Encoder {
            layers,
            final_ln,
            out_indices,
        }
    }

    /// `x` through the layers (`layer_forward`), each output index's tokens
    /// handed to `output`.
    pub fn run(
        &self,
        mut x: Tensor,
        layer_forward: impl Fn(&L, &Tensor) -> Tensor,
        mut output: impl FnMut(&Tensor),
    ) {
        let last = self.layers.len().saturating_sub(1);
        for (i, layer) in self.layers.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("layer{}", i + 1));
            x = layer_forward(layer, &x);
            if i == last {
                if let Some(ln) = self.final_ln {
                    x = ln.forward(&x);
                }
            }
            if self.out_indices.contains(&(i as i64)) {
                output(&x);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use serde_json::json;

    #[test]
    fn deit_small_reads_with_mmseg_defaults() {
        let c = VitConfig::from_cfg(&dict(json!({
            "type": "VisionTransformer", "img_size": [512, 512], "embed_dims": 384,
            "num_heads": 6, "out_indices": [2, 5, 8, 11], "drop_path_rate": 0.1,
            "norm_cfg": {"type": "LN", "eps": 1e-6}
        })))
        .unwrap();
        assert_eq!(c.img_size, (512, 512));
        assert_eq!(c.feedforward_channels, 1536);
        assert_eq!(c.out_indices, vec![2, 5, 8, 11]);
        assert!(!c.patch_bias && c.with_cls_token && !c.final_norm);
        assert_eq!(c.norm.eps, 1e-6);
        assert_eq!(c.interpolate_mode, PosInterpolation::Bicubic);
    }

    #[test]
    fn output_cls_token_follows_each_map_with_its_class_token() {
        let (_, vit) = crate::models::component_config::test_support::backbone(json!({
            "type": "VisionTransformer", "img_size": 32, "embed_dims": 16, "num_layers": 2,
            "num_heads": 2, "out_indices": [0, 1], "output_cls_token": true
        }));
        let outs = vit.forward(&Tensor::randn([2, 3, 64, 64], tch::kind::FLOAT_CPU), true);
        let shapes: Vec<Vec<i64>> = outs.iter().map(Tensor::size).collect();
        assert_eq!(
            shapes,
            [
                vec![2, 16, 4, 4],
                vec![2, 16],
                vec![2, 16, 4, 4],
                vec![2, 16]
            ]
        );
    }

    #[test]
    fn out_indices_minus_one_is_the_last_layer() {
        let c = VitConfig::from_cfg(&dict(json!({
            "type": "VisionTransformer", "num_layers": 6, "out_indices": -1
        })))
        .unwrap();
        assert_eq!(c.out_indices, vec![5]);
    }

    #[test]
    fn settings_mmseg_cannot_run_or_segtune_does_not_build_are_named() {
        let err = |v: serde_json::Value| VitConfig::from_cfg(&dict(v)).unwrap_err().to_string();
        let e = err(json!({"type": "VisionTransformer", "embed_dims": 100, "num_heads": 3}));
        assert!(
            e.contains("embed_dims=100") && e.contains("num_heads=3"),
            "{e}"
        );
        let e = err(json!({"type": "VisionTransformer", "num_layers": 4, "out_indices": [1, 7]}));
        assert!(e.contains("out_indices entry 7"), "{e}");
        let e = err(
            json!({"type": "VisionTransformer", "output_cls_token": true, "with_cls_token": false}),
        );
        assert!(e.contains("ifset output_cls_token"), "{e}");
        let e = err(json!({"type": "VisionTransformer", "interpolate_mode": "area"}));
        assert!(e.contains("interpolate_mode") && e.contains("area"), "{e}");
        let e = err(
            json!({"type": "VisionTransformer", "mlp_ratio": 2.5, "embed_dims": 3, "num_heads": 1}),
        );
        assert!(e.contains("7.5"), "{e}");
    }
}
