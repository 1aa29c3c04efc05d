//! `SegformerModel`, the SegFormer encoder as Hugging Face `transformers`
//! builds it (`transformers/models/segformer/modeling_segformer.py`, 5.x:
//! `SegformerStage`, `SegformerLayer`, `SegformerAttention`,
//! `SegformerMixMLP`), for `SegformerForSemanticSegmentation`.
//!
//! Xie et al., "SegFormer: Simple and Efficient Design for Semantic
//! Segmentation with Transformers", NeurIPS 2021, arXiv:2105.15203.
//!
//! The same architecture as MMSeg's MiT (`mit.rs`), written differently,
//! and the difference is memory: separate `q_proj`/`k_proj`/`v_proj`
//! linears and `scaled_dot_product_attention` (the default `sdpa`
//! attention) or the explicit `eager` attention, instead of
//! `nn.MultiheadAttention` with its weights; `nn.Linear` for the Mix-FFN
//! instead of 1x1 convs, with a depthwise conv on a transposed *view*. Each
//! op below is the op the Python issues, in its order, so that the step
//! allocates what transformers' does.

use super::Backbone;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{
    checkpoint_if, dropout, Conv2d, ConvSpec, DropPath, LayerNorm, Linear,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "transformers/models/segformer/modeling_segformer.py";

/// The registry's constructor (`BACKBONES` row `SegformerModel`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = HfSegformerConfig::from_cfg(cfg)?;
    Ok(Box::new(SegformerModel::new(p, &cfg)))
}

/// How attention is computed (`config._attn_implementation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnImplementation {
    /// `torch.nn.functional.scaled_dot_product_attention` (transformers 5's default).
    Sdpa,
    /// `eager_attention_forward`: matmul, softmax in fp32, matmul.
    Eager,
}

/// The encoder's part of a `SegformerConfig` (`config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct HfSegformerConfig {
    pub num_channels: i64,
    pub depths: Vec<i64>,
    pub sr_ratios: Vec<i64>,
    pub hidden_sizes: Vec<i64>,
    pub patch_sizes: Vec<i64>,
    pub strides: Vec<i64>,
    pub num_attention_heads: Vec<i64>,
    pub mlp_ratios: Vec<i64>,
    pub hidden_dropout_prob: f64,
    pub attention_probs_dropout_prob: f64,
    pub drop_path_rate: f64,
    pub attn_implementation: AttnImplementation,
    /// `with_cp` (`TrainingArguments.gradient_checkpointing`): each
    /// `SegformerLayer` through `torch.utils.checkpoint` (transformers
    /// passes `use_reentrant=False`).
    pub gradient_checkpointing: bool,
}

