//! `FPN`, the feature pyramid neck, as MMSeg's `mmseg/models/necks/fpn.py`
//! builds it.
//!
//! Lin et al., "Feature Pyramid Networks for Object Detection", CVPR 2017,
//! arXiv:1612.03144.
//!
//! A 1x1 lateral ConvModule per used level; from the coarsest down, each
//! lateral gets the upsampled one above added; a 3x3 ConvModule per level
//! makes the outputs, and extra levels come from stride-2 max pooling or
//! extra 3x3 stride-2 ConvModules (`add_extra_convs`).

use super::Neck;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/necks/fpn.py";

/// The registry's constructor (`NECKS` row `FPN`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Neck>, ModelError> {
    let cfg = FpnCfg::from_cfg(cfg)?;
    Ok(Box::new(Fpn::new(p, &cfg)))
}

/// Where the extra levels' convs take their input (`add_extra_convs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraSource {
    Input,
    Lateral,
    Output,
}

/// How the coarser lateral is brought to the finer one (`upsample_cfg`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Upsample {
    /// `mode='nearest'` (MMSeg's default), to the finer lateral's size.
    Nearest,
    /// `mode='bilinear'` with `align_corners`.
    Bilinear(bool),
}

/// `FPN(in_channels, out_channels, num_outs, start_level=0, end_level=-1,
/// add_extra_convs=False, extra_convs_on_inputs=False,
/// relu_before_extra_convs=False, no_norm_on_lateral=False, norm_cfg=None,
/// act_cfg=None, upsample_cfg=dict(mode='nearest'))`.
#[derive(Debug, Clone, PartialEq)]
pub struct FpnCfg {
    pub in_channels: Vec<i64>,
    pub out_channels: i64,
    pub num_outs: usize,
    pub start_level: usize,
    pub backbone_end_level: usize,
    pub extra: Option<ExtraSource>,
    pub relu_before_extra_convs: bool,
    pub no_norm_on_lateral: bool,
    pub norm: Option<NormCfg>,
    pub relu: bool,
    pub upsample: Upsample,
}

impl FpnCfg {
    pub fn from_cfg(d: &Dict) -> Result<FpnCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "FPN", SOURCE);
        for key in ["in_channels", "out_channels", "num_outs"] {
            c.require(key)?;
        }
        let in_channels = c.ints("in_channels", &[])?;
        let out_channels = c.int("out_channels", 0)?;
        let num_outs = c.int("num_outs", 0)?;
        let start_level = c.int("start_level", 0)?;
        let end_level = c.int("end_level", -1)?;
        let n = in_channels.len() as i64;
        let backbone_end_level = if end_level == -1 {
            if num_outs < n - start_level {
                return Err(c.config_error("num_outs must be >= len(in_channels) - start_level"));
            }
            n
        } else {
            if end_level > n || num_outs != end_level - start_level {
                return Err(c.config_error(
                    "end_level must be <= len(in_channels) and num_outs == end_level - start_level",
                ));
            }
            end_level
        };
        if start_level < 0 || start_level >= backbone_end_level {
            return Err(c.config_error(format!("start_level {start_level} is out of range")));
        }
        let on_inputs = c.flag("extra_convs_on_inputs", false);
        let extra = match c.value("add_extra_convs") {
            None | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) => Some(if on_inputs {
                ExtraSource::Input
            } else {
                ExtraSource::Output
            }),
            Some(Value::Str(s)) => Some(match s.as_str() {
                "on_input" => ExtraSource::Input,
                "on_lateral" => ExtraSource::Lateral,
                "on_output" => ExtraSource::Output,
                other => {
                    return Err(c.config_error(format!(
                        "add_extra_convs must be a bool or 'on_input', 'on_lateral', 'on_output', not '{other}'"
                    )))
                }
            }),
            Some(other) => {
                return Err(c.config_error(format!(
                    "add_extra_convs must be a bool or a string, not {}",
                    other.type_name()
                )))
            }
        };
        let relu = match c.value("act_cfg") {
            None | Some(Value::None) => false,
            Some(Value::Dict(a)) if a.get("type").and_then(Value::as_str) == Some("ReLU") => true,
            Some(_) => {
                return Err(
                    c.unsupported("act_cfg", "only None or dict(type='ReLU') is implemented")
                )
            }
        };
        let upsample = match c.dict("upsample_cfg")? {
            None => Upsample::Nearest,
            Some(u) => {
                let keys_ok = u.keys().all(|k| k == "mode" || k == "align_corners");
                match (u.get("mode").and_then(Value::as_str), keys_ok) {
                    (Some("nearest"), true) => Upsample::Nearest,
                    (Some("bilinear"), true) => Upsample::Bilinear(
                        u.get("align_corners").is_some_and(Value::truthy),
                    ),
                    _ => {
                        return Err(c.unsupported(
                            "upsample_cfg",
                            "only mode='nearest' or 'bilinear' to the finer level's size is implemented",
                        ))
                    }
                }
            }
        };
        c.unimplemented("conv_cfg", &Value::None)?;
        c.inert(&["init_cfg"]);
        let cfg = FpnCfg {
            in_channels,
            out_channels,
            num_outs: num_outs as usize,
            start_level: start_level as usize,
            backbone_end_level: backbone_end_level as usize,
            extra,
            relu_before_extra_convs: c.flag("relu_before_extra_convs", false),
            no_norm_on_lateral: c.flag("no_norm_on_lateral", false),
            norm: c.batch_norm("norm_cfg")?,
            relu,
            upsample,
        };
        c.finish()?;
        Ok(cfg)
    }
}

