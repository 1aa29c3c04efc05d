//! `MultiLevelNeck`, as MMSeg's `mmseg/models/necks/multilevel_neck.py`
//! builds it: the neck that turns a ViT's single-resolution outputs into a
//! pyramid for UPerNet.
//!
//! A 1x1 lateral ConvModule per input, each lateral (or the one lateral,
//! repeated) bilinearly rescaled by its `scales` entry, then a 3x3
//! ConvModule per output. No norm and no activation unless configured.

use super::Neck;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/necks/multilevel_neck.py";

/// The registry's constructor (`NECKS` row `MultiLevelNeck`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Neck>, ModelError> {
    let cfg = MultiLevelNeckCfg::from_cfg(cfg)?;
    Ok(Box::new(MultiLevelNeck::new(p, &cfg)))
}

/// `MultiLevelNeck(in_channels, out_channels, scales=[0.5, 1, 2, 4],
/// norm_cfg=None, act_cfg=None)`.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiLevelNeckCfg {
    pub in_channels: Vec<i64>,
    pub out_channels: i64,
    pub scales: Vec<f64>,
    pub norm: Option<NormCfg>,
    pub relu: bool,
}

impl MultiLevelNeckCfg {
    pub fn from_cfg(d: &Dict) -> Result<MultiLevelNeckCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "MultiLevelNeck", SOURCE);
        c.require("in_channels")?;
        c.require("out_channels")?;
        let cfg = MultiLevelNeckCfg {
            in_channels: c.ints("in_channels", &[])?,
            out_channels: c.int("out_channels", 0)?,
            scales: c.floats("scales")?.unwrap_or(vec![0.5, 1.0, 2.0, 4.0]),
            norm: c.batch_norm("norm_cfg")?,
            relu: c.relu_or_none("act_cfg", false)?,
        };
        c.unimplemented("conv_cfg", &Value::None)?;
        c.finish()?;
        let (inputs, outputs) = (cfg.in_channels.len(), cfg.scales.len());
        // forward indexes the laterals by output: one lateral, or one per output.
        if inputs == 0 || (inputs != 1 && inputs < outputs) {
            return Err(ModelError::config(
                "MultiLevelNeck",
                format!("{inputs} in_channels for {outputs} scales (needs one, or one per scale)"),
            ));
        }
        if let Some(s) = cfg.scales.iter().find(|s| **s <= 0.0) {
            return Err(ModelError::config(
                "MultiLevelNeck",
                format!("scale {s} is not positive"),
            ));
        }
        Ok(cfg)
    }
}

pub struct MultiLevelNeck {
    lateral_convs: Vec<ConvModule>,
    convs: Vec<ConvModule>,
    scales: Vec<f64>,
}

impl MultiLevelNeck {
    pub fn new(p: &mut ParamScope, c: &MultiLevelNeckCfg) -> MultiLevelNeck {
        let lateral_convs = c
            .in_channels
            .iter()
            .enumerate()
            .map(|(i, in_channels)| {
                ConvModule::new(
                    &mut p.sub("lateral_convs").sub(i),
                    ConvSpec::new(*in_channels, c.out_channels, 1),
                    c.norm,
                    c.relu,
                )
            })
            .collect();
        let convs = (0..c.scales.len())
            .map(|i| {
                ConvModule::new(
                    &mut p.sub("convs").sub(i),
                    ConvSpec::new(c.out_channels, c.out_channels, 3).padding(1),
                    c.norm,
                    c.relu,
                )
            })
            .collect();
        MultiLevelNeck {
            lateral_convs,
            convs,
            scales: c.scales.clone(),
        }
    }
}

impl Neck for MultiLevelNeck {
    fn forward(&self, features: Vec<Tensor>, training: bool) -> Vec<Tensor> {
        let laterals: Vec<Tensor> = self
            .lateral_convs
            .iter()
            .zip(&features)
            .map(|(conv, x)| conv.forward(x, training))
            .collect();
        let mut outs = Vec::with_capacity(self.convs.len());
        // Python's loop variable holds the latest resized map until return.
        let mut x_resize = None;
        for (i, (conv, scale)) in self.convs.iter().zip(&self.scales).enumerate() {
            let x = &laterals[if laterals.len() == 1 { 0 } else { i }];
            let (h, w) = (x.size()[2], x.size()[3]);
            // F.interpolate(scale_factor=s): floor(size * s), the scale passed on.
            let size = [
                (h as f64 * scale).floor() as i64,
                (w as f64 * scale).floor() as i64,
            ];
            let resized = x.upsample_bilinear2d(size, false, Some(*scale), Some(*scale));
            let resized = x_resize.insert(resized);
            outs.push(conv.forward(resized, training));
        }
        drop((x_resize, laterals, features));
        outs
    }
}

#[cfg(test)]
#[path = "multilevel_neck_tests.rs"]
mod tests;
