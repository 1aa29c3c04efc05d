//! STDC's backbones, as MMSeg's `mmseg/models/backbones/stdc.py` builds
//! them: `STDCNet` (stacked short-term dense concatenate modules) and
//! `STDCContextPathNet`, which runs a backbone (an STDCNet) and adds
//! BiSeNet's context path and a feature fusion module.
//!
//! Fan et al., "Rethinking BiSeNet For Real-time Semantic Segmentation",
//! CVPR 2021, arXiv:2104.13188.
//!
//! STDCNet: two strided 3x3 ConvModules, then three stages of
//! `STDCModule`s (the first of each strided). An STDC module runs a 1x1
//! ConvModule and `num_convs - 1` 3x3 ones in a chain, each halving the
//! channels (the last keeps them), and concatenates every output (`cat`:
//! the first one, at stride 2, average-pooled; the chain goes on from its
//! depthwise strided conv) or adds their concatenation to the input (`add`:
//! the input cloned first; at stride 2 a depthwise-separable skip). Outputs:
//! the three stages' maps (1/8, 1/16, 1/32).
//!
//! STDCContextPathNet: the deepest map's global average gives a 1x1
//! ConvModule, upsampled (nearest by default); from deep to shallow, each
//! attention refinement module's output plus that context is upsampled to
//! the next map and convolved; the feature fusion module concatenates the
//! shallowest map with the last of these, convolves it and adds it gated by
//! a squeeze-and-excitation attention. Outputs: the shallowest backbone map
//! (for `STDCHead`), the context path's maps, the fusion.

use super::bisenetv1::AttentionRefinement;
use super::{Backbone, BACKBONES};
use crate::config::{Dict, Value};
use crate::models::component_config::{type_of, ComponentConfig};
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::registry::lookup;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/stdc.py";

/// The registry's constructor (`BACKBONES` row `STDCNet`).
pub fn build_stdc_net(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = StdcNetCfg::from_cfg(cfg)?;
    Ok(Box::new(StdcNet::new(p, &cfg)))
}

/// The registry's constructor (`BACKBONES` row `STDCContextPathNet`).
pub fn build_context_path_net(
    p: &mut ParamScope,
    cfg: &Dict,
) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = StdcContextPathNetCfg::from_cfg(cfg)?;
    Ok(Box::new(StdcContextPathNet::new(p, &cfg)?))
}

/// `STDCModule`'s `fusion_type` (STDCNet's `bottleneck_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fusion {
    /// `'add'`: the concatenated outputs plus the (skipped) input.
    Add,
    /// `'cat'`: the outputs concatenated, the first one pooled at stride 2.
    Cat,
}

/// `STDCNet(stdc_type, in_channels, channels, bottleneck_type, norm_cfg,
/// act_cfg, num_convs=4, with_final_conv=False, pretrained=None,
/// init_cfg=None)`.
#[derive(Debug, Clone, PartialEq)]
pub struct StdcNetCfg {
    /// `arch_settings[stdc_type]`: the strides of each stage's modules.
    pub stage_strides: Vec<Vec<i64>>,
    pub in_channels: i64,
    pub channels: [i64; 5],
    pub bottleneck_type: Fusion,
    pub norm: Option<NormCfg>,
    /// `act_cfg`: a ReLU or `None`.
    pub relu: bool,
    pub num_convs: i64,
    pub with_final_conv: bool,
}

