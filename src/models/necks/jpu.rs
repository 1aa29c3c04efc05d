//! `JPU`, the Joint Pyramid Upsampling neck of FastFCN, as MMSeg's
//! `mmseg/models/necks/jpu.py` builds it.
//!
//! Wu et al., "FastFCN: Rethinking Dilated Convolution in the Backbone for
//! Semantic Segmentation", arXiv:1903.11816.
//!
//! Each used level gets a 3x3 ConvModule to `mid_channels`; the maps are
//! upsampled to the finest, concatenated, and passed through one depthwise
//! separable dilated ConvModule per dilation (the depthwise conv without
//! activation), whose outputs are concatenated. The neck returns the
//! backbone's levels before the last, then that concatenation.

use super::Neck;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec, DepthwiseSeparableConvModule};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/necks/jpu.py";

/// The registry's constructor (`NECKS` row `JPU`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Neck>, ModelError> {
    let cfg = JpuCfg::from_cfg(cfg)?;
    Ok(Box::new(Jpu::new(p, &cfg)))
}

/// `JPU(in_channels=(512, 1024, 2048), mid_channels=512, start_level=0,
/// end_level=-1, dilations=(1, 2, 4, 8), align_corners=False, ...)`.
#[derive(Debug, Clone, PartialEq)]
pub struct JpuCfg {
    pub in_channels: Vec<i64>,
    pub mid_channels: i64,
    pub start_level: usize,
    /// `backbone_end_level`: `end_level`, or the number of inputs for -1.
    pub end_level: usize,
    pub dilations: Vec<i64>,
    pub align_corners: bool,
    pub norm: Option<NormCfg>,
}

impl JpuCfg {
    pub fn from_cfg(d: &Dict) -> Result<JpuCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "JPU", SOURCE);
        let in_channels = c.ints("in_channels", &[512, 1024, 2048])?;
        let dilations = c.ints("dilations", &[1, 2, 4, 8])?;
        let start_level = c.int("start_level", 0)?;
        let end_level = match c.int("end_level", -1)? {
            -1 => in_channels.len() as i64,
            e => e,
        };
        if start_level < 0 || end_level > in_channels.len() as i64 || start_level >= end_level {
            return Err(c.config_error(format!(
                "needs 0 <= start_level < end_level <= len(in_channels) ({}), got {start_level} and {end_level}",
                in_channels.len()
            )));
        }
        let norm = c.batch_norm_or_bn("norm_cfg")?;
        c.unimplemented("conv_cfg", &Value::None)?;
        c.default_activation("act_cfg", "ReLU")?;
        c.inert(&["init_cfg"]);
        let cfg = JpuCfg {
            in_channels,
            mid_channels: c.int("mid_channels", 512)?,
            start_level: start_level as usize,
            end_level: end_level as usize,
            dilations,
            align_corners: c.flag("align_corners", false),
            norm,
        };
        c.finish()?;
        Ok(cfg)
    }
}

pub struct Jpu {
    conv_layers: Vec<ConvModule>,
    dilation_layers: Vec<DepthwiseSeparableConvModule>,
    cfg: JpuCfg,
}

impl Jpu {
    pub fn new(p: &mut ParamScope, cfg: &JpuCfg) -> Jpu {
        let mid = cfg.mid_channels;
        let conv_layers = (cfg.start_level..cfg.end_level)
            .map(|i| {
                // nn.Sequential(ConvModule): item 0.
                ConvModule::new(
                    &mut p.sub("conv_layers").sub(i - cfg.start_level).sub(0),
                    ConvSpec::new(cfg.in_channels[i], mid, 3).padding(1),
                    cfg.norm,
                    true,
                )
            })
            .collect();
        let levels = (cfg.end_level - cfg.start_level) as i64;
        let dilation_layers = cfg
            .dilations
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                DepthwiseSeparableConvModule::new(
                    &mut p.sub("dilation_layers").sub(i).sub(0),
                    ConvSpec::new(levels * mid, mid, 3).padding(d).dilation(d),
                    cfg.norm,
                    false,
                )
            })
            .collect();
        Jpu {
            conv_layers,
            dilation_layers,
            cfg: cfg.clone(),
        }
    }
}

impl Neck for Jpu {
    /// `[inputs[start]..inputs[end - 2], concat]`, the concatenation
    /// `[B, len(dilations) * mid_channels, H_start, W_start]`.
    fn forward(&self, inputs: Vec<Tensor>, training: bool) -> Vec<Tensor> {
        assert_eq!(
            inputs.len(),
            self.cfg.in_channels.len(),
            "JPU: the backbone gives {} maps, in_channels has {}",
            inputs.len(),
            self.cfg.in_channels.len()
        );
        let (start, end) = (self.cfg.start_level, self.cfg.end_level);
        let mut feats: Vec<Tensor> = (start..end)
            .map(|i| self.conv_layers[i - start].forward(&inputs[i], training))
            .collect();
        let size = (feats[0].size()[2], feats[0].size()[3]);
        for feat in feats.iter_mut().skip(1) {
            *feat = resize_bilinear(feat, size, self.cfg.align_corners);
        }
        let feat = Tensor::cat(&feats, 1); // [B, levels * mid, H, W]
        drop(feats);
        let branches: Vec<Tensor> = self
            .dilation_layers
            .iter()
            .map(|layer| layer.forward(&feat, training))
            .collect();
        let concat_feat = Tensor::cat(&branches, 1); // [B, n * mid, H, W]
        drop(branches);
        drop(feat);
        let mut outs: Vec<Tensor> = inputs[start..end - 1]
            .iter()
            .map(Tensor::shallow_clone)
            .collect();
        outs.push(concat_feat);
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
    fn fastfcn_jpu_has_mmsegs_parameter_count_and_outputs() {
        // `model.neck` of fastfcn/fastfcn_r50-d32_jpu_psp_4xb2-80k_cityscapes-512x1024.py.
        let cfg = dict(json!({
            "type": "JPU", "in_channels": [512, 1024, 2048], "mid_channels": 512,
            "start_level": 0, "end_level": -1, "dilations": [1, 2, 4, 8],
            "align_corners": false, "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        }));
        let mut store = ParamStore::new(Device::Cpu);
        let neck = build(&mut store.scope("neck"), &cfg).unwrap();
        // params_all.json, fastfcn/fastfcn_r50-d32_jpu_psp_4xb2-80k_cityscapes-512x1024.py:
        // by_prefix.neck.total
        assert_eq!(store.total(), 19_735_552);
        let inputs: Vec<Tensor> = [(512, 8), (1024, 4), (2048, 2)]
            .iter()
            .map(|&(c, s)| Tensor::zeros([2, c, s, s], (Kind::Float, Device::Cpu)))
            .collect();
        let shapes: Vec<Vec<i64>> = neck
            .forward(inputs, true)
            .iter()
            .map(|t| t.size())
            .collect();
        assert_eq!(
            shapes,
            [vec![2, 512, 8, 8], vec![2, 1024, 4, 4], vec![2, 2048, 8, 8]]
        );
    }
}
