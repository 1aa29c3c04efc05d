//! MixVisionTransformer (MiT), the SegFormer encoder, as MMSeg's
//! `mmseg/models/backbones/mit.py` builds it.
//!
//! Xie et al., "SegFormer: Simple and Efficient Design for Semantic
//! Segmentation with Transformers", NeurIPS 2021, arXiv:2105.15203.
//!
//! Each stage: an overlapping patch embedding (strided conv + LayerNorm),
//! transformer blocks whose attention reduces keys/values spatially by
//! `sr_ratio` (a strided conv + LayerNorm) and whose FFN is MixFFN (1x1 conv,
//! 3x3 depthwise conv, GELU, 1x1 conv), then a LayerNorm. Drop path rates
//! grow linearly over all blocks.

use super::layers::{
    nchw_to_nlc, nlc_to_nchw, Conv2d, ConvSpec, DropPath, LayerNorm, MultiheadAttention,
};
use super::params::ParamScope;
use super::{cfg_f64, cfg_i64, cfg_i64_list, ModelError};
use crate::config::{Dict, Value};
use tch::Tensor;

/// The backbone's settings (`model.backbone` of the config).
#[derive(Debug, Clone, PartialEq)]
pub struct MitConfig {
    pub in_channels: i64,
    pub embed_dims: i64,
    pub num_layers: Vec<i64>,
    pub num_heads: Vec<i64>,
    pub patch_sizes: Vec<i64>,
    pub strides: Vec<i64>,
    pub sr_ratios: Vec<i64>,
    pub out_indices: Vec<i64>,
    pub mlp_ratio: i64,
    pub qkv_bias: bool,
    pub drop_rate: f64,
    pub attn_drop_rate: f64,
    pub drop_path_rate: f64,
    pub norm_eps: f64,
}

impl MitConfig {
    pub fn from_cfg(cfg: &Dict) -> Result<MitConfig, ModelError> {
        let num_stages = cfg_i64(cfg, "num_stages", 4)? as usize;
        let c = MitConfig {
            in_channels: cfg_i64(cfg, "in_channels", 3)?,
            embed_dims: cfg_i64(cfg, "embed_dims", 64)?,
            num_layers: cfg_i64_list(cfg, "num_layers", &[3, 4, 6, 3])?,
            num_heads: cfg_i64_list(cfg, "num_heads", &[1, 2, 4, 8])?,
            patch_sizes: cfg_i64_list(cfg, "patch_sizes", &[7, 3, 3, 3])?,
            strides: cfg_i64_list(cfg, "strides", &[4, 2, 2, 2])?,
            sr_ratios: cfg_i64_list(cfg, "sr_ratios", &[8, 4, 2, 1])?,
            out_indices: cfg_i64_list(cfg, "out_indices", &[0, 1, 2, 3])?,
            mlp_ratio: cfg_i64(cfg, "mlp_ratio", 4)?,
            qkv_bias: cfg.get("qkv_bias").map(Value::truthy).unwrap_or(true),
            drop_rate: cfg_f64(cfg, "drop_rate", 0.0)?,
            attn_drop_rate: cfg_f64(cfg, "attn_drop_rate", 0.0)?,
            drop_path_rate: cfg_f64(cfg, "drop_path_rate", 0.0)?,
            norm_eps: match cfg.get("norm_cfg") {
                Some(Value::Dict(n)) => cfg_f64(n, "eps", 1e-5)?,
                _ => 1e-6,
            },
        };
        let lens = [
            c.num_layers.len(),
            c.num_heads.len(),
            c.patch_sizes.len(),
            c.strides.len(),
            c.sr_ratios.len(),
        ];
        if lens.iter().any(|l| *l != num_stages) {
            return Err(ModelError::Config(format!(
                "MixVisionTransformer: num_layers, num_heads, patch_sizes, strides and sr_ratios must all have num_stages={num_stages} items"
            )));
        }
        if cfg.get("with_cp").is_some_and(Value::truthy) {
            return Err(ModelError::Config(
                "MixVisionTransformer: with_cp (gradient checkpointing) is not supported yet"
                    .into(),
            ));
        }
        Ok(c)
    }
}

struct EfficientAttention {
    attn: MultiheadAttention,
    sr: Option<(Conv2d, LayerNorm)>,
    drop_path: DropPath,
    proj_drop: f64,
}

impl EfficientAttention {
    fn forward(&self, x: &Tensor, hw: (i64, i64), identity: &Tensor, training: bool) -> Tensor {
        let x_kv = match &self.sr {
            Some((conv, norm)) => norm.forward(&nchw_to_nlc(&conv.forward(&nlc_to_nchw(x, hw)))),
            None => x.shallow_clone(),
        };
        // batch_first: (B, N, C) -> (N, B, C) and back.
        let out = self
            .attn
            .forward(&x.transpose(0, 1), &x_kv.transpose(0, 1))
            .transpose(0, 1);
        identity
            + self
                .drop_path
                .forward(&out.dropout(self.proj_drop, training), training)
    }
}

struct MixFfn {
    fc1: Conv2d,
    pe_conv: Conv2d,
    fc2: Conv2d,
    drop: f64,
    drop_path: DropPath,
}