impl StdcNetCfg {
    pub fn from_cfg(d: &Dict) -> Result<StdcNetCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "STDCNet", SOURCE);
        // Required positional arguments.
        for key in [
            "stdc_type",
            "in_channels",
            "channels",
            "bottleneck_type",
            "norm_cfg",
            "act_cfg",
        ] {
            c.require(key)?;
        }
        let stdc_type = c.string("stdc_type")?.unwrap_or("None");
        let stage_strides = match stdc_type {
            "STDCNet1" => vec![vec![2, 1], vec![2, 1], vec![2, 1]],
            "STDCNet2" => vec![vec![2, 1, 1, 1], vec![2, 1, 1, 1, 1], vec![2, 1, 1]],
            other => return Err(c.config_error(format!("invalid structure {other} for STDCNet."))),
        };
        let bottleneck_type = match c.string("bottleneck_type")?.unwrap_or("None") {
            "add" => Fusion::Add,
            "cat" => Fusion::Cat,
            other => {
                return Err(c.config_error(format!(
                    "bottleneck_type must be `add` or `cat`, got {other}"
                )))
            }
        };
        let channels = match c.ints("channels", &[])?[..] {
            [a, b, e, f, g] => [a, b, e, f, g],
            ref other => {
                return Err(c.config_error(format!(
                    "invalid channels length {} for STDCNet.",
                    other.len()
                )))
            }
        };
        let num_convs = c.int("num_convs", 4)?;
        if num_convs <= 1 {
            // STDCModule's `assert num_convs > 1`.
            return Err(c.config_error(format!("num_convs must be > 1, got {num_convs}")));
        }
        let cfg = StdcNetCfg {
            stage_strides,
            in_channels: c.int("in_channels", 3)?,
            channels,
            bottleneck_type,
            norm: c.batch_norm("norm_cfg")?,
            relu: c.relu_or_none("act_cfg", true)?,
            num_convs,
            with_final_conv: c.flag("with_final_conv", false),
        };
        // `pretrained` is stored (as `prtrained`) and never read; init_cfg
        // loads weights.
        c.inert(&["pretrained", "init_cfg"]);
        c.finish()?;
        Ok(cfg)
    }
}

/// `STDCModule`: `layers.0` (1x1, half the channels; with a depthwise
/// strided `downsample` as `layers.0.1` for `add`), `layers.1..` (3x3,
/// halving), `downsample` (`cat` at stride 2, registered after the layers),
/// `skip` (`add` at stride 2: depthwise strided + 1x1, both linear).
struct StdcModule {
    layers: Vec<ConvModule>,
    downsample: Option<ConvModule>,
    skip: Option<[ConvModule; 2]>,
    fusion: Fusion,
}

impl StdcModule {
    fn new(p: &mut ParamScope, (in_ch, out_ch): (i64, i64), stride: i64, c: &StdcNetCfg) -> Self {
        let fusion = c.bottleneck_type;
        let with_downsample = stride == 2;
        let half = out_ch / 2;
        let down_spec = ConvSpec::new(half, half, 3)
            .stride(2)
            .padding(1)
            .groups(half);
        let add_down = with_downsample && fusion == Fusion::Add;
        let mut lp = p.sub("layers");
        // conv_0 keeps ConvModule's own act_cfg (a ReLU), not STDCNet's.
        let conv_0 = ConvSpec::new(in_ch, half, 1);
        let (conv_0, mut downsample) = if add_down {
            let mut sp = lp.sub(0);
            let conv_0 = ConvModule::new(&mut sp.sub(0), conv_0, c.norm, true);
            (
                conv_0,
                Some(ConvModule::new(&mut sp.sub(1), down_spec, c.norm, false)),
            )
        } else {
            (ConvModule::new(&mut lp.sub(0), conv_0, c.norm, true), None)
        };
        let mut layers = vec![conv_0];
        for i in 1..c.num_convs {
            let out_factor = if i != c.num_convs - 1 {
                1 << (i + 1)
            } else {
                1 << i
            };
            let spec = ConvSpec::new(out_ch / (1 << i), out_ch / out_factor, 3).padding(1);
            layers.push(ConvModule::new(&mut lp.sub(i), spec, c.norm, c.relu));
        }
        if with_downsample && fusion == Fusion::Cat {
            downsample = Some(ConvModule::new(
                &mut p.sub("downsample"),
                down_spec,
                c.norm,
                false,
            ));
        }
        let skip = add_down.then(|| {
            let mut sp = p.sub("skip");
            let depthwise = ConvSpec::new(in_ch, in_ch, 3)
                .stride(2)
                .padding(1)
                .groups(in_ch);
            [
                ConvModule::new(&mut sp.sub(0), depthwise, c.norm, false),
                ConvModule::new(
                    &mut sp.sub(1),
                    ConvSpec::new(in_ch, out_ch, 1),
                    c.norm,
                    false,
                ),
            ]
        });
        StdcModule {
            layers,
            downsample,
            skip,
            fusion,
        }
    }

