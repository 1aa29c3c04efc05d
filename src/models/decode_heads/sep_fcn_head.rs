//! `DepthwiseSeparableFCNHead`, Fast-SCNN's head, as MMSeg's
//! `mmseg/models/decode_heads/sep_fcn_head.py` builds it: an `FCNHead` whose
//! convs (and `conv_cat`) are mmcv's `DepthwiseSeparableConvModule`s.
//!
//! Poudel, Liwicki and Cipolla, "Fast-SCNN: Fast Semantic Segmentation
//! Network", BMVC 2019, arXiv:1902.04502.
//!
//! MMSeg builds FCNHead's ConvModules and then replaces each by a
//! depthwise-separable one in place, so the parameters keep FCNHead's names
//! and order (`conv_seg`, `convs.<i>.depthwise_conv`,
//! `convs.<i>.pointwise_conv`, `conv_cat`); FCNHead's `dilation` only shaped
//! the replaced modules. The depthwise convs take `dw_act_cfg` (default
//! `None`: no activation), the pointwise ones a ReLU.

use super::decode_head::DecodeHeadBase;
use super::fcn_head::{FcnConv, FcnHead, FcnHeadCfg};
use super::DecodeHead;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{ConvSpec, DepthwiseSeparableConvModule};
use crate::models::params::ParamScope;
use crate::models::ModelError;

const SOURCE: &str = "mmseg/models/decode_heads/sep_fcn_head.py";

/// The registry's constructor (`DECODE_HEADS` row `DepthwiseSeparableFCNHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = SepFcnHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(new(p, cfg)))
}

/// `DepthwiseSeparableFCNHead(dw_act_cfg=None, **kwargs)` on `FCNHead`'s
/// keys.
#[derive(Debug, Clone, PartialEq)]
pub struct SepFcnHeadCfg {
    pub fcn: FcnHeadCfg,
    /// `dw_act_cfg`: a ReLU after the depthwise convs' norm.
    pub dw_relu: bool,
}

impl SepFcnHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<SepFcnHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "DepthwiseSeparableFCNHead", SOURCE);
        let dw_relu = match c.value("dw_act_cfg") {
            // mmcv's 'default': the module's own act_cfg, a ReLU.
            Some(Value::Str(s)) if s == "default" => true,
            Some(Value::Str(_)) => {
                return Err(c.unsupported(
                    "dw_act_cfg",
                    "only None, dict(type='ReLU') or 'default' is implemented",
                ))
            }
            _ => c.relu_or_none("dw_act_cfg", false)?,
        };
        let fcn = FcnHeadCfg::read(&mut c, None)?;
        if fcn.num_convs == 0 {
            // FCNHead's convs are then an nn.Identity, which
            // `self.convs[0] = ...` cannot assign to.
            return Err(c.config_error(
                "needs num_convs >= 1 (MMSeg replaces convs[0], which num_convs=0 lacks)",
            ));
        }
        c.finish()?;
        Ok(SepFcnHeadCfg { fcn, dw_relu })
    }
}

/// `DepthwiseSeparableFCNHead(cfg)`: an [`FcnHead`] whose convs are
/// depthwise-separable.
pub fn new(p: &mut ParamScope, cfg: SepFcnHeadCfg) -> FcnHead {
    let SepFcnHeadCfg { fcn, dw_relu } = cfg;
    let head = fcn.head;
    let (channels, norm) = (head.channels, head.norm);
    // resize_concat heads see the sum of the selected maps' channels.
    let in_channels: i64 = head.in_channels.iter().sum();
    let base = DecodeHeadBase::new(p, head);
    let k = fcn.kernel_size;
    let mut cp = p.sub("convs");
    let separable = |p: &mut ParamScope, from: i64| {
        let spec = ConvSpec::new(from, channels, k).padding(k / 2);
        FcnConv::Separable(DepthwiseSeparableConvModule::new(p, spec, norm, dw_relu))
    };
    let convs = (0..fcn.num_convs)
        .map(|i| separable(&mut cp.sub(i), if i == 0 { in_channels } else { channels }))
        .collect();
    let conv_cat = fcn
        .concat_input
        .then(|| separable(&mut p.sub("conv_cat"), in_channels + channels));
    FcnHead::with_convs(base, convs, conv_cat)
}

#[cfg(test)]
#[path = "sep_fcn_head_tests.rs"]
mod tests;