impl HfSegformerConfig {
    /// Reads the keys of a `SegformerConfig` that shape the encoder, with
    /// `SegformerConfig`'s defaults (mit-b0).
    pub fn from_cfg(cfg: &Dict) -> Result<HfSegformerConfig, ModelError> {
        let mut r = ComponentConfig::new(cfg, "SegformerModel", SOURCE);
        let stages = r.int("num_encoder_blocks", 4)? as usize;
        let attn_implementation = match r.string("_attn_implementation")? {
            None | Some("sdpa") => AttnImplementation::Sdpa,
            Some("eager") => AttnImplementation::Eager,
            Some(other) => {
                return Err(r.unsupported(
                    "_attn_implementation",
                    format!("`{other}` (sdpa and eager are implemented)"),
                ))
            }
        };
        let c = HfSegformerConfig {
            num_channels: r.int("num_channels", 3)?,
            depths: r.ints("depths", &[2, 2, 2, 2])?,
            sr_ratios: r.ints("sr_ratios", &[8, 4, 2, 1])?,
            hidden_sizes: r.ints("hidden_sizes", &[32, 64, 160, 256])?,
            patch_sizes: r.ints("patch_sizes", &[7, 3, 3, 3])?,
            strides: r.ints("strides", &[4, 2, 2, 2])?,
            num_attention_heads: r.ints("num_attention_heads", &[1, 2, 5, 8])?,
            mlp_ratios: r.ints("mlp_ratios", &[4, 4, 4, 4])?,
            hidden_dropout_prob: r.float("hidden_dropout_prob", 0.0)?,
            attention_probs_dropout_prob: r.float("attention_probs_dropout_prob", 0.0)?,
            drop_path_rate: r.float("drop_path_rate", 0.1)?,
            attn_implementation,
            gradient_checkpointing: r.flag("with_cp", false),
        };
        if let Some(act) = r.string("hidden_act")? {
            if act != "gelu" {
                return Err(r.unsupported("hidden_act", format!("`{act}` (only gelu)")));
            }
        }
        if !r.flag("reshape_last_stage", true) {
            return Err(r.unsupported(
                "reshape_last_stage",
                "false (the semantic-segmentation model reshapes every stage)",
            ));
        }
        r.inert(&["layer_norm_eps", "initializer_range"]);
        r.finish()?;
        let lens = [
            c.depths.len(),
            c.sr_ratios.len(),
            c.hidden_sizes.len(),
            c.patch_sizes.len(),
            c.strides.len(),
            c.num_attention_heads.len(),
            c.mlp_ratios.len(),
        ];
        if lens.iter().any(|l| *l != stages) {
            return Err(ModelError::config(
                "SegformerConfig",
                format!(
                    "depths, sr_ratios, hidden_sizes, patch_sizes, strides, num_attention_heads \
                     and mlp_ratios must all have num_encoder_blocks={stages} items"
                ),
            ));
        }
        for (size, heads) in c.hidden_sizes.iter().zip(&c.num_attention_heads) {
            if *heads < 1 || size % heads != 0 {
                return Err(ModelError::config(
                    "SegformerConfig",
                    format!("hidden size {size} is not a multiple of {heads} attention heads"),
                ));
            }
        }
        Ok(c)
    }
}

/// `SegformerSequenceReduction`: a strided conv and a LayerNorm over the
/// keys/values.
struct SequenceReduction {
    sequence_reduction: Conv2d,
    layer_norm: LayerNorm,
}

impl SequenceReduction {
    fn forward(&self, x: &Tensor, hw: (i64, i64)) -> Tensor {
        let s = x.size(); // [B, N, C]
        let x = x.transpose(1, 2).reshape([s[0], s[2], hw.0, hw.1]);
        let x = self.sequence_reduction.forward(&x);
        let x = x.reshape([s[0], s[2], -1]).transpose(1, 2);
        self.layer_norm.forward(&x)
    }
}

/// `SegformerAttention`: efficient self-attention over spatially reduced
/// keys and values.
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    sequence_reduction: Option<SequenceReduction>,
    heads: i64,
    head_dim: i64,
    dropout: f64,
    implementation: AttnImplementation,
}

impl Attention {
    fn new(p: &mut ParamScope, c: &HfSegformerConfig, stage: usize) -> Attention {
        let dims = c.hidden_sizes[stage];
        let heads = c.num_attention_heads[stage];
        let sr = c.sr_ratios[stage];
        // Registered in __init__'s order: the projections, then the reduction.
        let q_proj = Linear::new(&mut p.sub("q_proj"), dims, dims, true);
        let k_proj = Linear::new(&mut p.sub("k_proj"), dims, dims, true);
        let v_proj = Linear::new(&mut p.sub("v_proj"), dims, dims, true);
        let o_proj = Linear::new(&mut p.sub("o_proj"), dims, dims, true);
        let sequence_reduction = (sr > 1).then(|| {
            let mut sp = p.sub("sequence_reduction");
            SequenceReduction {
                sequence_reduction: Conv2d::new(
                    &mut sp.sub("sequence_reduction"),
                    ConvSpec::new(dims, dims, sr).stride(sr),
                ),
                layer_norm: LayerNorm::new(&mut sp.sub("layer_norm"), dims, 1e-5),
            }
        });
        Attention {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            sequence_reduction,
            heads,
            head_dim: dims / heads,
            dropout: c.attention_probs_dropout_prob,
            implementation: c.attn_implementation,
        }
    }