    fn forward(&self, inputs: &Tensor, training: bool) -> Tensor {
        match self.fusion {
            Fusion::Add => self.forward_add(inputs, training),
            Fusion::Cat => self.forward_cat(inputs, training),
        }
    }

    /// `forward_add`: `cat(outputs) + skip(inputs)`, `[B, out, h / s, w / s]`.
    fn forward_add(&self, inputs: &Tensor, training: bool) -> Tensor {
        let mut layer_outputs = Vec::with_capacity(self.layers.len());
        let mut x = inputs.copy(); // inputs.clone()
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x, training);
            if let (0, Some(downsample)) = (i, &self.downsample) {
                // layers[0] is nn.Sequential(conv_0, downsample).
                x = downsample.forward(&x, training);
            }
            layer_outputs.push(x.shallow_clone());
        }
        let skipped = match &self.skip {
            Some([depthwise, pointwise]) => {
                let y = depthwise.forward(inputs, training);
                pointwise.forward(&y, training)
            }
            None => inputs.shallow_clone(),
        };
        Tensor::cat(&layer_outputs, 1) + skipped
    }

    /// `forward_cat`: the outputs concatenated, `[B, out, h / s, w / s]`.
    fn forward_cat(&self, inputs: &Tensor, training: bool) -> Tensor {
        let x0 = self.layers[0].forward(inputs, training); // [B, out / 2, h, w]
        let mut layer_outputs = vec![x0.shallow_clone()];
        let mut x: Option<Tensor> = None;
        for (i, layer) in self.layers[1..].iter().enumerate() {
            let y = match (i, &self.downsample, &x) {
                (0, Some(downsample), _) => {
                    layer.forward(&downsample.forward(&x0, training), training)
                }
                (0, None, _) => layer.forward(&x0, training),
                (_, _, Some(prev)) => layer.forward(prev, training),
                (_, _, None) => unreachable!("the chain's previous output"),
            };
            layer_outputs.push(y.shallow_clone());
            x = Some(y);
        }
        if self.downsample.is_some() {
            // self.skip: nn.AvgPool2d(kernel_size=3, stride=2, padding=1).
            layer_outputs[0] = x0.avg_pool2d([3, 3], [2, 2], [1, 1], false, true, None);
        }
        Tensor::cat(&layer_outputs, 1)
    }
}

pub struct StdcNet {
    /// `stages.0`, `stages.1`: the strided 3x3 ConvModules.
    shallow: [ConvModule; 2],
    /// `stages.2..`: each an `nn.Sequential` of STDC modules.
    stages: Vec<Vec<StdcModule>>,
    final_conv: Option<ConvModule>,
}

impl StdcNet {
    pub fn new(p: &mut ParamScope, c: &StdcNetCfg) -> StdcNet {
        let ch = c.channels;
        let strided = |from, to| ConvSpec::new(from, to, 3).stride(2).padding(1);
        let mut sp = p.sub("stages");
        let shallow = [
            ConvModule::new(
                &mut sp.sub(0),
                strided(c.in_channels, ch[0]),
                c.norm,
                c.relu,
            ),
            ConvModule::new(&mut sp.sub(1), strided(ch[0], ch[1]), c.norm, c.relu),
        ];
        let stages = c
            .stage_strides
            .iter()
            .enumerate()
            .map(|(s, strides)| {
                let idx = s + 1;
                let mut stage = sp.sub(idx + 1);
                strides
                    .iter()
                    .enumerate()
                    .map(|(i, &stride)| {
                        let from = if i == 0 { ch[idx] } else { ch[idx + 1] };
                        StdcModule::new(&mut stage.sub(i), (from, ch[idx + 1]), stride, c)
                    })
                    .collect()
            })
            .collect();
        let final_conv = c.with_final_conv.then(|| {
            let spec = ConvSpec::new(ch[4], ch[4].max(1024), 1);
            ConvModule::new(&mut p.sub("final_conv"), spec, c.norm, c.relu)
        });
        StdcNet {
            shallow,
            stages,
            final_conv,
        }
    }
}

