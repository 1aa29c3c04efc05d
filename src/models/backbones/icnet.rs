//! ICNet's backbone, as MMSeg's `mmseg/models/backbones/icnet.py` builds it:
//! the image cascade's three branches around a ResNet.
//!
//! Zhao et al., "ICNet for Real-Time Semantic Segmentation on
//! High-Resolution Images", ECCV 2018, arXiv:1704.08545.
//!
//! The full-resolution branch is three strided ConvModules (`conv_sub1`);
//! the half-resolution image goes through the ResNet's stem, a ceil-mode max
//! pool and `layer1`/`layer2` (`conv_sub2` of that); halved again, through
//! `layer3`/`layer4`, a pyramid pooling module and its bottleneck
//! (`conv_sub4`). The three maps go to `ICNeck`.

use super::resnet::{ResNet, ResNetCfg, Variant};
use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::decode_heads::psp_head::Ppm;
use crate::models::layers::{ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/icnet.py";

/// The registry's constructor (`BACKBONES` row `ICNet`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = IcNetCfg::from_cfg(cfg)?;
    Ok(Box::new(IcNet::new(p, &cfg)))
}

/// `ICNet(backbone_cfg, in_channels=3, layer_channels=(512, 2048),
/// light_branch_middle_channels=32, psp_out_channels=512,
/// out_channels=(64, 256, 256), pool_scales=(1, 2, 3, 6), conv_cfg=None,
/// norm_cfg=dict(type='BN', requires_grad=True), act_cfg=dict(type='ReLU'),
/// align_corners=False)`.
#[derive(Debug, Clone, PartialEq)]
pub struct IcNetCfg {
    pub backbone: ResNetCfg,
    pub in_channels: i64,
    pub layer_channels: (i64, i64),
    pub light_branch_middle_channels: i64,
    pub psp_out_channels: i64,
    pub out_channels: [i64; 3],
    pub pool_scales: Vec<i64>,
    pub norm: Option<NormCfg>,
    pub align_corners: bool,
}

impl IcNetCfg {
    pub fn from_cfg(d: &Dict) -> Result<IcNetCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "ICNet", SOURCE);
        let backbone_cfg = c
            .dict("backbone_cfg")?
            .ok_or_else(|| c.config_error("lacks `backbone_cfg` (ICNet raises a TypeError)"))?;
        let backbone_type = backbone_cfg
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("");
        let variant = Variant::from_type(backbone_type).ok_or_else(|| {
            c.unsupported(
                "backbone_cfg",
                format!(
                    "`{backbone_type}`: ICNet runs its backbone's stem, maxpool and layer1..4, \
                     which segtune builds for ResNet, ResNetV1c and ResNetV1d"
                ),
            )
        })?;
        let backbone = ResNetCfg::from_cfg(backbone_cfg, variant)?;
        if !backbone.deep_stem || backbone.stage_blocks.len() != 4 {
            return Err(c.config_error(
                "backbone_cfg needs a deep stem (ICNet calls `backbone.stem`) and 4 stages (layer1..4)",
            ));
        }
        let layer_channels = match c.ints("layer_channels", &[512, 2048])?[..] {
            [a, b] => (a, b),
            _ => return Err(c.config_error("`layer_channels` must be two ints")),
        };
        let out_channels = match c.ints("out_channels", &[64, 256, 256])?[..] {
            [a, b, d] => [a, b, d],
            _ => return Err(c.config_error("`out_channels` must be three ints")),
        };
        let norm = c.batch_norm_or_bn("norm_cfg")?;
        let cfg = IcNetCfg {
            backbone,
            in_channels: c.int("in_channels", 3)?,
            layer_channels,
            light_branch_middle_channels: c.int("light_branch_middle_channels", 32)?,
            psp_out_channels: c.int("psp_out_channels", 512)?,
            out_channels,
            pool_scales: c.ints("pool_scales", &[1, 2, 3, 6])?,
            norm,
            align_corners: c.flag("align_corners", false),
        };
        c.unimplemented("conv_cfg", &Value::None)?;
        c.default_activation("act_cfg", "ReLU")?;
        c.inert(&["init_cfg"]);
        c.finish()?;
        Ok(cfg)
    }
}

