//! ConvNeXt, as mmpretrain 1.2's `mmpretrain/models/backbones/convnext.py`
//! builds it for MMSeg's `mmpretrain.ConvNeXt` configs.
//!
//! Liu et al., "A ConvNet for the 2020s", CVPR 2022, arXiv:2201.03545.
//!
//! A 4x4/4 patchify stem and 2x2/2 downsampling convs, each with a
//! channels-first LayerNorm (`LayerNorm2d`: permute, `layer_norm`, permute
//! back and copy); blocks of a 7x7 depthwise conv, a channels-last
//! LayerNorm, a 4x inverted bottleneck of two linear layers with GELU, a
//! learned layer scale (`gamma`) and DropPath; a LayerNorm2d per output
//! stage (`norm{i}`).

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{
    checkpoint_if, linspace_drop_path_rates, Conv2d, ConvSpec, DropPath, LayerNorm, Linear,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmpretrain/models/backbones/convnext.py";

/// The registry's constructor (`BACKBONES` row `mmpretrain.ConvNeXt`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = ConvNextConfig::from_cfg(cfg)?;
    Ok(Box::new(ConvNext::new(p, &cfg)))
}

/// `ConvNeXt.arch_settings`: depths and channels per named arch.
const ARCHS: &[(&str, [i64; 4], [i64; 4])] = &[
    ("atto", [2, 2, 6, 2], [40, 80, 160, 320]),
    ("femto", [2, 2, 6, 2], [48, 96, 192, 384]),
    ("pico", [2, 2, 6, 2], [64, 128, 256, 512]),
    ("nano", [2, 2, 8, 2], [80, 160, 320, 640]),
    ("tiny", [3, 3, 9, 3], [96, 192, 384, 768]),
    ("small", [3, 3, 27, 3], [96, 192, 384, 768]),
    ("base", [3, 3, 27, 3], [128, 256, 512, 1024]),
    ("large", [3, 3, 27, 3], [192, 384, 768, 1536]),
    ("xlarge", [3, 3, 27, 3], [256, 512, 1024, 2048]),
    ("huge", [3, 3, 27, 3], [352, 704, 1408, 2816]),
];

/// The backbone's settings (`model.backbone` of the config).
#[derive(Debug, Clone, PartialEq)]
pub struct ConvNextConfig {
    pub depths: Vec<i64>,
    pub channels: Vec<i64>,
    pub in_channels: i64,
    pub stem_patch_size: i64,
    pub norm_eps: f64,
    pub drop_path_rate: f64,
    /// `None` for `layer_scale_init_value <= 0` (no `gamma`).
    pub layer_scale: Option<f64>,
    pub out_indices: Vec<i64>,
    pub gap_before_final_norm: bool,
    pub with_cp: bool,
}

