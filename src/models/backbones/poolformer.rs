//! PoolFormer, as mmpretrain 1.2's `mmpretrain/models/backbones/poolformer.py`
//! builds it for MMSeg's `mmpretrain.PoolFormer` configs.
//!
//! Yu et al., "MetaFormer is Actually What You Need for Vision", CVPR 2022,
//! arXiv:2111.11418.
//!
//! A 7x7/4 patch embedding, then stages of blocks whose token mixer is an
//! average pool minus its input (`pool(x) - x`), each branch GroupNorm'd
//! first (one group), scaled per channel (`layer_scale_1/2`) and added
//! through DropPath; between stages a 3x3/2 patch embedding. The network is
//! one list (blocks and embeddings alternating: indices 0, 2, 4, 6 are the
//! stages), and each output index gets its own GroupNorm (`norm{i}`).
//! `frozen_stages >= 0` freezes the first patch embedding, as mmpretrain's
//! `_freeze_stages` does (its default 0 included).

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{Conv2d, ConvSpec, DropPath, GroupNorm};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmpretrain/models/backbones/poolformer.py";

/// The registry's constructor (`BACKBONES` row `mmpretrain.PoolFormer`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = PoolFormerConfig::from_cfg(cfg)?;
    Ok(Box::new(PoolFormer::new(p, &cfg)))
}

/// `PoolFormer.arch_settings`: layers, embed_dims, layer scale init.
const ARCHS: &[(&str, [i64; 4], [i64; 4])] = &[
    ("s12", [2, 2, 6, 2], [64, 128, 320, 512]),
    ("s24", [4, 4, 12, 4], [64, 128, 320, 512]),
    ("s36", [6, 6, 18, 6], [64, 128, 320, 512]),
    ("m36", [6, 6, 18, 6], [96, 192, 384, 768]),
    ("m48", [8, 8, 24, 8], [96, 192, 384, 768]),
];

/// The backbone's settings (`model.backbone` of the config).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolFormerConfig {
    pub layers: Vec<i64>,
    pub embed_dims: Vec<i64>,
    pub mlp_ratios: Vec<i64>,
    pub pool_size: i64,
    pub norm: NormCfg,
    pub in_patch: (i64, i64, i64),
    pub down_patch: (i64, i64, i64),
    pub drop_rate: f64,
    pub drop_path_rate: f64,
    pub out_indices: Vec<i64>,
    pub frozen_stages: i64,
}