pub struct Fpn {
    lateral_convs: Vec<ConvModule>,
    fpn_convs: Vec<ConvModule>,
    cfg: FpnCfg,
}

impl Fpn {
    pub fn new(p: &mut ParamScope, cfg: &FpnCfg) -> Fpn {
        let out = cfg.out_channels;
        let module = |p: &mut ParamScope, spec: ConvSpec, norm| {
            ConvModule::new(p, spec, norm, cfg.relu).out_of_place()
        };
        // named_parameters lists the lateral_convs ModuleList, then fpn_convs.
        let levels = cfg.start_level..cfg.backbone_end_level;
        let lateral_norm = if cfg.no_norm_on_lateral {
            None
        } else {
            cfg.norm
        };
        let lateral_convs: Vec<ConvModule> = levels
            .clone()
            .enumerate()
            .map(|(k, i)| {
                module(
                    &mut p.sub("lateral_convs").sub(k),
                    ConvSpec::new(cfg.in_channels[i], out, 1),
                    lateral_norm,
                )
            })
            .collect();
        let mut fpn_convs: Vec<ConvModule> = (0..levels.len())
            .map(|k| {
                module(
                    &mut p.sub("fpn_convs").sub(k),
                    ConvSpec::new(out, out, 3).padding(1),
                    cfg.norm,
                )
            })
            .collect();
        let extra_levels = cfg.num_outs + cfg.start_level - cfg.backbone_end_level;
        if let Some(source) = cfg.extra {
            for i in 0..extra_levels {
                let from = if i == 0 && source == ExtraSource::Input {
                    cfg.in_channels[cfg.backbone_end_level - 1]
                } else {
                    out
                };
                let k = fpn_convs.len();
                fpn_convs.push(module(
                    &mut p.sub("fpn_convs").sub(k),
                    ConvSpec::new(from, out, 3).stride(2).padding(1),
                    cfg.norm,
                ));
            }
        }
        Fpn {
            lateral_convs,
            fpn_convs,
            cfg: cfg.clone(),
        }
    }
}

impl Neck for Fpn {
    fn forward(&self, inputs: Vec<Tensor>, training: bool) -> Vec<Tensor> {
        let start = self.cfg.start_level;
        let mut laterals: Vec<Tensor> = self
            .lateral_convs
            .iter()
            .enumerate()
            .map(|(i, conv)| conv.forward(&inputs[i + start], training))
            .collect();
        let used = laterals.len();
        for i in (1..used).rev() {
            let s = laterals[i - 1].size();
            let up = match self.cfg.upsample {
                Upsample::Nearest => laterals[i].upsample_nearest2d([s[2], s[3]], None, None),
                Upsample::Bilinear(ac) => {
                    laterals[i].upsample_bilinear2d([s[2], s[3]], ac, None, None)
                }
            };
            laterals[i - 1] = &laterals[i - 1] + up;
        }
        let mut outs: Vec<Tensor> = (0..used)
            .map(|i| self.fpn_convs[i].forward(&laterals[i], training))
            .collect();
        if self.cfg.num_outs > used {
            match self.cfg.extra {
                None => {
                    for _ in 0..self.cfg.num_outs - used {
                        let last = outs.last().expect("at least one level");
                        outs.push(last.max_pool2d([1, 1], [2, 2], [0, 0], [1, 1], false));
                    }
                }
                Some(source) => {
                    let extra_source = match source {
                        ExtraSource::Input => {
                            inputs[self.cfg.backbone_end_level - 1].shallow_clone()
                        }
                        ExtraSource::Lateral => laterals[used - 1].shallow_clone(),
                        ExtraSource::Output => outs[used - 1].shallow_clone(),
                    };
                    outs.push(self.fpn_convs[used].forward(&extra_source, training));
                    for i in used + 1..self.cfg.num_outs {
                        let last = outs.last().expect("at least one level");
                        let x = if self.cfg.relu_before_extra_convs {
                            last.relu()
                        } else {
                            last.shallow_clone()
                        };
                        outs.push(self.fpn_convs[i].forward(&x, training));
                    }
                }
            }
        }
        // The inputs and laterals are the Python forward's locals: released
        // when it returns.
        drop((inputs, laterals));
        outs
    }
}

#[cfg(test)]
#[path = "fpn_tests.rs"]
mod tests;