    /// `x`: `[B, N, C]`; returns `[B, N, C]`.
    fn forward(&self, x: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        let s = x.size();
        let (b, n) = (s[0], s[1]);
        let split = |t: Tensor| {
            let l = t.size()[1];
            t.view([b, l, -1, self.head_dim]).transpose(1, 2)
        };
        let q = split(self.q_proj.forward(x));
        let kv_owned = self.sequence_reduction.as_ref().map(|r| r.forward(x, hw));
        let kv = kv_owned.as_ref().unwrap_or(x);
        let k = split(self.k_proj.forward(kv));
        let v = split(self.v_proj.forward(kv));
        drop(kv_owned);
        let p = if training { self.dropout } else { 0.0 };
        let scaling = (self.head_dim as f64).powf(-0.5);
        let m = k.size()[2];
        crate::models::layers::count_flops(
            2.0 * 2.0 * (b * self.heads * n * m * self.head_dim) as f64,
        );
        let out = match self.implementation {
            AttnImplementation::Sdpa => {
                // sdpa_attention_forward: is_causal is False (module.is_causal).
                let out = Tensor::scaled_dot_product_attention(
                    &q,
                    &k,
                    &v,
                    None::<Tensor>,
                    p,
                    false,
                    scaling,
                    false,
                );
                let out = out.reshape([b, -1, n, self.head_dim]);
                out.transpose(1, 2).contiguous()
            }
            AttnImplementation::Eager => {
                let weights = q.matmul(&k.transpose(2, 3)) * scaling;
                let probs = weights.softmax(-1, Kind::Float).to_kind(q.kind());
                drop(weights);
                let probs = dropout(&probs, p, training);
                probs.matmul(&v).transpose(1, 2).contiguous()
            }
        };
        let out = out.reshape([b, n, -1]).contiguous();
        self.o_proj.forward(&out)
    }
}

/// `SegformerMixMLP`: fc1, a 3x3 depthwise conv on the tokens as a map,
/// GELU, fc2, with dropouts.
struct MixMlp {
    fc1: Linear,
    dwconv: Conv2d,
    fc2: Linear,
    dropout: f64,
}

impl MixMlp {
    fn forward(&self, x: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        let h = self.fc1.forward(x); // [B, N, 4C]
        let s = h.size();
        // SegformerDepthWiseConv: transpose(1, 2).view(B, C, H, W), a view.
        let map = h.transpose(1, 2).view([s[0], s[2], hw.0, hw.1]);
        let h = self.dwconv.forward(&map);
        drop(map);
        let h = h.flatten(2, -1).transpose(1, 2);
        let h = h.gelu("none");
        let h = dropout(&h, self.dropout, training);
        let h = self.fc2.forward(&h);
        dropout(&h, self.dropout, training)
    }
}

/// `SegformerLayer` (a `GradientCheckpointingLayer`).
struct Layer {
    layernorm_before: LayerNorm,
    attention: Attention,
    drop_path: DropPath,
    layernorm_after: LayerNorm,
    mlp: MixMlp,
    hidden_dropout: f64,
    checkpointed: bool,
}

impl Layer {
    fn new(p: &mut ParamScope, c: &HfSegformerConfig, stage: usize, drop_path: f64) -> Layer {
        let dims = c.hidden_sizes[stage];
        let hidden = dims * c.mlp_ratios[stage];
        let layernorm_before = LayerNorm::new(&mut p.sub("layernorm_before"), dims, 1e-5);
        let attention = Attention::new(&mut p.sub("attention"), c, stage);
        let layernorm_after = LayerNorm::new(&mut p.sub("layernorm_after"), dims, 1e-5);
        let mut mp = p.sub("mlp");
        let fc1 = Linear::new(&mut mp.sub("fc1"), dims, hidden, true);
        let dwconv = Conv2d::new(
            &mut mp.sub("dwconv").sub("dwconv"),
            ConvSpec::new(hidden, hidden, 3).padding(1).groups(hidden),
        );
        let fc2 = Linear::new(&mut mp.sub("fc2"), hidden, dims, true);
        Layer {
            layernorm_before,
            attention,
            drop_path: DropPath { prob: drop_path },
            layernorm_after,
            mlp: MixMlp {
                fc1,
                dwconv,
                fc2,
                dropout: c.hidden_dropout_prob,
            },
            hidden_dropout: c.hidden_dropout_prob,
            checkpointed: c.gradient_checkpointing,
        }
    }

