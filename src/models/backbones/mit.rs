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

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{
    checkpoint_if, linspace_drop_path_rates, nchw_to_nlc, nlc_to_nchw, Conv2d, ConvSpec, DropPath,
    LayerNorm, MultiheadAttention,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/mit.py";

/// The registry's constructor (`BACKBONES` row `MixVisionTransformer`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = MitConfig::from_cfg(cfg)?;
    Ok(Box::new(MixVisionTransformer::new(p, &cfg)))
}

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
    pub drop_path_rate: f64,
    pub norm_eps: f64,
    /// Gradient checkpointing of each transformer layer (`with_cp`).
    pub with_cp: bool,
}

impl MitConfig {
    pub fn from_cfg(cfg: &Dict) -> Result<MitConfig, ModelError> {
        let mut r = ComponentConfig::new(cfg, "MixVisionTransformer", SOURCE);
        let num_stages = r.int("num_stages", 4)? as usize;
        let c = MitConfig {
            in_channels: r.int("in_channels", 3)?,
            embed_dims: r.int("embed_dims", 64)?,
            num_layers: r.ints("num_layers", &[3, 4, 6, 3])?,
            num_heads: r.ints("num_heads", &[1, 2, 4, 8])?,
            patch_sizes: r.ints("patch_sizes", &[7, 3, 3, 3])?,
            strides: r.ints("strides", &[4, 2, 2, 2])?,
            sr_ratios: r.ints("sr_ratios", &[8, 4, 2, 1])?,
            out_indices: r.ints("out_indices", &[0, 1, 2, 3])?,
            mlp_ratio: r.int("mlp_ratio", 4)?,
            qkv_bias: r.flag("qkv_bias", true),
            drop_rate: r.float("drop_rate", 0.0)?,
            drop_path_rate: r.float("drop_path_rate", 0.0)?,
            norm_eps: match r.value("norm_cfg") {
                None => 1e-6,
                Some(Value::Dict(n)) if n.get("type").and_then(Value::as_str) == Some("LN") => {
                    // build_norm_layer gives nn.LayerNorm's own default eps.
                    n.get("eps").and_then(Value::as_f64).unwrap_or(1e-5)
                }
                Some(_) => {
                    return Err(r.unsupported("norm_cfg", "only dict(type='LN') is implemented"))
                }
            },
            with_cp: r.flag("with_cp", false),
        };
        // The attention-weight dropout of nn.MultiheadAttention is not reproduced.
        r.unimplemented("attn_drop_rate", &Value::Float(0.0))?;
        r.default_activation("act_cfg", "GELU")?;
        r.inert(&["pretrained", "init_cfg"]);
        r.finish()?;
        let lens = [
            c.num_layers.len(),
            c.num_heads.len(),
            c.patch_sizes.len(),
            c.strides.len(),
            c.sr_ratios.len(),
        ];
        if lens.iter().any(|l| *l != num_stages) {
            return Err(ModelError::config("MixVisionTransformer", format!(
                "num_layers, num_heads, patch_sizes, strides and sr_ratios must all have num_stages={num_stages} items"
            )));
        }
        if c.out_indices
            .iter()
            .any(|i| *i < 0 || *i >= num_stages as i64)
        {
            return Err(ModelError::config(
                "MixVisionTransformer",
                format!("out_indices must be stage numbers below num_stages={num_stages}"),
            ));
        }
        Ok(c)
    }
}

/// mmseg's `PatchEmbed` with an overlapping `kernel_size // 2` padding.
struct PatchEmbed {
    projection: Conv2d,
    norm: LayerNorm,
}

impl PatchEmbed {
    /// `p`: `layers.<i>.0`.
    fn new(p: &mut ParamScope, c: &MitConfig, stage: usize, in_channels: i64) -> PatchEmbed {
        let dims = c.embed_dims * c.num_heads[stage];
        let projection = Conv2d::new(
            &mut p.sub("projection"),
            ConvSpec::new(in_channels, dims, c.patch_sizes[stage])
                .stride(c.strides[stage])
                .padding(c.patch_sizes[stage] / 2),
        );
        let norm = LayerNorm::new(&mut p.sub("norm"), dims, c.norm_eps);
        PatchEmbed { projection, norm }
    }
}

/// `EfficientMultiheadAttention`: `nn.MultiheadAttention` over keys/values
/// reduced by a strided conv when `sr_ratio > 1`.
struct EfficientAttention {
    attn: MultiheadAttention,
    sr: Option<(Conv2d, LayerNorm)>,
    drop_path: DropPath,
    proj_drop: f64,
}