impl Backbone for StdcNet {
    /// The STDC stages' maps, `[B, channels[2..], H / 8 .. H / 32]` (the
    /// two shallow ones are cut).
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let x1 = self.shallow[0].forward(x, training); // [B, channels[0], H/2, W/2]
        let mut y = self.shallow[1].forward(&x1, training); // [B, channels[1], H/4, W/4]
        let mut outs = Vec::with_capacity(self.stages.len());
        for (i, stage) in self.stages.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("stages.{}", i + 2));
            for module in stage {
                y = module.forward(&y, training); // [B, channels[i + 2], ...]
            }
            outs.push(y.shallow_clone());
        }
        if let (Some(conv), Some(last)) = (&self.final_conv, outs.last_mut()) {
            *last = conv.forward(last, training);
        }
        outs
    }
}

/// `FeatureFusionModule(in_channels, out_channels, scale_factor=4,
/// norm_cfg=dict(type='BN'), act_cfg=dict(type='ReLU'), init_cfg=None)`,
/// from STDCContextPathNet's `ffm_cfg`.
#[derive(Debug, Clone, PartialEq)]
pub struct FfmCfg {
    pub in_channels: i64,
    pub out_channels: i64,
    pub scale_factor: i64,
    pub norm: Option<NormCfg>,
    pub relu: bool,
}

impl FfmCfg {
    fn from_cfg(d: &Dict) -> Result<FfmCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "FeatureFusionModule", SOURCE);
        c.require("in_channels")?;
        c.require("out_channels")?;
        let cfg = FfmCfg {
            in_channels: c.int("in_channels", 0)?,
            out_channels: c.int("out_channels", 0)?,
            scale_factor: c.int("scale_factor", 4)?,
            norm: c.batch_norm_or_bn("norm_cfg")?,
            relu: c.relu_or_none("act_cfg", true)?,
        };
        if cfg.scale_factor < 1 || cfg.out_channels / cfg.scale_factor < 1 {
            return Err(c.config_error("out_channels // scale_factor must be at least 1"));
        }
        c.inert(&["init_cfg"]);
        c.finish()?;
        Ok(cfg)
    }
}

/// STDC's `FeatureFusionModule`: `conv0` on the concatenation, then
/// `x + x * attention(x)`, `attention` being a global pool, `attention.1`
/// (1x1 to `out / scale_factor`, no norm, no bias, ReLU), `attention.2`
/// (1x1 back, linear) and a sigmoid.
struct FeatureFusion {
    conv0: ConvModule,
    attention: [ConvModule; 2],
}

impl FeatureFusion {
    fn new(p: &mut ParamScope, c: &FfmCfg) -> FeatureFusion {
        let (out, mid) = (c.out_channels, c.out_channels / c.scale_factor);
        let conv0 = ConvModule::new(
            &mut p.sub("conv0"),
            ConvSpec::new(c.in_channels, out, 1),
            c.norm,
            c.relu,
        );
        let mut ap = p.sub("attention");
        let attention = [
            ConvModule::with_conv_bias(
                &mut ap.sub(1),
                ConvSpec::new(out, mid, 1),
                None,
                c.relu,
                false,
            ),
            ConvModule::with_conv_bias(
                &mut ap.sub(2),
                ConvSpec::new(mid, out, 1),
                None,
                false,
                false,
            ),
        ];
        FeatureFusion { conv0, attention }
    }

