//! `MobileNetV3`, as MMSeg's `mmseg/models/backbones/mobilenet_v3.py` builds
//! it with `mmseg/models/utils/inverted_residual.py`'s `InvertedResidualV3`
//! (see [`crate::models::layers::inverted_residual`]).
//!
//! Howard et al., "Searching for MobileNetV3", ICCV 2019, arXiv:1905.02244.
//!
//! `layer0`, a 3x3 stride-2 ConvModule (a `Conv2dAdaptivePadding`, BN,
//! in-place Hardswish); 11 (`small`) or 15 (`large`) inverted residual
//! blocks of `arch_settings`; and a last 1x1 ConvModule to 576 / 960
//! channels. MMSeg then makes it an output-stride-8 backbone: the stride-2
//! depthwise convs of `layer4` and `layer9` (`small`) or `layer7` and
//! `layer13` (`large`) get stride 1, and every depthwise conv from there on
//! dilation 2, then 4 (the adaptive-padding ones keep padding by `F.pad`).

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::activation::Activation;
use crate::models::layers::inverted_residual::{
    ConvAct, DepthwiseGeometry, InvertedResidualV3, InvertedResidualV3Spec,
};
use crate::models::layers::ConvSpec;
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/mobilenet_v3.py";

/// `arch_settings` rows: kernel size, mid channels, out channels, with_se,
/// act type, stride.
type Setting = (i64, i64, i64, bool, &'static str, i64);

const SMALL: [Setting; 11] = [
    (3, 16, 16, true, "ReLU", 2),
    (3, 72, 24, false, "ReLU", 2),
    (3, 88, 24, false, "ReLU", 1),
    (5, 96, 40, true, "HSwish", 2),
    (5, 240, 40, true, "HSwish", 1),
    (5, 240, 40, true, "HSwish", 1),
    (5, 120, 48, true, "HSwish", 1),
    (5, 144, 48, true, "HSwish", 1),
    (5, 288, 96, true, "HSwish", 2),
    (5, 576, 96, true, "HSwish", 1),
    (5, 576, 96, true, "HSwish", 1),
];

const LARGE: [Setting; 15] = [
    (3, 16, 16, false, "ReLU", 1),
    (3, 64, 24, false, "ReLU", 2),
    (3, 72, 24, false, "ReLU", 1),
    (5, 72, 40, true, "ReLU", 2),
    (5, 120, 40, true, "ReLU", 1),
    (5, 120, 40, true, "ReLU", 1),
    (3, 240, 80, false, "HSwish", 2),
    (3, 200, 80, false, "HSwish", 1),
    (3, 184, 80, false, "HSwish", 1),
    (3, 184, 80, false, "HSwish", 1),
    (3, 480, 112, true, "HSwish", 1),
    (3, 672, 112, true, "HSwish", 1),
    (5, 672, 160, true, "HSwish", 2),
    (5, 960, 160, true, "HSwish", 1),
    (5, 960, 160, true, "HSwish", 1),
];

/// What `_make_layer` does per arch besides the settings.
struct Arch {
    settings: &'static [Setting],
    /// The last layer's output channels.
    last_channels: i64,
    /// Blocks from this index of `arch_settings` on have their channels
    /// divided by `reduction_factor`.
    reduced_from: usize,
    /// The layers whose depthwise conv gets stride 1 (`layer4`, `layer9`).
    unstrided: [usize; 2],
    /// Layers `dilated_from..dilated_4_from` get dilation 2, later ones 4.
    dilated_from: usize,
    dilated_4_from: usize,
}

const ARCH_SMALL: Arch = Arch {
    settings: &SMALL,
    last_channels: 576,
    reduced_from: 8,
    unstrided: [4, 9],
    dilated_from: 4,
    dilated_4_from: 9,
};

const ARCH_LARGE: Arch = Arch {
    settings: &LARGE,
    last_channels: 960,
    reduced_from: 12,
    unstrided: [7, 13],
    dilated_from: 7,
    dilated_4_from: 13,
};

/// The registry's constructor (`BACKBONES` row `MobileNetV3`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = MobileNetV3Cfg::from_cfg(cfg)?;
    Ok(Box::new(MobileNetV3::new(p, &cfg)))
}

/// `MobileNetV3(arch='small', conv_cfg=None, norm_cfg=dict(type='BN'),
/// out_indices=(0, 1, 12), frozen_stages=-1, reduction_factor=1,
/// norm_eval=False, with_cp=False, pretrained=None, init_cfg=None)`.
#[derive(Debug, Clone, PartialEq)]
pub struct MobileNetV3Cfg {
    /// `arch == 'large'`.
    pub large: bool,
    pub norm: Option<NormCfg>,
    pub out_indices: Vec<i64>,
    pub reduction_factor: i64,
}