impl EfficientAttention {
    /// `p`: `layers.<i>.1.<j>.attn`.
    fn new(p: &mut ParamScope, c: &MitConfig, stage: usize, drop_path: f64) -> EfficientAttention {
        let dims = c.embed_dims * c.num_heads[stage];
        let sr_ratio = c.sr_ratios[stage];
        let attn =
            MultiheadAttention::new(&mut p.sub("attn"), dims, c.num_heads[stage], c.qkv_bias);
        let sr = (sr_ratio > 1).then(|| {
            let conv = Conv2d::new(
                &mut p.sub("sr"),
                ConvSpec::new(dims, dims, sr_ratio).stride(sr_ratio),
            );
            (conv, LayerNorm::new(&mut p.sub("norm"), dims, c.norm_eps))
        });
        EfficientAttention {
            attn,
            sr,
            drop_path: DropPath { prob: drop_path },
            proj_drop: c.drop_rate,
        }
    }

    /// `x`, `identity`: `[B, N, C]` with `N = H * W`; returns `[B, N, C]`.
    fn forward(&self, x: &Tensor, hw: (i64, i64), identity: &Tensor, training: bool) -> Tensor {
        let x_kv = match &self.sr {
            // [B, N / sr_ratio^2, C]
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

/// `MixFFN`: 1x1 conv, 3x3 depthwise conv, GELU, 1x1 conv (`ffn.layers.0`,
/// `.1`, `.4`; 2 is the activation, 3 and 5 are dropouts).
struct MixFfn {
    fc1: Conv2d,
    pe_conv: Conv2d,
    fc2: Conv2d,
    drop: f64,
    drop_path: DropPath,
}

impl MixFfn {
    /// `p`: `layers.<i>.1.<j>.ffn`.
    fn new(p: &mut ParamScope, c: &MitConfig, stage: usize, drop_path: f64) -> MixFfn {
        let dims = c.embed_dims * c.num_heads[stage];
        let hidden = c.mlp_ratio * dims;
        let mut lp = p.sub("layers");
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
            drop_path: DropPath { prob: drop_path },
        }
    }

    /// `x`, `identity`: `[B, N, C]`; returns `[B, N, C]`.
    fn forward(&self, x: &Tensor, hw: (i64, i64), identity: &Tensor, training: bool) -> Tensor {
        let out = self.fc1.forward(&nlc_to_nchw(x, hw)); // [B, hidden, H, W]
        let out = self
            .pe_conv
            .forward(&out)
            .gelu("none")
            .dropout(self.drop, training);
        let out = self.fc2.forward(&out).dropout(self.drop, training); // [B, C, H, W]
        identity + self.drop_path.forward(&nchw_to_nlc(&out), training)
    }
}

/// `TransformerEncoderLayer`.
struct Block {
    norm1: LayerNorm,
    attn: EfficientAttention,
    norm2: LayerNorm,
    ffn: MixFfn,
    with_cp: bool,
}

impl Block {
    /// `p`: `layers.<i>.1.<j>`.
    fn new(p: &mut ParamScope, c: &MitConfig, stage: usize, drop_path: f64) -> Block {
        let dims = c.embed_dims * c.num_heads[stage];
        let norm1 = LayerNorm::new(&mut p.sub("norm1"), dims, c.norm_eps);
        let attn = EfficientAttention::new(&mut p.sub("attn"), c, stage, drop_path);
        let norm2 = LayerNorm::new(&mut p.sub("norm2"), dims, c.norm_eps);
        let ffn = MixFfn::new(&mut p.sub("ffn"), c, stage, drop_path);
        Block {
            norm1,
            attn,
            norm2,
            ffn,
            with_cp: c.with_cp,
        }
    }

    /// `TransformerEncoderLayer.forward`, through [`checkpoint`] under
    /// `with_cp` when the input requires grad.
    fn forward(&self, x: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        // SAFETY: the block borrows this module, which outlives the step's graph
        // (a trial keeps its model for all its steps).
        unsafe {
            checkpoint_if(self.with_cp, x, move |x: &Tensor| {
                self.inner_forward(x, hw, training)
            })
        }
    }

    fn inner_forward(&self, x: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        let attended = self.attn.forward(&self.norm1.forward(x), hw, x, training);
        self.ffn
            .forward(&self.norm2.forward(&attended), hw, &attended, training)
    }
}

/// `layers.<i>`: `ModuleList([patch_embed, blocks, norm])`.
struct Stage {
    patch_embed: PatchEmbed,
    blocks: Vec<Block>,
    norm: LayerNorm,
}

impl Stage {
    /// `p`: `layers.<i>`; `drop_paths`: the rates of this stage's blocks.
    fn new(
        p: &mut ParamScope,
        c: &MitConfig,
        stage: usize,
        in_channels: i64,
        drop_paths: &[f64],
    ) -> Stage {
        let dims = c.embed_dims * c.num_heads[stage];
        let patch_embed = PatchEmbed::new(&mut p.sub(0), c, stage, in_channels);
        let blocks = drop_paths
            .iter()
            .enumerate()
            .map(|(j, rate)| Block::new(&mut p.sub(1).sub(j), c, stage, *rate))
            .collect();
        let norm = LayerNorm::new(&mut p.sub(2), dims, c.norm_eps);
        Stage {
            patch_embed,
            blocks,
            norm,
        }
    }
}

/// The MiT encoder.
pub struct MixVisionTransformer {
    stages: Vec<Stage>,
    out_indices: Vec<i64>,
}

impl MixVisionTransformer {
    pub fn new(p: &mut ParamScope, c: &MitConfig) -> MixVisionTransformer {
        let total: i64 = c.num_layers.iter().sum();
        let dpr = linspace_drop_path_rates(c.drop_path_rate, total as usize);
        let mut layers = p.sub("layers");
        let mut stages = Vec::new();
        let mut in_channels = c.in_channels;
        let mut cur = 0usize;
        for (i, num_layer) in c.num_layers.iter().enumerate() {
            let num_layer = *num_layer as usize;
            let drop_paths = &dpr[cur..cur + num_layer];
            stages.push(Stage::new(
                &mut layers.sub(i),
                c,
                i,
                in_channels,
                drop_paths,
            ));
            in_channels = c.embed_dims * c.num_heads[i];
            cur += num_layer;
        }
        MixVisionTransformer {
            stages,
            out_indices: c.out_indices.clone(),
        }
    }
}

impl Backbone for MixVisionTransformer {
    /// One `[B, embed_dims * num_heads[i], H / 4 / 2^i, W / 4 / 2^i]` map per
    /// output stage (with the default strides).
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut outs = Vec::new();
        let mut x = x.shallow_clone(); // [B, C_in, H, W]
        for (i, stage) in self.stages.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("stage{}", i + 1));
            let y = stage.patch_embed.projection.forward(&x); // [B, C, h, w]
            let hw = (y.size()[2], y.size()[3]);
            let mut t = stage
                .patch_embed
                .norm
                .forward(&y.flatten(2, -1).transpose(1, 2)); // [B, h*w, C]
            drop(y);
            for block in &stage.blocks {
                t = block.forward(&t, hw, training);
            }
            x = nlc_to_nchw(&stage.norm.forward(&t), hw); // [B, C, h, w]
            if self.out_indices.contains(&(i as i64)) {
                outs.push(x.shallow_clone());
            }
        }
        outs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use crate::models::params::ParamStore;
    use serde_json::json;