    fn forward(&self, x: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        // SAFETY: the block borrows this module, which outlives the step's graph
        // (a trial keeps its model for all its steps).
        unsafe {
            checkpoint_if(self.checkpointed && training, x, move |x: &Tensor| {
                self.inner_forward(x, hw, training)
            })
        }
    }

    fn inner_forward(&self, x: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        let h = self.layernorm_before.forward(x);
        let h = self.attention.forward(&h, hw, training);
        let h = dropout(&h, self.hidden_dropout, training);
        let x = self.drop_path.forward(&h, training) + x;
        drop(h);
        let h = self.layernorm_after.forward(&x);
        let h = self.mlp.forward(&h, hw, training);
        self.drop_path.forward(&h, training) + x
    }
}

/// `SegformerStage`: overlapping patch embedding, layers, LayerNorm, and the
/// reshape back to `[B, C, H, W]`.
struct Stage {
    proj: Conv2d,
    patch_norm: LayerNorm,
    blocks: Vec<Layer>,
    layer_norm: LayerNorm,
}

/// The encoder.
pub struct SegformerModel {
    stages: Vec<Stage>,
}

impl SegformerModel {
    /// `p`: `segformer`.
    pub fn new(p: &mut ParamScope, c: &HfSegformerConfig) -> SegformerModel {
        let total: i64 = c.depths.iter().sum();
        // `config.drop_path_rate * i / max(sum(depths) - 1, 1)` in Python floats.
        let rates: Vec<f64> = (0..total)
            .map(|i| c.drop_path_rate * i as f64 / (total - 1).max(1) as f64)
            .collect();
        let mut sp = p.sub("stages");
        let mut stages = Vec::new();
        let mut start = 0usize;
        for (i, depth) in c.depths.iter().enumerate() {
            let mut stage = sp.sub(i);
            let dims = c.hidden_sizes[i];
            let in_channels = if i == 0 {
                c.num_channels
            } else {
                c.hidden_sizes[i - 1]
            };
            let mut pe = stage.sub("patch_embeddings");
            let proj = Conv2d::new(
                &mut pe.sub("proj"),
                ConvSpec::new(in_channels, dims, c.patch_sizes[i])
                    .stride(c.strides[i])
                    .padding(c.patch_sizes[i] / 2),
            );
            let patch_norm = LayerNorm::new(&mut pe.sub("layer_norm"), dims, 1e-5);
            let mut bp = stage.sub("blocks");
            let blocks = (0..*depth as usize)
                .map(|j| Layer::new(&mut bp.sub(j), c, i, rates[start + j]))
                .collect();
            let layer_norm = LayerNorm::new(&mut stage.sub("layer_norm"), dims, 1e-5);
            start += *depth as usize;
            stages.push(Stage {
                proj,
                patch_norm,
                blocks,
                layer_norm,
            });
        }
        SegformerModel { stages }
    }
}

impl Backbone for SegformerModel {
    /// Every stage's `[B, C_i, H_i, W_i]` (the `hidden_states` the decode
    /// head reads).
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut outs: Vec<Tensor> = Vec::new();
        for (i, stage) in self.stages.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("stage{}", i + 1));
            let input = outs.last().unwrap_or(x);
            let y = stage.proj.forward(input);
            let hw = (y.size()[2], y.size()[3]);
            let mut t = stage.patch_norm.forward(&y.flatten(2, -1).transpose(1, 2));
            drop(y);
            for block in &stage.blocks {
                t = block.forward(&t, hw, training);
            }
            let t = stage.layer_norm.forward(&t);
            let b = t.size()[0];
            let map = t
                .reshape([b, hw.0, hw.1, -1])
                .permute([0, 3, 1, 2])
                .contiguous();
            outs.push(map);
        }
        outs
    }
}

#[cfg(test)]
#[path = "hf_segformer_tests.rs"]
mod tests;
