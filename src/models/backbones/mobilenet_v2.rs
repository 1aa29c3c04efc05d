//! `MobileNetV2`, as MMSeg's `mmseg/models/backbones/mobilenet_v2.py` builds
//! it with `mmseg/models/utils/inverted_residual.py`'s `InvertedResidual`.
//!
//! Sandler et al., "MobileNetV2: Inverted Residuals and Linear
//! Bottlenecks", CVPR 2018, arXiv:1801.04381.
//!
//! A 3x3 stride-2 ConvModule stem, then seven layers of inverted residual
//! blocks (1x1 expansion, 3x3 depthwise with the layer's stride and
//! dilation on its first block, 1x1 linear projection; an identity shortcut
//! where stride 1 keeps the channels). Every ConvModule has BN and, but the
//! projection, mmcv's in-place `ReLU6`. MMSeg's configs make it a D8
//! backbone with `strides=(1, 2, 2, 1, 1, 1, 1)` and dilations
//! `(1, 1, 1, 2, 2, 4, 4)`.

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::inverted_residual::{make_divisible, BlockAct, InvertedResidual};
use crate::models::layers::{ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/mobilenet_v2.py";

/// `arch_settings`: (expand ratio, channels, blocks) per layer.
const ARCH: [(i64, i64, i64); 7] = [
    (1, 16, 1),
    (6, 24, 2),
    (6, 32, 3),
    (6, 64, 4),
    (6, 96, 3),
    (6, 160, 3),
    (6, 320, 1),
];

/// The registry's constructor (`BACKBONES` row `MobileNetV2`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = MobileNetV2Cfg::from_cfg(cfg)?;
    Ok(Box::new(MobileNetV2::new(p, &cfg)))
}

/// `MobileNetV2(widen_factor=1., strides=(1, 2, 2, 2, 1, 2, 1),
/// dilations=(1,) * 7, out_indices=(1, 2, 4, 6), norm_cfg=dict(type='BN'),
/// act_cfg=dict(type='ReLU6'))`.
#[derive(Debug, Clone, PartialEq)]
pub struct MobileNetV2Cfg {
    pub widen_factor: f64,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    pub out_indices: Vec<i64>,
    pub norm: NormCfg,
}

impl MobileNetV2Cfg {
    pub fn from_cfg(d: &Dict) -> Result<MobileNetV2Cfg, ModelError> {
        let mut c = ComponentConfig::new(d, "MobileNetV2", SOURCE);
        let widen_factor = c.float("widen_factor", 1.0)?;
        let strides = c.ints("strides", &[1, 2, 2, 2, 1, 2, 1])?;
        let dilations = c.ints("dilations", &[1; 7])?;
        let out_indices = c.ints("out_indices", &[1, 2, 4, 6])?;
        let norm = match c.value("norm_cfg") {
            None => NormCfg::BN_DEFAULT,
            Some(_) => c.batch_norm("norm_cfg")?.ok_or_else(|| {
                c.unsupported(
                    "norm_cfg",
                    "None (ConvModule without a norm) is not implemented",
                )
            })?,
        };
        c.default_activation("act_cfg", "ReLU6")?;
        c.unimplemented("frozen_stages", &Value::Int(-1))?;
        c.unimplemented("norm_eval", &Value::Bool(false))?;
        c.unimplemented("with_cp", &Value::Bool(false))?;
        c.unimplemented("conv_cfg", &Value::None)?;
        c.inert(&["pretrained", "init_cfg"]);
        // MobileNetV2.__init__'s checks.
        if strides.len() != 7 || dilations.len() != 7 {
            return Err(c.config_error("strides and dilations need one entry per layer (7)"));
        }
        if strides.iter().any(|s| ![1, 2].contains(s)) {
            return Err(c.config_error("InvertedResidual's stride must be 1 or 2"));
        }
        if let Some(bad) = out_indices.iter().find(|i| !(0..7).contains(*i)) {
            return Err(c.config_error(format!(
                "the item in out_indices must in range(0, 7). But received {bad}"
            )));
        }
        if widen_factor <= 0.0 {
            return Err(c.config_error("widen_factor must be positive"));
        }
        c.finish()?;
        Ok(MobileNetV2Cfg {
            widen_factor,
            strides,
            dilations,
            out_indices,
            norm,
        })
    }
}

