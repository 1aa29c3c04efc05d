//! Twins (`PCPVT` and `SVT`), as MMSeg's `mmseg/models/backbones/twins.py`
//! builds them (with MiT's `EfficientMultiheadAttention`, mmseg's
//! `PatchEmbed` and mmcv's `FFN`).
//!
//! Chu et al., "Twins: Revisiting the Design of Spatial Attention in Vision
//! Transformers", NeurIPS 2021, arXiv:2104.13840.
//!
//! Four stages, each a strided patch embedding (LayerNorm'd) and encoder
//! layers; after each stage's first layer a conditional position encoding
//! (a depthwise 3x3 conv added to its input). PCPVT's layers attend
//! globally over keys and values reduced by a strided conv (`sr_ratio`);
//! SVT alternates those with locally-grouped attention inside
//! `window_size`² windows (padded, with a mask for the padding). Each layer
//! adds its attention and FFN through DropPath twice (inside the module and
//! outside), as MMSeg writes it. SVT norms each stage's output.

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{
    count_flops, linspace_drop_path_rates, nchw_to_nlc, nlc_to_nchw, softmax_saved, Conv2d,
    ConvSpec, DropPath, Ffn, FfnActivation, LayerNorm, LayerNormCfg, Linear, MultiheadAttention,
    PatchEmbed, PatchPadding,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/backbones/twins.py";

/// The registry's constructor (`BACKBONES` row `PCPVT`).
pub fn build_pcpvt(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = TwinsConfig::from_cfg(cfg, false)?;
    Ok(Box::new(Twins::new(p, &cfg)))
}

/// The registry's constructor (`BACKBONES` row `SVT`).
pub fn build_svt(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = TwinsConfig::from_cfg(cfg, true)?;
    Ok(Box::new(Twins::new(p, &cfg)))
}

/// The backbone's settings; `window_sizes` is SVT's `windiow_sizes` (sic),
/// empty for PCPVT.
#[derive(Debug, Clone, PartialEq)]
pub struct TwinsConfig {
    pub in_channels: i64,
    pub embed_dims: Vec<i64>,
    pub patch_sizes: Vec<i64>,
    pub strides: Vec<i64>,
    pub num_heads: Vec<i64>,
    pub mlp_ratios: Vec<i64>,
    pub out_indices: Vec<i64>,
    pub qkv_bias: bool,
    pub drop_rate: f64,
    pub drop_path_rate: f64,
    pub norm: LayerNormCfg,
    pub depths: Vec<i64>,
    pub sr_ratios: Vec<i64>,
    pub norm_after_stage: bool,
    pub window_sizes: Vec<i64>,
}

impl TwinsConfig {
    pub fn from_cfg(cfg: &Dict, svt: bool) -> Result<TwinsConfig, ModelError> {
        let name = if svt { "SVT" } else { "PCPVT" };
        let mut r = ComponentConfig::new(cfg, name, SOURCE);
        let c = TwinsConfig {
            in_channels: r.int("in_channels", 3)?,
            embed_dims: r.ints(
                "embed_dims",
                if svt {
                    &[64, 128, 256]
                } else {
                    &[64, 128, 256, 512]
                },
            )?,
            patch_sizes: r.ints("patch_sizes", &[4, 2, 2, 2])?,
            strides: r.ints("strides", &[4, 2, 2, 2])?,
            num_heads: r.ints("num_heads", if svt { &[1, 2, 4] } else { &[1, 2, 4, 8] })?,
            mlp_ratios: r.ints("mlp_ratios", if svt { &[4, 4, 4] } else { &[4, 4, 4, 4] })?,
            out_indices: r.ints("out_indices", &[0, 1, 2, 3])?,
            qkv_bias: r.flag("qkv_bias", false),
            drop_rate: r.float("drop_rate", 0.0)?,
            drop_path_rate: r.float("drop_path_rate", if svt { 0.2 } else { 0.0 })?,
            norm: LayerNormCfg::from_cfg(&mut r, "norm_cfg", LayerNormCfg::DEFAULT)?,
            depths: r.ints("depths", if svt { &[4, 4, 4] } else { &[3, 4, 6, 3] })?,
            sr_ratios: r.ints("sr_ratios", if svt { &[4, 2, 1] } else { &[8, 4, 2, 1] })?,
            norm_after_stage: r.flag("norm_after_stage", svt),
            window_sizes: if svt {
                r.ints("windiow_sizes", &[7, 7, 7])?
            } else {
                Vec::new()
            },
        };
        // The attention-weight dropout is not reproduced.
        r.unimplemented("attn_drop_rate", &Value::Float(0.0))?;
        r.inert(&["pretrained", "init_cfg"]);
        r.finish()?;
        let stages = c.depths.len();
        let per_stage = [
            ("embed_dims", c.embed_dims.len()),
            ("patch_sizes", c.patch_sizes.len()),
            ("strides", c.strides.len()),
            ("num_heads", c.num_heads.len()),
            ("mlp_ratios", c.mlp_ratios.len()),
            ("sr_ratios", c.sr_ratios.len()),
        ];
        if let Some((key, n)) = per_stage.iter().find(|(_, n)| *n < stages) {
            return Err(ModelError::config(
                name,
                format!("{key} has {n} entries for {stages} stages (depths)"),
            ));
        }
        if svt && c.window_sizes.len() < stages {
            return Err(ModelError::config(
                "SVT",
                format!(
                    "windiow_sizes has {} entries for {stages} stages",
                    c.window_sizes.len()
                ),
            ));
        }
        for i in 0..stages {
            let (dims, heads) = (c.embed_dims[i], c.num_heads[i]);
            if heads < 1 || dims % heads != 0 {
                return Err(ModelError::config(
                    name,
                    format!("stage {i} has {dims} channels, not divisible into num_heads={heads}"),
                ));
            }
        }
        Ok(c)
    }
}

/// MiT's `EfficientMultiheadAttention` as Twins' `GlobalSubsampledAttention`.
struct GlobalSubsampledAttention {
    attn: MultiheadAttention,
    sr: Option<(Conv2d, LayerNorm)>,
    proj_drop: f64,
    /// The module's own `dropout_layer`.
    drop_path: DropPath,
}

impl GlobalSubsampledAttention {
    /// `identity=0.`: `0. + dropout_layer(proj_drop(attention))`.
    fn forward(&self, x: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        let x_kv = match &self.sr {
            Some((conv, norm)) => norm.forward(&nchw_to_nlc(&conv.forward(&nlc_to_nchw(x, hw)))),
            None => x.shallow_clone(),
        };
        let out = self
            .attn
            .forward(&x.transpose(0, 1), &x_kv.transpose(0, 1))
            .transpose(0, 1);
        self.drop_path
            .forward(&out.dropout(self.proj_drop, training), training)
            .g_add_scalar(0.0)
    }
}

/// `LocallyGroupedSelfAttention`: attention inside non-overlapping windows.
struct LocallyGroupedAttention {
    qkv: Linear,
    proj: Linear,
    num_heads: i64,
    window_size: i64,
    scale: f64,
    proj_drop: f64,
}

impl LocallyGroupedAttention {
    fn forward(&self, x: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        let (b, n, c) = x.size3().expect("LSA input is [B, N, C]");
        let (h, w) = hw;
        let ws = self.window_size;
        let heads = self.num_heads;
        let pad_r = (ws - w % ws) % ws;
        let pad_b = (ws - h % ws) % ws;
        let padded = x
            .view([b, h, w, c])
            .pad([0, 0, 0, pad_r, 0, pad_b], "constant", None);
        let (hp, wp) = (padded.size()[1], padded.size()[2]);
        let (gh, gw) = (hp / ws, wp / ws);
        let mask = {
            let zeros = Tensor::zeros([1, hp, wp], (Kind::Float, x.device()));
            // `mask[:, -pad_b:, :]` is the whole mask when pad_b is 0, as in Python.
            let _ = zeros.slice(1, -pad_b, None, 1).fill_(1.0);
            let _ = zeros.slice(2, -pad_r, None, 1).fill_(1.0);
            zeros
                .reshape([1, gh, ws, gw, ws])
                .transpose(2, 3)
                .reshape([1, gh * gw, ws * ws])
        };
        let windows = padded.reshape([b, gh, ws, gw, ws, c]).transpose(2, 3);
        let attn_mask = {
            let diff = mask.unsqueeze(2) - mask.unsqueeze(3);
            diff.masked_fill(&diff.ne(0.0), -1000.0)
                .masked_fill(&diff.eq(0.0), 0.0)
        };
        let qkv = self
            .qkv
            .forward(&windows)
            .reshape([b, gh * gw, ws * ws, 3, heads, c / heads])
            .permute([3, 0, 1, 4, 2, 5]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        count_flops(2.0 * 2.0 * (b * gh * gw * heads * (ws * ws) * (ws * ws) * (c / heads)) as f64);
        let logits = {
            let scores = q.matmul(&k.transpose(-2, -1)) * self.scale;
            scores + attn_mask.unsqueeze(2)
        };
        let attn = logits.softmax(-1, None::<Kind>);
        softmax_saved(&logits, &attn);
        drop(logits);
        let attn = attn
            .matmul(&v)
            .transpose(2, 3)
            .reshape([b, gh, gw, ws, ws, c]);
        let mut out = attn.transpose(2, 3).reshape([b, gh * ws, gw * ws, c]);
        if pad_r > 0 || pad_b > 0 {
            out = out.slice(1, 0, h, 1).slice(2, 0, w, 1).contiguous();
        }
        let out = self
            .proj
            .forward(&out.reshape([b, n, c]))
            .dropout(self.proj_drop, training);
        // Python's locals (the padded map, masks, qkv and its views) live until return.
        drop((padded, mask, windows, attn_mask, qkv, q, k, v, attn));
        out
    }
}

enum Attention {
    Global(GlobalSubsampledAttention),
    Local(LocallyGroupedAttention),
}

/// `GSAEncoderLayer` / `LSAEncoderLayer`:
/// `x + drop_path(attn(norm1(x)))`, then `x + drop_path(ffn(norm2(x)))`.
struct EncoderLayer {
    norm1: LayerNorm,
    attn: Attention,
    norm2: LayerNorm,
    ffn: Ffn,
    drop_path: DropPath,
}

impl EncoderLayer {
    /// `p`: `layers.<k>.<i>`; SVT's even layers attend locally.
    fn new(lp: &mut ParamScope, c: &TwinsConfig, k: usize, i: usize, rate: f64) -> EncoderLayer {
        let dims = &c.embed_dims;
        // The layers' own norms are dict(type='LN'), whatever norm_cfg says.
        let ln = LayerNormCfg::DEFAULT;
        let norm1 = ln.build(&mut lp.sub("norm1"), dims[k]);
        let local = !c.window_sizes.is_empty() && i.is_multiple_of(2);
        let attn = if local {
            let mut ap = lp.sub("attn");
            let qkv = Linear::new(&mut ap.sub("qkv"), dims[k], 3 * dims[k], c.qkv_bias);
            let proj = Linear::new(&mut ap.sub("proj"), dims[k], dims[k], true);
            Attention::Local(LocallyGroupedAttention {
                qkv,
                proj,
                num_heads: c.num_heads[k],
                window_size: c.window_sizes[k],
                scale: ((dims[k] / c.num_heads[k]) as f64).powf(-0.5),
                proj_drop: c.drop_rate,
            })
        } else {
            let mut ap = lp.sub("attn");
            let attn =
                MultiheadAttention::new(&mut ap.sub("attn"), dims[k], c.num_heads[k], c.qkv_bias);
            let sr_ratio = c.sr_ratios[k];
            let sr = (sr_ratio > 1).then(|| {
                let conv = Conv2d::new(
                    &mut ap.sub("sr"),
                    ConvSpec::new(dims[k], dims[k], sr_ratio).stride(sr_ratio),
                );
                (conv, ln.build(&mut ap.sub("norm"), dims[k]))
            });
            Attention::Global(GlobalSubsampledAttention {
                attn,
                sr,
                proj_drop: c.drop_rate,
                drop_path: DropPath { prob: rate },
            })
        };
        let norm2 = ln.build(&mut lp.sub("norm2"), dims[k]);
        let ffn = Ffn::new(
            &mut lp.sub("ffn"),
            dims[k],
            c.mlp_ratios[k] * dims[k],
            FfnActivation::Gelu,
            c.drop_rate,
            rate,
        );
        EncoderLayer {
            norm1,
            attn,
            norm2,
            ffn,
            drop_path: DropPath { prob: rate },
        }
    }

    fn forward(&self, x: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        let attended = {
            let normed = self.norm1.forward(x);
            match &self.attn {
                Attention::Global(a) => a.forward(&normed, hw, training),
                Attention::Local(a) => a.forward(&normed, hw, training),
            }
        };
        let x = x + self.drop_path.forward(&attended, training);
        drop(attended);
        let fed = {
            let normed = self.norm2.forward(&x);
            self.ffn.forward_no_identity(&normed, training)
        };
        &x + self.drop_path.forward(&fed, training)
    }
}

/// `ConditionalPositionEncoding` (stride 1): `proj(x) + x` on the map.
struct PositionEncoding {
    proj: Conv2d,
}

impl PositionEncoding {
    fn forward(&self, x: &Tensor, hw: (i64, i64)) -> Tensor {
        let (b, _, c) = x.size3().expect("tokens are [B, N, C]");
        let cnn_feat = x.transpose(1, 2).view([b, c, hw.0, hw.1]);
        let x = self.proj.forward(&cnn_feat) + &cnn_feat;
        x.flatten(2, -1).transpose(1, 2)
    }
}

struct Stage {
    patch_embed: PatchEmbed,
    position_encoding: PositionEncoding,
    layers: Vec<EncoderLayer>,
    norm: Option<LayerNorm>,
}

pub struct Twins {
    stages: Vec<Stage>,
    out_indices: Vec<i64>,
    drop_rate: f64,
}

impl Twins {
    pub fn new(p: &mut ParamScope, c: &TwinsConfig) -> Twins {
        let stages = c.depths.len();
        let dims = &c.embed_dims;
        // Registration order: every patch embedding, every position
        // encoding, every stage's layers, then the stage norms.
        let patch_embeds: Vec<PatchEmbed> = (0..stages)
            .map(|i| {
                PatchEmbed::new(
                    &mut p.sub("patch_embeds").sub(i),
                    if i == 0 { c.in_channels } else { dims[i - 1] },
                    dims[i],
                    c.patch_sizes[i],
                    c.strides[i],
                    PatchPadding::Corner,
                    true,
                    Some(c.norm),
                )
            })
            .collect();
        let position_encodings: Vec<PositionEncoding> = (0..stages)
            .map(|i| PositionEncoding {
                proj: Conv2d::new(
                    &mut p.sub("position_encodings").sub(i).sub("proj"),
                    ConvSpec::new(dims[i], dims[i], 3)
                        .padding(1)
                        .groups(dims[i]),
                ),
            })
            .collect();
        let total: i64 = c.depths.iter().sum();
        let dpr = linspace_drop_path_rates(c.drop_path_rate, total as usize);
        let mut first = 0usize;
        let mut layers: Vec<Vec<EncoderLayer>> = Vec::with_capacity(stages);
        for (k, depth) in c.depths.iter().enumerate() {
            let stage_layers = (0..*depth as usize)
                .map(|i| {
                    let mut layers_scope = p.sub("layers");
                    let mut stage_scope = layers_scope.sub(k);
                    EncoderLayer::new(&mut stage_scope.sub(i), c, k, i, dpr[first + i])
                })
                .collect();
            first += *depth as usize;
            layers.push(stage_layers);
        }
        let norms: Vec<Option<LayerNorm>> = (0..stages)
            .map(|i| {
                c.norm_after_stage
                    .then(|| c.norm.build(&mut p.sub("norm_list").sub(i), dims[i]))
            })
            .collect();
        let stages = patch_embeds
            .into_iter()
            .zip(position_encodings)
            .zip(layers)
            .zip(norms)
            .map(|(((patch_embed, position_encoding), layers), norm)| Stage {
                patch_embed,
                position_encoding,
                layers,
                norm,
            })
            .collect();
        Twins {
            stages,
            out_indices: c.out_indices.clone(),
            drop_rate: c.drop_rate,
        }
    }
}

impl Backbone for Twins {
    /// One `[B, embed_dims[i], H / s_i, W / s_i]` map per output stage.
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let b = x.size()[0];
        let mut x = x.shallow_clone();
        let mut outputs = Vec::new();
        for (i, stage) in self.stages.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("stage{}", i + 1));
            let (tokens, hw) = stage.patch_embed.forward(&x);
            let mut tokens = tokens.dropout(self.drop_rate, training);
            for (j, layer) in stage.layers.iter().enumerate() {
                tokens = layer.forward(&tokens, hw, training);
                if j == 0 {
                    tokens = stage.position_encoding.forward(&tokens, hw);
                }
            }
            if let Some(norm) = &stage.norm {
                tokens = norm.forward(&tokens);
            }
            x = tokens
                .reshape([b, hw.0, hw.1, -1])
                .permute([0, 3, 1, 2])
                .contiguous();
            if self.out_indices.contains(&(i as i64)) {
                outputs.push(x.shallow_clone());
            }
        }
        outputs
    }
}

#[cfg(test)]
#[path = "twins_tests.rs"]
mod tests;