    fn forward(&self, spatial: &Tensor, context: &Tensor, training: bool) -> Tensor {
        let inputs = Tensor::cat(&[spatial, context], 1); // [B, in, h, w]
        let x = self.conv0.forward(&inputs, training); // [B, out, h, w]
        let attn = {
            let pooled = x.adaptive_avg_pool2d([1, 1]); // [B, out, 1, 1]
            let a = self.attention[0].forward(&pooled, training);
            self.attention[1].forward(&a, training).sigmoid()
        };
        let x_attn = &x * &attn;
        &x_attn + &x
    }
}

/// `upsample_mode` with its `align_corners`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Upsample {
    Nearest,
    Bilinear { align_corners: bool },
}

impl Upsample {
    /// mmseg's `resize(x, size, mode=..., align_corners=...)`.
    fn resize(self, x: &Tensor, like: &Tensor) -> Tensor {
        let size = (like.size()[2], like.size()[3]);
        match self {
            Upsample::Nearest => x.upsample_nearest2d([size.0, size.1], None, None),
            Upsample::Bilinear { align_corners } => resize_bilinear(x, size, align_corners),
        }
    }
}

/// `STDCContextPathNet(backbone_cfg, last_in_channels=(1024, 512),
/// out_channels=128, ffm_cfg=dict(in_channels=512, out_channels=256,
/// scale_factor=4), upsample_mode='nearest', align_corners=None,
/// norm_cfg=dict(type='BN'), init_cfg=None)`.
#[derive(Debug, Clone, PartialEq)]
pub struct StdcContextPathNetCfg {
    pub backbone_cfg: Dict,
    pub last_in_channels: Vec<i64>,
    pub out_channels: i64,
    pub ffm: FfmCfg,
    pub upsample: Upsample,
    pub norm: Option<NormCfg>,
}

impl StdcContextPathNetCfg {
    pub fn from_cfg(d: &Dict) -> Result<StdcContextPathNetCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "STDCContextPathNet", SOURCE);
        let backbone_cfg = c
            .dict("backbone_cfg")?
            .ok_or_else(|| c.config_error("lacks `backbone_cfg`"))?
            .clone();
        let last_in_channels = c.ints("last_in_channels", &[1024, 512])?;
        if last_in_channels.len() < 2 {
            return Err(c.config_error(
                "`last_in_channels` needs at least 2 entries (the fusion takes the second refined map)",
            ));
        }
        let ffm = match c.dict("ffm_cfg")? {
            Some(f) => FfmCfg::from_cfg(f)?,
            None if c.has("ffm_cfg") => return Err(c.config_error("`ffm_cfg` must be a dict")),
            None => FfmCfg {
                in_channels: 512,
                out_channels: 256,
                scale_factor: 4,
                norm: Some(NormCfg::BN_DEFAULT),
                relu: true,
            },
        };
        let upsample = read_upsample(&mut c)?;
        let cfg = StdcContextPathNetCfg {
            backbone_cfg,
            last_in_channels,
            out_channels: c.int("out_channels", 128)?,
            ffm,
            upsample,
            norm: c.batch_norm_or_bn("norm_cfg")?,
        };
        c.inert(&["init_cfg"]);
        c.finish()?;
        Ok(cfg)
    }
}

/// `upsample_mode` and `align_corners`, as `F.interpolate` takes them.
fn read_upsample(c: &mut ComponentConfig) -> Result<Upsample, ModelError> {
    let align_corners = match c.value("align_corners") {
        None | Some(Value::None) => None,
        Some(v) => Some(v.truthy()),
    };
    match (c.string("upsample_mode")?.unwrap_or("nearest"), align_corners) {
        ("nearest", None) => Ok(Upsample::Nearest),
        ("nearest", Some(_)) => Err(c.config_error(
            "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | trilinear",
        )),
        ("bilinear", a) => Ok(Upsample::Bilinear {
            align_corners: a.unwrap_or(false),
        }),
        (other, _) => Err(c.unsupported(
            "upsample_mode",
            format!("'{other}' (only 'nearest' and 'bilinear' are implemented)"),
        )),
    }
}

