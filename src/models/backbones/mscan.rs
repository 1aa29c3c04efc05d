//! `MSCAN`, SegNeXt's backbone, as MMSeg's `mmseg/models/backbones/mscan.py`
//! builds it.
//!
//! Guo et al., "SegNeXt: Rethinking Convolutional Attention Design for
//! Semantic Segmentation", NeurIPS 2022, arXiv:2209.08575.
//!
//! Four stages: a patch embedding (`StemConv`, two stride-2 3x3 convs with
//! BN and a GELU between, for the first; an `OverlapPatchEmbed`, a stride-2
//! 3x3 conv and BN, for the others), `MSCABlock`s and a LayerNorm over the
//! channels. A block adds to its input, each scaled per channel by a
//! layer scale and through drop path, the multi-scale convolutional
//! attention of its BN'd input (1x1 conv, GELU, a depthwise 5x5 conv and
//! three strip-conv branches summed, a 1x1 conv, times the input; a 1x1
//! conv; plus a copy of the input) and an MLP (1x1 conv, depthwise 3x3
//! conv, GELU, dropout, 1x1 conv, dropout) of its BN'd sum. MMSeg's
//! `x.clone()` copies (the attention's shortcut and `u`) are kept: they
//! hold memory as in PyTorch. Every stage's output is returned.

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::{
    count_flops, dropout, linspace_drop_path_rates, BatchNorm2d, Conv2d, ConvSpec, DropPath,
    LayerNorm,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/mscan.py";

/// The registry's constructor (`BACKBONES` row `MSCAN`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = MscanCfg::from_cfg(cfg)?;
    Ok(Box::new(Mscan::new(p, &cfg)))
}

/// `MSCAN(in_channels=3, embed_dims=[64, 128, 256, 512], mlp_ratios=[4, 4,
/// 4, 4], drop_rate=0., drop_path_rate=0., depths=[3, 4, 6, 3],
/// num_stages=4, attention_kernel_sizes=[5, [1, 7], [1, 11], [1, 21]],
/// attention_kernel_paddings=[2, [0, 3], [0, 5], [0, 10]],
/// act_cfg=dict(type='GELU'), norm_cfg=dict(type='SyncBN',
/// requires_grad=True))`.
#[derive(Debug, Clone, PartialEq)]
pub struct MscanCfg {
    pub embed_dims: Vec<i64>,
    pub mlp_ratios: Vec<f64>,
    pub drop_rate: f64,
    pub drop_path_rate: f64,
    pub depths: Vec<i64>,
    pub num_stages: usize,
    /// `(kh, kw)` of `conv0` and of the three branches' first convs.
    pub kernel_sizes: Vec<(i64, i64)>,
    pub paddings: Vec<(i64, i64)>,
    pub norm: NormCfg,
}

impl MscanCfg {
    pub fn from_cfg(d: &Dict) -> Result<MscanCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "MSCAN", SOURCE);
        let embed_dims = c.ints("embed_dims", &[64, 128, 256, 512])?;
        let mlp_ratios = c.floats("mlp_ratios")?.unwrap_or(vec![4.0; 4]);
        let drop_rate = c.float("drop_rate", 0.0)?;
        let drop_path_rate = c.float("drop_path_rate", 0.0)?;
        let depths = c.ints("depths", &[3, 4, 6, 3])?;
        let num_stages = c.int("num_stages", 4)?;
        let kernel_sizes = pairs(&mut c, "attention_kernel_sizes", &[5, 1, 7, 1, 11, 1, 21])?;
        let paddings = pairs(&mut c, "attention_kernel_paddings", &[2, 0, 3, 0, 5, 0, 10])?;
        c.default_activation("act_cfg", "GELU")?;
        let norm = match c.value("norm_cfg") {
            None => NormCfg::BN_DEFAULT,
            Some(_) => c
                .batch_norm("norm_cfg")?
                .ok_or_else(|| c.unsupported("norm_cfg", "None (build_norm_layer needs a dict)"))?,
        };
        // `in_channels` only reaches an `OverlapPatchEmbed` of stage 0,
        // which MMSeg never builds (StemConv takes 3 channels).
        c.inert(&["pretrained", "init_cfg", "in_channels"]);
        let n = num_stages as usize;
        if num_stages < 1
            || [embed_dims.len(), mlp_ratios.len(), depths.len()]
                .iter()
                .any(|&l| l < n)
        {
            return Err(c.config_error(
                "embed_dims, mlp_ratios and depths need an entry per stage (num_stages)",
            ));
        }
        if kernel_sizes.len() != 4 || paddings.len() != 4 {
            // MSCAAttention.forward uses conv0 and exactly three branches.
            return Err(c.config_error(
                "attention_kernel_sizes and attention_kernel_paddings need 4 entries \
                 (MSCAAttention.forward uses conv0_1 .. conv2_2)",
            ));
        }
        c.finish()?;
        Ok(MscanCfg {
            embed_dims,
            mlp_ratios,
            drop_rate,
            drop_path_rate,
            depths,
            num_stages: n,
            kernel_sizes,
            paddings,
            norm,
        })
    }
}