    /// `model.backbone` of the SegFormer-B0 configs.
    fn b0() -> Dict {
        dict(json!({
            "type": "MixVisionTransformer",
            "in_channels": 3,
            "embed_dims": 32,
            "num_stages": 4,
            "num_layers": [2, 2, 2, 2],
            "num_heads": [1, 2, 5, 8],
            "patch_sizes": [7, 3, 3, 3],
            "sr_ratios": [8, 4, 2, 1],
            "out_indices": [0, 1, 2, 3],
            "mlp_ratio": 4,
            "qkv_bias": true,
            "drop_rate": 0.0,
            "attn_drop_rate": 0.0,
            "drop_path_rate": 0.1,
            "init_cfg": {"type": "Pretrained", "checkpoint": "mit_b0.pth"},
        }))
    }

    #[test]
    fn mit_b0_has_mmsegs_parameter_count_and_names() {
        let mut store = ParamStore::new(tch::Device::Cpu);
        build(&mut store.scope("backbone"), &b0()).unwrap();
        // params_all.json, segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py:
        // by_prefix.backbone.total
        assert_eq!(store.total(), 3_319_392);
        assert_eq!(store.trainable(), 3_319_392);
        let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names[0], "backbone.layers.0.0.projection.weight");
        assert!(names.contains(&"backbone.layers.0.1.1.attn.sr.weight"));
        assert!(names.contains(&"backbone.layers.3.1.1.ffn.layers.4.bias"));
        assert_eq!(*names.last().unwrap(), "backbone.layers.3.2.bias");
    }

    #[test]
    fn settings_segtune_does_not_implement_are_refused_by_name() {
        for (key, value) in [
            ("attn_drop_rate", json!(0.1)),
            ("act_cfg", json!({"type": "ReLU"})),
            ("frozen_stages", json!(1)),
        ] {
            let mut cfg = b0();
            cfg.insert(
                key.into(),
                crate::models::component_config::test_support::to_value(&value),
            );
            let err = MitConfig::from_cfg(&cfg).unwrap_err();
            assert!(
                matches!(&err, ModelError::Unsupported { setting, source, .. } if setting == key && source.as_deref() == Some(SOURCE)),
                "{key}: {err}"
            );
        }
    }
}
