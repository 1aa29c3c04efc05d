//! `ICNeck`, ICNet's cascade feature fusion, as MMSeg's
//! `mmseg/models/necks/ic_neck.py` builds it.
//!
//! Zhao et al., "ICNet for Real-Time Semantic Segmentation on
//! High-Resolution Images", ECCV 2018, arXiv:1704.08545.
//!
//! Two `CascadeFeatureFusion` units (1/32 into 1/16, then into 1/8): the
//! lower-resolution map upsampled and through a dilated 3x3 ConvModule, the
//! higher one through a 1x1 ConvModule, summed and ReLU'd in place. The neck
//! returns the two upsampled-and-convolved low maps (for the auxiliary
//! heads) and the last fusion.

use super::Neck;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/necks/ic_neck.py";

/// The registry's constructor (`NECKS` row `ICNeck`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Neck>, ModelError> {
    let cfg = IcNeckCfg::from_cfg(cfg)?;
    Ok(Box::new(IcNeck::new(p, &cfg)))
}

/// `ICNeck(in_channels=(64, 256, 256), out_channels=128, conv_cfg=None,
/// norm_cfg=dict(type='BN'), act_cfg=dict(type='ReLU'), align_corners=False)`.
#[derive(Debug, Clone, PartialEq)]
pub struct IcNeckCfg {
    pub in_channels: [i64; 3],
    pub out_channels: i64,
    pub norm: Option<NormCfg>,
    pub align_corners: bool,
}

impl IcNeckCfg {
    pub fn from_cfg(d: &Dict) -> Result<IcNeckCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "ICNeck", SOURCE);
        let in_channels = match c.ints("in_channels", &[64, 256, 256])?[..] {
            [a, b, d] => [a, b, d],
            _ => return Err(c.config_error("Length of input channels must be 3!")),
        };
        let norm = c.batch_norm_or_bn("norm_cfg")?;
        let cfg = IcNeckCfg {
            in_channels,
            out_channels: c.int("out_channels", 128)?,
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

/// `CascadeFeatureFusion(low_channels, high_channels, out_channels)`.
struct CascadeFeatureFusion {
    conv_low: ConvModule,
    conv_high: ConvModule,
    align_corners: bool,
}

impl CascadeFeatureFusion {
    fn new(p: &mut ParamScope, low: i64, high: i64, c: &IcNeckCfg) -> CascadeFeatureFusion {
        let out = c.out_channels;
        CascadeFeatureFusion {
            conv_low: ConvModule::new(
                &mut p.sub("conv_low"),
                ConvSpec::new(low, out, 3).padding(2).dilation(2),
                c.norm,
                true,
            ),
            conv_high: ConvModule::new(
                &mut p.sub("conv_high"),
                ConvSpec::new(high, out, 1),
                c.norm,
                true,
            ),
            align_corners: c.align_corners,
        }
    }

    /// `(relu_(conv_low(up(x_low)) + conv_high(x_high)), conv_low(up(x_low)))`.
    fn forward(&self, x_low: &Tensor, x_high: &Tensor, training: bool) -> (Tensor, Tensor) {
        let size = (x_high.size()[2], x_high.size()[3]);
        let x_low = resize_bilinear(x_low, size, self.align_corners);
        let x_low = self.conv_low.forward(&x_low, training);
        let x_high = self.conv_high.forward(x_high, training);
        let mut x = &x_low + &x_high;
        let _ = x.relu_();
        (x, x_low)
    }
}

pub struct IcNeck {
    cff_24: CascadeFeatureFusion,
    cff_12: CascadeFeatureFusion,
}

impl IcNeck {
    pub fn new(p: &mut ParamScope, c: &IcNeckCfg) -> IcNeck {
        let [sub1, sub2, sub4] = c.in_channels;
        let cff_24 = CascadeFeatureFusion::new(&mut p.sub("cff_24"), sub4, sub2, c);
        let cff_12 = CascadeFeatureFusion::new(&mut p.sub("cff_12"), c.out_channels, sub1, c);
        IcNeck { cff_24, cff_12 }
    }
}

impl Neck for IcNeck {
    fn forward(&self, features: Vec<Tensor>, training: bool) -> Vec<Tensor> {
        assert_eq!(features.len(), 3, "ICNeck takes 3 feature maps");
        let (x_sub1, x_sub2, x_sub4) = (&features[0], &features[1], &features[2]);
        let (x_cff_24, x_24) = self.cff_24.forward(x_sub4, x_sub2, training);
        let (x_cff_12, x_12) = self.cff_12.forward(&x_cff_24, x_sub1, training);
        // Python's locals (x_cff_24, the inputs) live until forward returns.
        let outs = vec![x_24, x_12, x_cff_12];
        drop((x_cff_24, features));
        outs
    }
}

#[cfg(test)]
#[path = "ic_neck_tests.rs"]
mod tests;