/// A list whose first entry is an int or a pair and the others pairs
/// (`kernel_size[::-1]` needs a sequence), as `(h, w)`.
fn pairs(
    c: &mut ComponentConfig,
    key: &str,
    default: &[i64; 7],
) -> Result<Vec<(i64, i64)>, ModelError> {
    let Some(v) = c.value(key) else {
        let d = default;
        return Ok(vec![(d[0], d[0]), (d[1], d[2]), (d[3], d[4]), (d[5], d[6])]);
    };
    let bad = || c.config_error(format!("`{key}` must be [int or [h, w], [h, w], ...]"));
    let items = v.as_seq().ok_or_else(bad)?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match (item, item.as_seq()) {
            (Value::Int(k), _) if i == 0 => Ok((*k, *k)),
            (_, Some([a, b])) => match (a.as_i64(), b.as_i64()) {
                (Some(a), Some(b)) => Ok((a, b)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        })
        .collect()
}

/// A depthwise `nn.Conv2d(channels, channels, (kh, kw), padding=(ph, pw),
/// groups=channels)` with bias.
struct DwConv {
    weight: Tensor,
    bias: Tensor,
    padding: (i64, i64),
}

impl DwConv {
    fn new(p: &mut ParamScope, channels: i64, kernel: (i64, i64), padding: (i64, i64)) -> DwConv {
        let std = (2.0 / (kernel.0 * kernel.1) as f64).sqrt();
        DwConv {
            weight: p.param_normal("weight", &[channels, 1, kernel.0, kernel.1], std),
            bias: p.param_zeros("bias", &[channels]),
            padding,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let y = x.conv2d(
            &self.weight,
            Some(&self.bias),
            [1, 1],
            [self.padding.0, self.padding.1],
            [1, 1],
            x.size()[1],
        );
        count_flops(2.0 * (self.weight.numel() * y.numel() / y.size()[1] as usize) as f64);
        y
    }
}

/// `MSCAAttention`: `conv0`, `conv{i}_1` / `conv{i}_2` (the kernel and
/// padding reversed) for three branches, `conv3`.
struct MscaAttention {
    conv0: DwConv,
    branches: Vec<(DwConv, DwConv)>,
    conv3: Conv2d,
}

impl MscaAttention {
    fn new(p: &mut ParamScope, channels: i64, cfg: &MscanCfg) -> MscaAttention {
        let (k, pad) = (&cfg.kernel_sizes, &cfg.paddings);
        let conv0 = DwConv::new(&mut p.sub("conv0"), channels, k[0], pad[0]);
        let branches = (1..4)
            .map(|i| {
                let flip = |(a, b): (i64, i64)| (b, a);
                let first = DwConv::new(
                    &mut p.sub(format!("conv{}_1", i - 1)),
                    channels,
                    k[i],
                    pad[i],
                );
                let second = DwConv::new(
                    &mut p.sub(format!("conv{}_2", i - 1)),
                    channels,
                    flip(k[i]),
                    flip(pad[i]),
                );
                (first, second)
            })
            .collect();
        let conv3 = Conv2d::new(&mut p.sub("conv3"), ConvSpec::new(channels, channels, 1));
        MscaAttention {
            conv0,
            branches,
            conv3,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let u = x.copy(); // x.clone()
        let attn = self.conv0.forward(x);
        // attn_0, attn_1, attn_2: alive (as Python locals) until the return.
        let outs: Vec<Tensor> = self
            .branches
            .iter()
            .map(|(first, second)| second.forward(&first.forward(&attn)))
            .collect();
        let attn = &attn + &outs[0] + &outs[1] + &outs[2];
        let attn = self.conv3.forward(&attn);
        attn * &u
    }
}

/// `MSCASpatialAttention`: `proj_1`, GELU, `spatial_gating_unit`,
/// `proj_2`, plus a copy of the input.
struct SpatialAttention {
    proj_1: Conv2d,
    gate: MscaAttention,
    proj_2: Conv2d,
}

impl SpatialAttention {
    fn new(p: &mut ParamScope, channels: i64, cfg: &MscanCfg) -> SpatialAttention {
        let spec = ConvSpec::new(channels, channels, 1);
        SpatialAttention {
            proj_1: Conv2d::new(&mut p.sub("proj_1"), spec),
            gate: MscaAttention::new(&mut p.sub("spatial_gating_unit"), channels, cfg),
            proj_2: Conv2d::new(&mut p.sub("proj_2"), spec),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let shortcut = x.copy(); // x.clone()
        let x = self.proj_1.forward(x).gelu("none");
        let x = self.gate.forward(&x);
        let x = self.proj_2.forward(&x);
        x + shortcut
    }
}

/// `Mlp`: `fc1`, `dwconv` (3x3 depthwise), GELU, dropout, `fc2`, dropout.
struct Mlp {
    fc1: Conv2d,
    dwconv: Conv2d,
    fc2: Conv2d,
    drop: f64,
}

impl Mlp {
    fn new(p: &mut ParamScope, channels: i64, hidden: i64, drop: f64) -> Mlp {
        Mlp {
            fc1: Conv2d::new(&mut p.sub("fc1"), ConvSpec::new(channels, hidden, 1)),
            dwconv: Conv2d::new(
                &mut p.sub("dwconv"),
                ConvSpec::new(hidden, hidden, 3).padding(1).groups(hidden),
            ),
            fc2: Conv2d::new(&mut p.sub("fc2"), ConvSpec::new(hidden, channels, 1)),
            drop,
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let x = self.fc1.forward(x);
        let x = self.dwconv.forward(&x).gelu("none");
        let x = dropout(&x, self.drop, training);
        let x = self.fc2.forward(&x);
        dropout(&x, self.drop, training)
    }
}

/// `MSCABlock`: its own parameters (`layer_scale_1`, `layer_scale_2`)
/// first, as `named_parameters` lists them, then `norm1`, `attn`, `norm2`,
/// `mlp`.
struct Block {
    layer_scale_1: Tensor,
    layer_scale_2: Tensor,
    norm1: BatchNorm2d,
    attn: SpatialAttention,
    norm2: BatchNorm2d,
    mlp: Mlp,
    drop_path: DropPath,
}

impl Block {
    fn new(p: &mut ParamScope, channels: i64, i: usize, drop_path: f64, cfg: &MscanCfg) -> Block {
        // `1e-2 * torch.ones(channels)`.
        let scale = |p: &mut ParamScope, name: &str| {
            let t = p.param_ones(name, &[channels]);
            tch::no_grad(|| {
                let _ = t.shallow_clone().g_mul_scalar_(1e-2);
            });
            t
        };
        let layer_scale_1 = scale(p, "layer_scale_1");
        let layer_scale_2 = scale(p, "layer_scale_2");
        let hidden = (channels as f64 * cfg.mlp_ratios[i]) as i64;
        Block {
            layer_scale_1,
            layer_scale_2,
            norm1: BatchNorm2d::from_cfg(&mut p.sub("norm1"), channels, &cfg.norm),
            attn: SpatialAttention::new(&mut p.sub("attn"), channels, cfg),
            norm2: BatchNorm2d::from_cfg(&mut p.sub("norm2"), channels, &cfg.norm),
            mlp: Mlp::new(&mut p.sub("mlp"), channels, hidden, cfg.drop_rate),
            drop_path: DropPath { prob: drop_path },
        }
    }

    /// On the `[B, C, H, W]` map (MMSeg's `[B, N, C]` views of it cost
    /// nothing).
    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let branch = {
            let attn = self.attn.forward(&self.norm1.forward(x, training));
            let scaled = self.layer_scale_1.unsqueeze(-1).unsqueeze(-1) * attn;
            self.drop_path.forward(&scaled, training)
        };
        let x = x + branch;
        let branch = {
            let mlp = self
                .mlp
                .forward(&self.norm2.forward(&x, training), training);
            let scaled = self.layer_scale_2.unsqueeze(-1).unsqueeze(-1) * mlp;
            self.drop_path.forward(&scaled, training)
        };
        &x + branch
    }
}

/// `StemConv` (`proj.0`, `proj.1`, GELU, `proj.3`, `proj.4`) or
/// `OverlapPatchEmbed` (`proj`, `norm`).
enum PatchEmbed {
    Stem([Conv2d; 2], [BatchNorm2d; 2]),
    Overlap(Conv2d, BatchNorm2d),
}

impl PatchEmbed {
    fn new(p: &mut ParamScope, i: usize, cfg: &MscanCfg) -> PatchEmbed {
        let out = cfg.embed_dims[i];
        if i == 0 {
            let mut proj = p.sub("proj");
            let conv0 = Conv2d::new(
                &mut proj.sub(0),
                ConvSpec::new(3, out / 2, 3).stride(2).padding(1),
            );
            let bn1 = BatchNorm2d::from_cfg(&mut proj.sub(1), out / 2, &cfg.norm);
            let conv3 = Conv2d::new(
                &mut proj.sub(3),
                ConvSpec::new(out / 2, out, 3).stride(2).padding(1),
            );
            let bn4 = BatchNorm2d::from_cfg(&mut proj.sub(4), out, &cfg.norm);
            PatchEmbed::Stem([conv0, conv3], [bn1, bn4])
        } else {
            let spec = ConvSpec::new(cfg.embed_dims[i - 1], out, 3)
                .stride(2)
                .padding(1);
            let proj = Conv2d::new(&mut p.sub("proj"), spec);
            PatchEmbed::Overlap(
                proj,
                BatchNorm2d::from_cfg(&mut p.sub("norm"), out, &cfg.norm),
            )
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        match self {
            PatchEmbed::Stem([conv0, conv3], [bn1, bn4]) => {
                // nn.Sequential: each intermediate dies once the next exists.
                let x = bn1.forward(&conv0.forward(x), training).gelu("none");
                bn4.forward(&conv3.forward(&x), training)
            }
            PatchEmbed::Overlap(proj, norm) => norm.forward(&proj.forward(x), training),
        }
    }
}

struct Stage {
    patch_embed: PatchEmbed,
    blocks: Vec<Block>,
    norm: LayerNorm,
}

pub struct Mscan {
    stages: Vec<Stage>,
}

impl Mscan {
    pub fn new(p: &mut ParamScope, cfg: &MscanCfg) -> Mscan {
        let depths = &cfg.depths[..cfg.num_stages];
        let total: i64 = depths.iter().sum();
        let dpr = linspace_drop_path_rates(cfg.drop_path_rate, total as usize);
        let mut cur = 0;
        let stages = (0..cfg.num_stages)
            .map(|i| {
                let dims = cfg.embed_dims[i];
                let patch_embed =
                    PatchEmbed::new(&mut p.sub(format!("patch_embed{}", i + 1)), i, cfg);
                let mut bp = p.sub(format!("block{}", i + 1));
                let blocks = (0..depths[i] as usize)
                    .map(|j| Block::new(&mut bp.sub(j), dims, i, dpr[cur + j], cfg))
                    .collect();
                cur += depths[i] as usize;
                let norm = LayerNorm::new(&mut p.sub(format!("norm{}", i + 1)), dims, 1e-5);
                Stage {
                    patch_embed,
                    blocks,
                    norm,
                }
            })
            .collect();
        Mscan { stages }
    }
}

impl Backbone for Mscan {
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut outs: Vec<Tensor> = Vec::new();
        for (i, stage) in self.stages.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("stage{}", i + 1));
            let input = outs.last().unwrap_or(x);
            let mut y = stage.patch_embed.forward(input, training); // [B, C, H, W]
            let s = y.size();
            let (b, c, h, w) = (s[0], s[1], s[2], s[3]);
            for block in &stage.blocks {
                y = block.forward(&y, training);
            }
            // norm(x) on the [B, N, C] view, then
            // x.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous().
            let tokens = y.view([b, c, h * w]).permute([0, 2, 1]);
            drop(y);
            let normed = stage.norm.forward(&tokens);
            drop(tokens);
            outs.push(
                normed
                    .reshape([b, h, w, c])
                    .permute([0, 3, 1, 2])
                    .contiguous(),
            );
        }
        outs
    }
}

#[cfg(test)]
#[path = "mscan_tests.rs"]
mod tests;