impl MobileNetV3Cfg {
    pub fn from_cfg(d: &Dict) -> Result<MobileNetV3Cfg, ModelError> {
        let mut c = ComponentConfig::new(d, "MobileNetV3", SOURCE);
        let large = match c.string("arch")?.unwrap_or("small") {
            "small" => false,
            "large" => true,
            other => {
                // `assert arch in self.arch_settings`.
                return Err(c.config_error(format!(
                    "arch must be 'small' or 'large' (arch_settings), not '{other}'"
                )));
            }
        };
        let norm = c.batch_norm_or_bn("norm_cfg")?;
        let out_indices = c.ints("out_indices", &[0, 1, 12])?;
        let reduction_factor = c.int("reduction_factor", 1)?;
        if reduction_factor <= 0 {
            return Err(c.config_error("reduction_factor must be a positive int"));
        }
        let n = if large { LARGE.len() } else { SMALL.len() } as i64;
        if let Some(bad) = out_indices.iter().find(|i| !(0..n + 2).contains(*i)) {
            return Err(c.config_error(format!(
                "the item in out_indices must in range(0, {}). But received {bad}",
                n + 2
            )));
        }
        c.unimplemented("frozen_stages", &Value::Int(-1))?;
        c.unimplemented("norm_eval", &Value::Bool(false))?;
        c.unimplemented("with_cp", &Value::Bool(false))?;
        c.unimplemented("conv_cfg", &Value::None)?;
        c.inert(&["pretrained", "init_cfg"]);
        c.finish()?;
        Ok(MobileNetV3Cfg {
            large,
            norm,
            out_indices,
            reduction_factor,
        })
    }
}

pub struct MobileNetV3 {
    layer0: ConvAct,
    blocks: Vec<InvertedResidualV3>,
    last: ConvAct,
    out_indices: Vec<i64>,
}

impl MobileNetV3 {
    pub fn new(p: &mut ParamScope, cfg: &MobileNetV3Cfg) -> MobileNetV3 {
        let arch = if cfg.large { ARCH_LARGE } else { ARCH_SMALL };
        let mut in_channels = 16;
        let layer0 = ConvAct::adaptive(
            &mut p.sub("layer0"),
            ConvSpec::new(3, in_channels, 3).stride(2),
            cfg.norm,
            Some(Activation::HSwish),
        );
        let mut blocks = Vec::new();
        for (i, &setting) in arch.settings.iter().enumerate() {
            let spec = block_spec(&arch, cfg, i, setting, in_channels);
            in_channels = spec.out_channels;
            blocks.push(InvertedResidualV3::new(
                &mut p.sub(format!("layer{}", i + 1)),
                &spec,
            ));
        }
        // `ConvModule(in, 576 / 960, 1, dilation=4, padding=0)`, left 1x1
        // with dilation 4 and padding 4 * 0 by the segmentation changes.
        let layer = arch.settings.len() + 1;
        let last = ConvAct::new(
            &mut p.sub(format!("layer{layer}")),
            ConvSpec::new(in_channels, arch.last_channels, 1).dilation(4),
            cfg.norm,
            Some(Activation::HSwish),
            cfg.norm.is_none(),
        );
        MobileNetV3 {
            layer0,
            blocks,
            last,
            out_indices: cfg.out_indices.clone(),
        }
    }
}

/// `layer{i + 1}`'s `InvertedResidualV3`, its depthwise conv as the
/// segmentation changes leave it.
fn block_spec(
    arch: &Arch,
    cfg: &MobileNetV3Cfg,
    i: usize,
    (kernel_size, mut mid, mut out, with_se, act, stride): Setting,
    in_channels: i64,
) -> InvertedResidualV3Spec {
    if i >= arch.reduced_from {
        mid /= cfg.reduction_factor;
        out /= cfg.reduction_factor;
    }
    let layer = i + 1;
    let dilation = match layer {
        l if l < arch.dilated_from => 1,
        l if l < arch.dilated_4_from => 2,
        _ => 4,
    };
    let depthwise = DepthwiseGeometry {
        stride: if arch.unstrided.contains(&layer) {
            1
        } else {
            stride
        },
        dilation,
        // `kernel_size // 2`, then `dilation * (kernel_size - 1) // 2` for
        // the dilated ones (adaptive-padding convs ignore it).
        padding: dilation * (kernel_size - 1) / 2,
    };
    InvertedResidualV3Spec {
        in_channels,
        out_channels: out,
        mid_channels: mid,
        kernel_size,
        stride,
        with_se,
        with_expand_conv: in_channels != mid,
        act: Activation::from_name(act).expect("arch_settings' activations"),
        norm: cfg.norm,
        depthwise,
    }
}

impl Backbone for MobileNetV3 {
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut outs = Vec::new();
        let mut x = {
            let _part = crate::models::scope::enter("layer0");
            self.layer0.forward(x, training)
        };
        if self.out_indices.contains(&0) {
            outs.push(x.shallow_clone());
        }
        for (i, block) in self.blocks.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("layer{}", i + 1));
            x = block.forward(&x, training);
            if self.out_indices.contains(&(i as i64 + 1)) {
                outs.push(x.shallow_clone());
            }
        }
        let layer = self.blocks.len() + 1;
        let _part = crate::models::scope::enter(&format!("layer{layer}"));
        x = self.last.forward(&x, training);
        if self.out_indices.contains(&(layer as i64)) {
            outs.push(x);
        }
        outs
    }
}

#[cfg(test)]
#[path = "mobilenet_v3_tests.rs"]
mod tests;