pub struct StdcContextPathNet {
    backbone: Box<dyn Backbone>,
    arms: Vec<AttentionRefinement>,
    convs: Vec<ConvModule>,
    conv_avg: ConvModule,
    ffm: FeatureFusion,
    upsample: Upsample,
}

impl StdcContextPathNet {
    pub fn new(
        p: &mut ParamScope,
        c: &StdcContextPathNetCfg,
    ) -> Result<StdcContextPathNet, ModelError> {
        let build_backbone = lookup(
            BACKBONES,
            "backbone (STDCContextPathNet's backbone_cfg)",
            type_of(&c.backbone_cfg, "backbone_cfg")?,
        )?;
        let backbone = build_backbone(&mut p.sub("backbone"), &c.backbone_cfg)?;
        let out = c.out_channels;
        // `arms` and `convs` are ModuleLists: all arms register before the convs.
        let arms = (0..c.last_in_channels.len())
            .map(|i| {
                AttentionRefinement::new(&mut p.sub("arms").sub(i), c.last_in_channels[i], out)
            })
            .collect();
        let convs = (0..c.last_in_channels.len())
            .map(|i| {
                let spec = ConvSpec::new(out, out, 3).padding(1);
                ConvModule::new(&mut p.sub("convs").sub(i), spec, c.norm, true)
            })
            .collect();
        let conv_avg = ConvModule::new(
            &mut p.sub("conv_avg"),
            ConvSpec::new(c.last_in_channels[0], out, 1),
            c.norm,
            true,
        );
        let ffm = FeatureFusion::new(&mut p.sub("ffm"), &c.ffm);
        Ok(StdcContextPathNet {
            backbone,
            arms,
            convs,
            conv_avg,
            ffm,
            upsample: c.upsample,
        })
    }
}

impl Backbone for StdcContextPathNet {
    /// `[outs[0] (the backbone's shallowest map), the refined context maps
    /// (deep to shallow), the fusion]`.
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let outs = {
            let _part = crate::models::scope::enter("backbone");
            self.backbone.forward(x, training)
        };
        let n = outs.len();
        assert!(
            n > self.arms.len(),
            "STDCContextPathNet: {} attention refinement modules need {} backbone outputs, got {n}",
            self.arms.len(),
            self.arms.len() + 1
        );
        let context_part = crate::models::scope::enter("context_path");
        let avg = outs[n - 1].adaptive_avg_pool2d([1, 1]); // [B, last_in[0], 1, 1]
        let avg_feat = self.conv_avg.forward(&avg, training); // [B, out, 1, 1]
        let mut feature_up = self.upsample.resize(&avg_feat, &outs[n - 1]);
        let mut arms_out = Vec::with_capacity(self.arms.len());
        // Python's `x_arm` lives until the next one replaces it.
        let mut x_arm: Option<Tensor> = None;
        for (i, (arm, conv)) in self.arms.iter().zip(&self.convs).enumerate() {
            let refined = arm.forward(&outs[n - 1 - i], training) + &feature_up;
            let x_arm = x_arm.insert(refined); // [B, out, h_i, w_i]
            feature_up = self.upsample.resize(x_arm, &outs[n - 2 - i]);
            feature_up = conv.forward(&feature_up, training); // [B, out, h_(i+1), w_(i+1)]
            arms_out.push(feature_up.shallow_clone());
        }
        drop(context_part);
        let feat_fuse = {
            let _part = crate::models::scope::enter("ffm");
            self.ffm.forward(&outs[0], &arms_out[1], training)
        };
        let mut outputs = vec![outs[0].shallow_clone()];
        outputs.extend(arms_out);
        outputs.push(feat_fuse);
        // Every Python local (avg, avg_feat, feature_up, x_arm, outs) lives until return.
        drop((avg, avg_feat, feature_up, x_arm, outs));
        outputs
    }
}

#[cfg(test)]
#[path = "stdc_tests.rs"]
mod tests;