/// A ConvModule with BN and, when `relu6`, mmcv's `ReLU6(inplace=True)`
/// (`hardtanh_(x, 0, 6)`: `relu6_`, whose output autograd saves).
struct ConvBnAct {
    conv: ConvModule,
    relu6: bool,
}

impl ConvBnAct {
    fn new(p: &mut ParamScope, spec: ConvSpec, norm: NormCfg, relu6: bool) -> ConvBnAct {
        ConvBnAct {
            conv: ConvModule::new(p, spec, Some(norm), false),
            relu6,
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut y = self.conv.forward(x, training);
        if self.relu6 {
            crate::models::layers::relu6_(&mut y);
        }
        y
    }
}

pub struct MobileNetV2 {
    conv1: ConvBnAct,
    layers: Vec<Vec<InvertedResidual>>,
    out_indices: Vec<i64>,
}

impl MobileNetV2 {
    pub fn new(p: &mut ParamScope, cfg: &MobileNetV2Cfg) -> MobileNetV2 {
        let mut in_channels = make_divisible(32.0 * cfg.widen_factor, 8);
        let conv1 = ConvBnAct::new(
            &mut p.sub("conv1"),
            ConvSpec::new(3, in_channels, 3).stride(2).padding(1),
            cfg.norm,
            true,
        );
        let mut layers = Vec::new();
        for (i, &(expand_ratio, channels, blocks)) in ARCH.iter().enumerate() {
            let out_channels = make_divisible(channels as f64 * cfg.widen_factor, 8);
            let mut lp = p.sub(format!("layer{}", i + 1));
            let layer = (0..blocks)
                .map(|b| {
                    let first = b == 0;
                    let block = InvertedResidual::new(
                        &mut lp.sub(b),
                        (in_channels, out_channels),
                        if first {
                            (cfg.strides[i], cfg.dilations[i])
                        } else {
                            (1, 1)
                        },
                        expand_ratio,
                        Some(cfg.norm),
                        BlockAct::Relu6,
                    );
                    in_channels = out_channels;
                    block
                })
                .collect();
            layers.push(layer);
        }
        MobileNetV2 {
            conv1,
            layers,
            out_indices: cfg.out_indices.clone(),
        }
    }
}

impl Backbone for MobileNetV2 {
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut x = {
            let _part = crate::models::scope::enter("stem");
            self.conv1.forward(x, training)
        };
        let mut outs = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("layer{}", i + 1));
            for block in layer {
                x = block.forward(&x, training);
            }
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
    use tch::{Device, Kind};

    #[test]
    fn d8_mobilenet_v2_has_mmsegs_parameters_and_strides() {
        // `model.backbone` of mobilenet_v2/mobilenet-v2-d8_*_cityscapes-512x1024.py.
        let cfg = dict(json!({
            "type": "MobileNetV2", "widen_factor": 1.0,
            "strides": [1, 2, 2, 1, 1, 1, 1], "dilations": [1, 1, 1, 2, 2, 4, 4],
            "out_indices": [1, 2, 4, 6], "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        }));
        let mut store = ParamStore::new(Device::Cpu);
        let backbone = build(&mut store.scope("backbone"), &cfg).unwrap();
        // params_all.json, mobilenet_v2/mobilenet-v2-d8_fcn_4xb2-80k_cityscapes-512x1024.py:
        // by_prefix.backbone.total
        assert_eq!(store.total(), 1_811_712);
        let x = Tensor::zeros([2, 3, 64, 64], (Kind::Float, Device::Cpu));
        let shapes: Vec<Vec<i64>> = backbone
            .forward(&x, true)
            .iter()
            .map(|t| t.size())
            .collect();
        assert_eq!(
            shapes,
            [
                vec![2, 24, 16, 16],
                vec![2, 32, 8, 8],
                vec![2, 96, 8, 8],
                vec![2, 320, 8, 8]
            ]
        );
    }
}