impl MixFfn {
    fn forward(&self, x: &Tensor, hw: (i64, i64), identity: &Tensor, training: bool) -> Tensor {
        let out = self.fc1.forward(&nlc_to_nchw(x, hw));
        let out = self
            .pe_conv
            .forward(&out)
            .gelu("none")
            .dropout(self.drop, training);
        let out = self.fc2.forward(&out).dropout(self.drop, training);
        identity + self.drop_path.forward(&nchw_to_nlc(&out), training)
    }
}

struct Block {
    norm1: LayerNorm,
    attn: EfficientAttention,
    norm2: LayerNorm,
    ffn: MixFfn,
}

struct Stage {
    projection: Conv2d,
    patch_norm: LayerNorm,
    blocks: Vec<Block>,
    norm: LayerNorm,
}

/// The MiT encoder.
pub struct MixVisionTransformer {
    stages: Vec<Stage>,
    out_indices: Vec<i64>,
}

impl MixVisionTransformer {
    pub fn new(p: &mut ParamScope, c: &MitConfig) -> MixVisionTransformer {
        let total: i64 = c.num_layers.iter().sum();
        // torch.linspace(0, drop_path_rate, total) in float32, as MMSeg computes it.
        let dpr: Vec<f64> = (0..total)
            .map(|i| {
                if total == 1 {
                    0.0
                } else {
                    (c.drop_path_rate as f32 * i as f32 / (total - 1) as f32) as f64
                }
            })
            .collect();
        let mut layers = p.sub("layers");
        let mut stages = Vec::new();
        let mut in_channels = c.in_channels;
        let mut cur = 0usize;
        for i in 0..c.num_layers.len() {
            let dims = c.embed_dims * c.num_heads[i];
            let mut sp = layers.sub(i);
            let mut pe = sp.sub(0);
            let projection = Conv2d::new(
                &mut pe.sub("projection"),
                ConvSpec::new(in_channels, dims, c.patch_sizes[i])
                    .stride(c.strides[i])
                    .padding(c.patch_sizes[i] / 2),
            );
            let patch_norm = LayerNorm::new(&mut pe.sub("norm"), dims, c.norm_eps);
            let mut blocks = Vec::new();
            for j in 0..c.num_layers[i] as usize {
                let mut bp = sp.sub(1);
                let mut b = bp.sub(j);
                let norm1 = LayerNorm::new(&mut b.sub("norm1"), dims, c.norm_eps);
                let attn = {
                    let mut ap = b.sub("attn");
                    let attn = MultiheadAttention::new(
                        &mut ap.sub("attn"),
                        dims,
                        c.num_heads[i],
                        c.qkv_bias,
                    );
                    let sr = (c.sr_ratios[i] > 1).then(|| {
                        let conv = Conv2d::new(
                            &mut ap.sub("sr"),
                            ConvSpec::new(dims, dims, c.sr_ratios[i]).stride(c.sr_ratios[i]),
                        );
                        (conv, LayerNorm::new(&mut ap.sub("norm"), dims, c.norm_eps))
                    });
                    EfficientAttention {
                        attn,
                        sr,
                        drop_path: DropPath { prob: dpr[cur + j] },
                        proj_drop: c.drop_rate,
                    }
                };
                let norm2 = LayerNorm::new(&mut b.sub("norm2"), dims, c.norm_eps);
                let ffn = {
                    let mut fp = b.sub("ffn");
                    let mut lp = fp.sub("layers");
                    let hidden = c.mlp_ratio * dims;
                    let fc1 = Conv2d::new(&mut lp.sub(0), ConvSpec::new(dims, hidden, 1));
                    let pe_conv = Conv2d::new(
                        &mut lp.sub(1),
                        ConvSpec::new(hidden, hidden, 3).padding(1).groups(hidden),
                    );
                    let fc2 = Conv2d::new(&mut lp.sub(4), ConvSpec::new(hidden, dims, 1));
                    MixFfn {
                        fc1,
                        pe_conv,
                        fc2,
                        drop: c.drop_rate,
                        drop_path: DropPath { prob: dpr[cur + j] },
                    }
                };
                blocks.push(Block {
                    norm1,
                    attn,
                    norm2,
                    ffn,
                });
            }
            let norm = LayerNorm::new(&mut sp.sub(2), dims, c.norm_eps);
            stages.push(Stage {
                projection,
                patch_norm,
                blocks,
                norm,
            });
            in_channels = dims;
            cur += c.num_layers[i] as usize;
        }
        MixVisionTransformer {
            stages,
            out_indices: c.out_indices.clone(),
        }
    }

    /// Multi-level features, one `(B, C_i, H_i, W_i)` map per output stage.
    pub fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut outs = Vec::new();
        let mut x = x.shallow_clone();
        for (i, stage) in self.stages.iter().enumerate() {
            let y = stage.projection.forward(&x);
            let hw = (y.size()[2], y.size()[3]);
            let mut t = stage.patch_norm.forward(&y.flatten(2, -1).transpose(1, 2));
            drop(y);
            for block in &stage.blocks {
                let attended = block
                    .attn
                    .forward(&block.norm1.forward(&t), hw, &t, training);
                t = block
                    .ffn
                    .forward(&block.norm2.forward(&attended), hw, &attended, training);
            }
            x = nlc_to_nchw(&stage.norm.forward(&t), hw);
            if self.out_indices.contains(&(i as i64)) {
                outs.push(x.shallow_clone());
            }
        }
        outs
    }
}