impl PoolFormerConfig {
    pub fn from_cfg(cfg: &Dict) -> Result<PoolFormerConfig, ModelError> {
        let mut r = ComponentConfig::new(cfg, "PoolFormer", SOURCE);
        let (layers, embed_dims, mlp_ratios) = match r.value("arch") {
            None | Some(Value::Str(_)) => {
                let name = r.string("arch")?.unwrap_or("s12");
                let (_, l, d) = ARCHS.iter().find(|(n, _, _)| *n == name).ok_or_else(|| {
                    r.config_error(format!(
                        "unknown arch `{name}` (one of {})",
                        ARCHS.iter().map(|a| a.0).collect::<Vec<_>>().join(", ")
                    ))
                })?;
                (l.to_vec(), d.to_vec(), vec![4; 4])
            }
            Some(Value::Dict(arch)) => {
                let ints = |key: &str| {
                    arch.get(key)
                        .and_then(Value::as_seq)
                        .and_then(|s| s.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                };
                match (ints("layers"), ints("embed_dims")) {
                    (Some(l), Some(d)) if l.len() == d.len() => {
                        let ratios = ints("mlp_ratios").unwrap_or(vec![4; l.len()]);
                        (l, d, ratios)
                    }
                    _ => return Err(r.config_error(
                        "an arch dict needs `layers` and `embed_dims`, lists of the same length",
                    )),
                }
            }
            Some(_) => return Err(r.config_error("`arch` must be a name or a dict")),
        };
        let norm = match r.value("norm_cfg") {
            None => NormCfg::from_cfg_bn_or_gn(Some(&Value::Dict(
                [
                    ("type".to_string(), Value::Str("GN".into())),
                    ("num_groups".to_string(), Value::Int(1)),
                ]
                .into_iter()
                .collect(),
            )))?,
            v => NormCfg::from_cfg_bn_or_gn(v).map_err(|e| r.setting_error("norm_cfg", e))?,
        }
        .filter(|n| n.num_groups.is_some())
        .ok_or_else(|| r.unsupported("norm_cfg", "only a GN norm_cfg is implemented"))?;
        let triple = |r: &mut ComponentConfig, a: &str, b: &str, c: &str, d: (i64, i64, i64)| {
            Ok::<_, ModelError>((r.int(a, d.0)?, r.int(b, d.1)?, r.int(c, d.2)?))
        };
        let in_patch = triple(&mut r, "in_patch_size", "in_stride", "in_pad", (7, 4, 2))?;
        let down_patch = triple(
            &mut r,
            "down_patch_size",
            "down_stride",
            "down_pad",
            (3, 2, 1),
        )?;
        // The network list has 2 * stages - 1 entries (when the dims change).
        let entries = 2 * layers.len() as i64 - 1;
        let out_indices = match r.value("out_indices") {
            None => vec![-1],
            Some(Value::Int(i)) => vec![*i],
            Some(_) => r.ints("out_indices", &[])?,
        }
        .into_iter()
        // mmpretrain turns a negative index into 7 + index.
        .map(|i| if i < 0 { 7 + i } else { i })
        .collect::<Vec<_>>();
        if let Some(i) = out_indices.iter().find(|i| !(0..entries).contains(*i)) {
            return Err(r.config_error(format!("out_indices entry {i} is not in the network")));
        }
        let c = PoolFormerConfig {
            layers,
            embed_dims,
            mlp_ratios,
            pool_size: r.int("pool_size", 3)?,
            norm,
            in_patch,
            down_patch,
            drop_rate: r.float("drop_rate", 0.0)?,
            drop_path_rate: r.float("drop_path_rate", 0.0)?,
            out_indices,
            frozen_stages: r.int("frozen_stages", 0)?,
        };
        if c.frozen_stages > 0 {
            return Err(r.unsupported(
                "frozen_stages",
                "freezing stages past the patch embedding is not implemented (0 or -1)",
            ));
        }
        if c.embed_dims.windows(2).any(|w| w[0] == w[1]) {
            return Err(r.unsupported(
                "arch",
                "equal embed_dims of consecutive stages (no patch embedding between them) are not implemented",
            ));
        }
        r.default_activation("act_cfg", "GELU")?;
        r.inert(&["init_cfg"]);
        r.finish()?;
        Ok(c)
    }
}

/// mmpretrain's `PatchEmbed`: a conv (no norm).
struct PatchEmbed {
    proj: Conv2d,
}

impl PatchEmbed {
    fn new(p: &mut ParamScope, from: i64, to: i64, (k, s, pad): (i64, i64, i64)) -> PatchEmbed {
        PatchEmbed {
            proj: Conv2d::new(
                &mut p.sub("proj"),
                ConvSpec::new(from, to, k).stride(s).padding(pad),
            ),
        }
    }
}

/// `PoolFormerBlock`.
struct Block {
    layer_scale_1: Tensor,
    layer_scale_2: Tensor,
    norm1: GroupNorm,
    norm2: GroupNorm,
    fc1: Conv2d,
    fc2: Conv2d,
    pool_size: i64,
    drop: f64,
    drop_path: DropPath,
}

impl Block {
    fn new(
        p: &mut ParamScope,
        c: &PoolFormerConfig,
        dim: i64,
        ratio: i64,
        drop_path: f64,
    ) -> Block {
        // Its own parameters (the layer scales) come before its children's.
        let layer_scale_1 = p.param_ones("layer_scale_1", &[dim]);
        let layer_scale_2 = p.param_ones("layer_scale_2", &[dim]);
        let norm1 = GroupNorm::new(&mut p.sub("norm1"), dim, &c.norm);
        let norm2 = GroupNorm::new(&mut p.sub("norm2"), dim, &c.norm);
        let fc1 = Conv2d::new(
            &mut p.sub("mlp").sub("fc1"),
            ConvSpec::new(dim, dim * ratio, 1),
        );
        let fc2 = Conv2d::new(
            &mut p.sub("mlp").sub("fc2"),
            ConvSpec::new(dim * ratio, dim, 1),
        );
        Block {
            layer_scale_1,
            layer_scale_2,
            norm1,
            norm2,
            fc1,
            fc2,
            pool_size: c.pool_size,
            drop: c.drop_rate,
            drop_path: DropPath { prob: drop_path },
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let k = self.pool_size;
        let mixed = {
            let normed = self.norm1.forward(x);
            // Pooling: nn.AvgPool2d(k, 1, k // 2, count_include_pad=False)(x) - x.
            let pooled =
                normed.avg_pool2d([k, k], [1, 1], [k / 2, k / 2], false, false, None::<i64>);
            let mixed = &pooled - &normed;
            // The pool's output dies once subtracted (autograd keeps its input).
            drop(pooled);
            self.layer_scale_1.unsqueeze(-1).unsqueeze(-1) * mixed
        };
        let x = x + self.drop_path.forward(&mixed, training);
        drop(mixed);
        let fed = {
            let normed = self.norm2.forward(&x);
            let mut y = self.fc1.forward(&normed);
            y = y.gelu("none").dropout(self.drop, training);
            y = self.fc2.forward(&y).dropout(self.drop, training);
            self.layer_scale_2.unsqueeze(-1).unsqueeze(-1) * y
        };
        &x + self.drop_path.forward(&fed, training)
    }
}

enum Entry {
    Blocks(Vec<Block>),
    Embed(PatchEmbed),
}

pub struct PoolFormer {
    patch_embed: PatchEmbed,
    network: Vec<Entry>,
    /// `norm{i}` per output index of the network list.
    out_norms: Vec<(usize, GroupNorm)>,
}

impl PoolFormer {
    pub fn new(p: &mut ParamScope, c: &PoolFormerConfig) -> PoolFormer {
        let patch_embed =
            PatchEmbed::new(&mut p.sub("patch_embed"), 3, c.embed_dims[0], c.in_patch);
        if c.frozen_stages >= 0 {
            p.freeze_last(2);
        }
        let total: i64 = c.layers.iter().sum();
        let mut network = Vec::new();
        let mut first = 0i64;
        for (i, depth) in c.layers.iter().enumerate() {
            let index = network.len();
            let mut net = p.sub("network");
            let mut sp = net.sub(index);
            let blocks = (0..*depth)
                .map(|j| {
                    // basic_blocks: rate * (block index overall) / (blocks - 1).
                    let rate = if total > 1 {
                        c.drop_path_rate * (j + first) as f64 / (total - 1) as f64
                    } else {
                        0.0
                    };
                    Block::new(&mut sp.sub(j), c, c.embed_dims[i], c.mlp_ratios[i], rate)
                })
                .collect();
            first += depth;
            network.push(Entry::Blocks(blocks));
            if i + 1 < c.layers.len() {
                let index = network.len();
                let embed = PatchEmbed::new(
                    &mut p.sub("network").sub(index),
                    c.embed_dims[i],
                    c.embed_dims[i + 1],
                    c.down_patch,
                );
                network.push(Entry::Embed(embed));
            }
        }
        let out_norms = c
            .out_indices
            .iter()
            .map(|&i| {
                let dims = c.embed_dims[((i + 1) / 2) as usize];
                (
                    i as usize,
                    GroupNorm::new(&mut p.sub(format!("norm{i}")), dims, &c.norm),
                )
            })
            .collect();
        PoolFormer {
            patch_embed,
            network,
            out_norms,
        }
    }
}

impl Backbone for PoolFormer {
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut x = self.patch_embed.proj.forward(x);
        let mut outs = Vec::new();
        for (idx, entry) in self.network.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("network{idx}"));
            match entry {
                Entry::Blocks(blocks) => {
                    for block in blocks {
                        x = block.forward(&x, training);
                    }
                }
                Entry::Embed(embed) => x = embed.proj.forward(&x),
            }
            if let Some((_, norm)) = self.out_norms.iter().find(|(i, _)| *i == idx) {
                outs.push(norm.forward(&x));
            }
        }
        outs
    }
}

#[cfg(test)]
#[path = "poolformer_tests.rs"]
mod tests;
