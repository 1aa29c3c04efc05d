//! `MLANeck`, the multi-level feature aggregation neck of SETR-MLA, as
//! MMSeg's `mmseg/models/necks/mla_neck.py` builds it.
//!
//! Zheng et al., "Rethinking Semantic Segmentation from a Sequence-to-Sequence
//! Perspective with Transformers", CVPR 2021, arXiv:2012.15840.
//!
//! Each input map gets a LayerNorm over its channels (through the token
//! layout and back, two copies), then `MLAModule`: a 1x1 ConvModule per
//! level, a top-down running sum from the last level, and a 3x3 ConvModule
//! per sum. The outputs come in that reversed order.

use super::Neck;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{channel_layer_norm, ConvModule, ConvSpec, LayerNorm, LayerNormCfg};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/necks/mla_neck.py";

/// The registry's constructor (`NECKS` row `MLANeck`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Neck>, ModelError> {
    let cfg = MlaNeckCfg::from_cfg(cfg)?;
    Ok(Box::new(MlaNeck::new(p, &cfg)))
}

/// `MLANeck(in_channels, out_channels, norm_layer=dict(type='LN', eps=1e-6,
/// requires_grad=True), norm_cfg=None, act_cfg=None)`.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaNeckCfg {
    pub in_channels: Vec<i64>,
    pub out_channels: i64,
    pub norm_layer: LayerNormCfg,
    pub norm: Option<NormCfg>,
    pub relu: bool,
}

impl MlaNeckCfg {
    pub fn from_cfg(d: &Dict) -> Result<MlaNeckCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "MLANeck", SOURCE);
        c.require("in_channels")?;
        c.require("out_channels")?;
        let norm_layer = LayerNormCfg {
            eps: 1e-6,
            requires_grad: true,
        };
        let cfg = MlaNeckCfg {
            in_channels: c.ints("in_channels", &[])?,
            out_channels: c.int("out_channels", 0)?,
            norm_layer: LayerNormCfg::from_cfg(&mut c, "norm_layer", norm_layer)?,
            norm: c.batch_norm("norm_cfg")?,
            relu: c.relu_or_none("act_cfg", false)?,
        };
        c.finish()?;
        if cfg.in_channels.is_empty() {
            return Err(ModelError::config("MLANeck", "in_channels is empty"));
        }
        Ok(cfg)
    }
}

pub struct MlaNeck {
    norms: Vec<LayerNorm>,
    channel_proj: Vec<ConvModule>,
    feat_extract: Vec<ConvModule>,
}

impl MlaNeck {
    pub fn new(p: &mut ParamScope, c: &MlaNeckCfg) -> MlaNeck {
        let norms = c
            .in_channels
            .iter()
            .enumerate()
            .map(|(i, ch)| c.norm_layer.build(&mut p.sub("norm").sub(i), *ch))
            .collect();
        let mut mla = p.sub("mla");
        let channel_proj = c
            .in_channels
            .iter()
            .enumerate()
            .map(|(i, ch)| {
                ConvModule::new(
                    &mut mla.sub("channel_proj").sub(i),
                    ConvSpec::new(*ch, c.out_channels, 1),
                    c.norm,
                    c.relu,
                )
            })
            .collect();
        let feat_extract = (0..c.in_channels.len())
            .map(|i| {
                ConvModule::new(
                    &mut mla.sub("feat_extract").sub(i),
                    ConvSpec::new(c.out_channels, c.out_channels, 3).padding(1),
                    c.norm,
                    c.relu,
                )
            })
            .collect();
        MlaNeck {
            norms,
            channel_proj,
            feat_extract,
        }
    }

    /// `MLAModule.forward`.
    fn mla(&self, inputs: &[Tensor], training: bool) -> Vec<Tensor> {
        let mut feat_list: Vec<Tensor> = inputs
            .iter()
            .zip(&self.channel_proj)
            .map(|(x, conv)| conv.forward(x, training))
            .collect();
        feat_list.reverse();
        let mut mid_list: Vec<Tensor> = Vec::with_capacity(feat_list.len());
        for feat in &feat_list {
            let mid = match mid_list.last() {
                None => feat.shallow_clone(),
                Some(previous) => previous + feat,
            };
            mid_list.push(mid);
        }
        let outs = mid_list
            .iter()
            .zip(&self.feat_extract)
            .map(|(mid, conv)| conv.forward(mid, training))
            .collect();
        drop((feat_list, mid_list));
        outs
    }
}

impl Neck for MlaNeck {
    fn forward(&self, features: Vec<Tensor>, training: bool) -> Vec<Tensor> {
        let normed: Vec<Tensor> = features
            .iter()
            .zip(&self.norms)
            .map(|(x, norm)| channel_layer_norm(norm, x))
            .collect();
        let outs = self.mla(&normed, training);
        drop((normed, features));
        outs
    }
}

#[cfg(test)]
#[path = "mla_neck_tests.rs"]
mod tests;