impl ConvNextConfig {
    pub fn from_cfg(cfg: &Dict) -> Result<ConvNextConfig, ModelError> {
        let mut r = ComponentConfig::new(cfg, "ConvNeXt", SOURCE);
        let (depths, channels) =
            match r.value("arch") {
                None => (vec![3, 3, 9, 3], vec![96, 192, 384, 768]),
                Some(Value::Str(name)) => {
                    let (_, d, c) = ARCHS.iter().find(|(n, _, _)| n == name).ok_or_else(|| {
                        r.config_error(format!(
                            "unknown arch `{name}` (one of {})",
                            ARCHS.iter().map(|a| a.0).collect::<Vec<_>>().join(", ")
                        ))
                    })?;
                    (d.to_vec(), c.to_vec())
                }
                Some(Value::Dict(arch)) => {
                    let ints = |key: &str| {
                        arch.get(key)
                            .and_then(Value::as_seq)
                            .and_then(|s| s.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                    };
                    match (ints("depths"), ints("channels")) {
                        (Some(d), Some(c)) if d.len() == c.len() => (d, c),
                        _ => return Err(r.config_error(
                            "an arch dict needs `depths` and `channels`, lists of the same length",
                        )),
                    }
                }
                Some(_) => return Err(r.config_error("`arch` must be a name or a dict")),
            };
        let stages = depths.len() as i64;
        let out_indices = match r.value("out_indices") {
            None => vec![-1],
            Some(Value::Int(i)) => vec![*i],
            Some(_) => r.ints("out_indices", &[])?,
        }
        .into_iter()
        // mmpretrain turns a negative index into 4 + index.
        .map(|i| if i < 0 { 4 + i } else { i })
        .collect::<Vec<_>>();
        if let Some(i) = out_indices.iter().find(|i| !(0..stages).contains(*i)) {
            return Err(r.config_error(format!("out_indices entry {i} is not a stage")));
        }
        let norm_eps = match r.value("norm_cfg") {
            None => 1e-6,
            Some(Value::Dict(d))
                if d.get("type").and_then(Value::as_str) == Some("LN2d")
                    && d.keys().all(|k| k == "type" || k == "eps") =>
            {
                d.get("eps").and_then(Value::as_f64).unwrap_or(1e-5)
            }
            Some(_) => {
                return Err(
                    r.unsupported("norm_cfg", "only dict(type='LN2d', eps=...) is implemented")
                )
            }
        };
        let layer_scale = r.float("layer_scale_init_value", 1e-6)?;
        let c = ConvNextConfig {
            depths,
            channels,
            in_channels: r.int("in_channels", 3)?,
            stem_patch_size: r.int("stem_patch_size", 4)?,
            norm_eps,
            drop_path_rate: r.float("drop_path_rate", 0.0)?,
            layer_scale: (layer_scale > 0.0).then_some(layer_scale),
            out_indices,
            gap_before_final_norm: r.flag("gap_before_final_norm", true),
            with_cp: r.flag("with_cp", false),
        };
        r.default_activation("act_cfg", "GELU")?;
        r.unimplemented("linear_pw_conv", &Value::Bool(true))?;
        r.unimplemented("use_grn", &Value::Bool(false))?;
        r.unimplemented("frozen_stages", &Value::Int(0))?;
        r.inert(&["init_cfg"]);
        r.finish()?;
        Ok(c)
    }
}

/// mmpretrain's `LayerNorm2d` over the channels of an NCHW map
/// (`channel_first`: permute, `layer_norm`, permute back, a copy).
fn layer_norm_2d(norm: &LayerNorm, x: &Tensor) -> Tensor {
    norm.forward(&x.permute([0, 2, 3, 1]))
        .permute([0, 3, 1, 2])
        .contiguous()
}

/// `ConvNeXtBlock` with `linear_pw_conv=True`.
struct Block {
    gamma: Option<Tensor>,
    depthwise_conv: Conv2d,
    norm: LayerNorm,
    pointwise_conv1: Linear,
    pointwise_conv2: Linear,
    drop_path: DropPath,
    with_cp: bool,
}

impl Block {
    fn new(p: &mut ParamScope, c: &ConvNextConfig, channels: i64, drop_path: f64) -> Block {
        // nn.Module lists its own parameter (gamma) before its children's.
        // (Its value, layer_scale_init_value, does not change memory.)
        let gamma = c.layer_scale.map(|_| p.param_ones("gamma", &[channels]));
        let depthwise_conv = Conv2d::new(
            &mut p.sub("depthwise_conv"),
            ConvSpec::new(channels, channels, 7)
                .padding(3)
                .groups(channels),
        );
        let norm = LayerNorm::new(&mut p.sub("norm"), channels, c.norm_eps);
        let pointwise_conv1 =
            Linear::new(&mut p.sub("pointwise_conv1"), channels, 4 * channels, true);
        let pointwise_conv2 =
            Linear::new(&mut p.sub("pointwise_conv2"), 4 * channels, channels, true);
        Block {
            gamma,
            depthwise_conv,
            norm,
            pointwise_conv1,
            pointwise_conv2,
            drop_path: DropPath { prob: drop_path },
            with_cp: c.with_cp,
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        // SAFETY: the block borrows this module, which outlives the step's graph
        // (a trial keeps its model for all its steps).
        unsafe {
            checkpoint_if(self.with_cp, x, move |x: &Tensor| {
                self.inner_forward(x, training)
            })
        }
    }

    fn inner_forward(&self, shortcut: &Tensor, training: bool) -> Tensor {
        // Python rebinds `x` at each step: each intermediate dies when the next exists.
        let mut x = self.depthwise_conv.forward(shortcut);
        x = x.permute([0, 2, 3, 1]);
        x = self.norm.forward(&x);
        x = self.pointwise_conv1.forward(&x);
        x = x.gelu("none");
        x = self.pointwise_conv2.forward(&x);
        x = x.permute([0, 3, 1, 2]);
        if let Some(gamma) = &self.gamma {
            x = x.g_mul(&gamma.view([1, -1, 1, 1]));
        }
        shortcut + self.drop_path.forward(&x, training)
    }
}

pub struct ConvNext {
    /// `downsample_layers.<i>`: the stem's conv then its norm; later ones
    /// the norm then the conv.
    downsample_layers: Vec<(Conv2d, LayerNorm)>,
    stages: Vec<Vec<Block>>,
    out_norms: Vec<(usize, LayerNorm)>,
    gap_before_final_norm: bool,
}

impl ConvNext {
    pub fn new(p: &mut ParamScope, c: &ConvNextConfig) -> ConvNext {
        let ch = &c.channels;
        let mut downsample_layers = Vec::with_capacity(ch.len());
        for i in 0..ch.len() {
            let mut layers_scope = p.sub("downsample_layers");
            let mut dp = layers_scope.sub(i);
            let layer = if i == 0 {
                let conv = Conv2d::new(
                    &mut dp.sub(0),
                    ConvSpec::new(c.in_channels, ch[0], c.stem_patch_size)
                        .stride(c.stem_patch_size),
                );
                (conv, LayerNorm::new(&mut dp.sub(1), ch[0], c.norm_eps))
            } else {
                let norm = LayerNorm::new(&mut dp.sub(0), ch[i - 1], c.norm_eps);
                let conv =
                    Conv2d::new(&mut dp.sub(1), ConvSpec::new(ch[i - 1], ch[i], 2).stride(2));
                (conv, norm)
            };
            downsample_layers.push(layer);
        }
        let total: i64 = c.depths.iter().sum();
        let dpr = linspace_drop_path_rates(c.drop_path_rate, total as usize);
        let mut first = 0usize;
        let mut stages = Vec::with_capacity(ch.len());
        let mut out_norms = Vec::new();
        for (i, depth) in c.depths.iter().enumerate() {
            let mut stage_scope = p.sub("stages");
            let mut sp = stage_scope.sub(i);
            let blocks = (0..*depth as usize)
                .map(|j| Block::new(&mut sp.sub(j), c, ch[i], dpr[first + j]))
                .collect();
            first += *depth as usize;
            stages.push(blocks);
            if c.out_indices.contains(&(i as i64)) {
                out_norms.push((
                    i,
                    LayerNorm::new(&mut p.sub(format!("norm{i}")), ch[i], c.norm_eps),
                ));
            }
        }
        ConvNext {
            downsample_layers,
            stages,
            out_norms,
            gap_before_final_norm: c.gap_before_final_norm,
        }
    }
}

impl Backbone for ConvNext {
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut x = x.shallow_clone();
        let mut outs = Vec::new();
        for (i, ((conv, norm), blocks)) in
            self.downsample_layers.iter().zip(&self.stages).enumerate()
        {
            let _part = crate::models::scope::enter(&format!("stage{}", i + 1));
            x = if i == 0 {
                layer_norm_2d(norm, &conv.forward(&x))
            } else {
                conv.forward(&layer_norm_2d(norm, &x))
            };
            for block in blocks {
                x = block.forward(&x, training);
            }
            if let Some((_, out_norm)) = self.out_norms.iter().find(|(s, _)| *s == i) {
                if self.gap_before_final_norm {
                    let gap = x.mean_dim([-2, -1].as_slice(), true, None::<tch::Kind>);
                    outs.push(layer_norm_2d(out_norm, &gap).flatten(1, -1));
                } else {
                    outs.push(layer_norm_2d(out_norm, &x));
                }
            }
        }
        outs
    }
}

#[cfg(test)]
#[path = "convnext_tests.rs"]
mod tests;