pub struct IcNet {
    backbone: ResNet,
    psp_modules: Ppm,
    psp_bottleneck: ConvModule,
    conv_sub1: Vec<ConvModule>,
    conv_sub2: ConvModule,
    conv_sub4: ConvModule,
    align_corners: bool,
}

impl IcNet {
    pub fn new(p: &mut ParamScope, c: &IcNetCfg) -> IcNet {
        let backbone = ResNet::new(&mut p.sub("backbone"), &c.backbone);
        let (low, high) = c.layer_channels;
        let psp_modules = Ppm::new(
            &mut p.sub("psp_modules"),
            &c.pool_scales,
            high,
            c.psp_out_channels,
            c.norm,
            c.align_corners,
        );
        let psp_bottleneck = ConvModule::new(
            &mut p.sub("psp_bottleneck"),
            ConvSpec::new(
                high + c.pool_scales.len() as i64 * c.psp_out_channels,
                c.psp_out_channels,
                3,
            )
            .padding(1),
            c.norm,
            true,
        );
        let mid = c.light_branch_middle_channels;
        let sub1 = [(c.in_channels, mid), (mid, mid), (mid, c.out_channels[0])];
        let conv_sub1 = sub1
            .iter()
            .enumerate()
            .map(|(i, (from, to))| {
                ConvModule::new(
                    &mut p.sub("conv_sub1").sub(i),
                    ConvSpec::new(*from, *to, 3).stride(2).padding(1),
                    c.norm,
                    true,
                )
            })
            .collect();
        let conv_sub2 = ConvModule::new(
            &mut p.sub("conv_sub2"),
            ConvSpec::new(low, c.out_channels[1], 1),
            c.norm,
            true,
        );
        let conv_sub4 = ConvModule::new(
            &mut p.sub("conv_sub4"),
            ConvSpec::new(c.psp_out_channels, c.out_channels[2], 1),
            c.norm,
            true,
        );
        IcNet {
            backbone,
            psp_modules,
            psp_bottleneck,
            conv_sub1,
            conv_sub2,
            conv_sub4,
            align_corners: c.align_corners,
        }
    }

    /// `resize(x, scale_factor=0.5, mode='bilinear')`.
    fn halve(&self, x: &Tensor) -> Tensor {
        let (h, w) = (x.size()[2], x.size()[3]);
        let size = [(h as f64 * 0.5) as i64, (w as f64 * 0.5) as i64];
        x.upsample_bilinear2d(size, self.align_corners, Some(0.5), Some(0.5))
    }
}

impl Backbone for IcNet {
    /// `[sub1 (1/8), sub2 (1/16), sub4 (1/32)]` maps.
    fn forward(&self, input: &Tensor, training: bool) -> Vec<Tensor> {
        let mut output = Vec::with_capacity(3);
        let sub1 = {
            // nn.Sequential keeps only its latest output.
            let mut y = input.shallow_clone();
            for conv in &self.conv_sub1 {
                y = conv.forward(&y, training);
            }
            y
        };
        output.push(sub1);
        let resnet = &self.backbone;
        let mut x = self.halve(input);
        x = resnet.stem_forward(&x, training);
        // ICNet replaces the backbone's max pool with a ceil-mode one.
        x = x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], true);
        x = resnet.layer_forward(0, &x, training);
        x = resnet.layer_forward(1, &x, training);
        output.push(self.conv_sub2.forward(&x, training));
        x = self.halve(&x);
        x = resnet.layer_forward(2, &x, training);
        x = resnet.layer_forward(3, &x, training);
        let psp_outs = {
            let mut outs = self.psp_modules.forward(&x, training);
            outs.push(x.shallow_clone());
            Tensor::cat(&outs, 1)
        };
        x = self.psp_bottleneck.forward(&psp_outs, training);
        output.push(self.conv_sub4.forward(&x, training));
        output
    }
}

#[cfg(test)]
#[path = "icnet_tests.rs"]
mod tests;
