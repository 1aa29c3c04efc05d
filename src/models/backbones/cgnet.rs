//! CGNet's backbone, as MMSeg's `mmseg/models/backbones/cgnet.py` builds it:
//! a three-conv stem, two stages of context guided blocks, and the input
//! image average-pooled and injected at 1/2 and 1/4; three outputs.
//!
//! Wu et al., "CGNet: A Light-weight Context Guided Network for Semantic
//! Segmentation", IEEE TIP 2020, arXiv:1811.08201.
//!
//! Every activation is a `PReLU` (MMSeg sets its `num_parameters` to the
//! channels of each ConvModule), out of place.

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::{BatchNorm2d, Conv2d, ConvSpec, Linear};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/cgnet.py";

/// The registry's constructor (`BACKBONES` row `CGNet`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = CgNetCfg::from_cfg(cfg)?;
    Ok(Box::new(CgNet::new(p, &cfg)))
}

/// `CGNet(in_channels=3, num_channels=(32, 64, 128), num_blocks=(3, 21),
/// dilations=(2, 4), reductions=(8, 16), conv_cfg=None,
/// norm_cfg=dict(type='BN', requires_grad=True), act_cfg=dict(type='PReLU'),
/// norm_eval=False, with_cp=False, ...)`.
#[derive(Debug, Clone, PartialEq)]
pub struct CgNetCfg {
    pub in_channels: i64,
    pub num_channels: [i64; 3],
    pub num_blocks: [i64; 2],
    pub dilations: [i64; 2],
    pub reductions: [i64; 2],
    pub norm: NormCfg,
}

impl CgNetCfg {
    pub fn from_cfg(d: &Dict) -> Result<CgNetCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "CGNet", SOURCE);
        let num_channels = match c.ints("num_channels", &[32, 64, 128])?[..] {
            [a, b, e] => [a, b, e],
            _ => return Err(c.config_error("`num_channels` must have 3 entries")),
        };
        let num_blocks = pair(&mut c, "num_blocks", [3, 21])?;
        let dilations = pair(&mut c, "dilations", [2, 4])?;
        let reductions = pair(&mut c, "reductions", [8, 16])?;
        // GlobalContextExtractor's `assert reduction >= 1 and channel >= reduction`.
        for (channels, reduction) in [
            (num_channels[1], reductions[0]),
            (num_channels[2], reductions[1]),
        ] {
            if reduction < 1 || channels < reduction {
                return Err(c.config_error(format!(
                    "reduction {reduction} must be at least 1 and at most the stage's {channels} channels"
                )));
            }
        }
        let norm = c
            .batch_norm_or_bn("norm_cfg")?
            .ok_or_else(|| c.config_error("`norm_cfg` None: CGNet builds norm layers from it"))?;
        let cfg = CgNetCfg {
            in_channels: c.int("in_channels", 3)?,
            num_channels,
            num_blocks,
            dilations,
            reductions,
            norm,
        };
        c.default_activation("act_cfg", "PReLU")?;
        c.unimplemented("conv_cfg", &Value::None)?;
        c.unimplemented("norm_eval", &Value::Bool(false))?;
        c.unimplemented("with_cp", &Value::Bool(false))?;
        c.inert(&["pretrained", "init_cfg"]);
        c.finish()?;
        Ok(cfg)
    }
}

/// A per-stage setting of two entries (stage 1, stage 2).
fn pair(c: &mut ComponentConfig, key: &str, default: [i64; 2]) -> Result<[i64; 2], ModelError> {
    match c.ints(key, &default)?[..] {
        [a, b] => Ok([a, b]),
        _ => Err(c.config_error(format!("`{key}` must have 2 entries"))),
    }
}

/// `nn.PReLU(num_parameters)`, out of place.
struct PRelu {
    weight: Tensor,
}

impl PRelu {
    fn new(p: &mut ParamScope, channels: i64) -> Self {
        // nn.PReLU starts at 0.25; the value does not change memory or speed.
        PRelu {
            weight: p.param_ones("weight", &[channels]),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.prelu(&self.weight)
    }
}

/// `nn.Sequential(BN, nn.PReLU)` (`norm_prelu_*`) or, after a conv, the
/// rest of mmcv's `ConvModule` with `act_cfg=dict(type='PReLU')`.
struct NormPRelu {
    bn: BatchNorm2d,
    act: PRelu,
}

impl NormPRelu {
    /// Under `bn` and `act` (`ConvModule`'s `bn`, `activate`; a
    /// Sequential's `0`, `1`).
    fn new(p: &mut ParamScope, channels: i64, norm: &NormCfg, names: [&str; 2]) -> Self {
        NormPRelu {
            bn: BatchNorm2d::from_cfg(&mut p.sub(names[0]), channels, norm),
            act: PRelu::new(&mut p.sub(names[1]), channels),
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let y = self.bn.forward(x, training);
        self.act.forward(&y)
    }
}

/// mmcv's `ConvModule` (no conv bias) with a BN and a PReLU.
struct ConvBnPRelu {
    conv: Conv2d,
    norm_act: NormPRelu,
}

impl ConvBnPRelu {
    fn new(p: &mut ParamScope, spec: ConvSpec, norm: &NormCfg) -> Self {
        ConvBnPRelu {
            conv: Conv2d::new(&mut p.sub("conv"), spec.bias(false)),
            norm_act: NormPRelu::new(p, spec.out_channels, norm, ["bn", "activate"]),
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let y = self.conv.forward(x);
        self.norm_act.forward(&y, training)
    }
}

/// `GlobalContextExtractor`: `x * sigmoid(fc(relu(fc(mean(x)))))`.
struct GlobalContext {
    fc0: Linear,
    fc2: Linear,
}

impl GlobalContext {
    fn new(p: &mut ParamScope, channels: i64, reduction: i64) -> Self {
        let mut fc = p.sub("fc");
        GlobalContext {
            fc0: Linear::new(&mut fc.sub(0), channels, channels / reduction, true),
            fc2: Linear::new(&mut fc.sub(2), channels / reduction, channels, true),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let (b, c) = (x.size()[0], x.size()[1]);
        // AdaptiveAvgPool2d(1) is a mean over H, W; the view shares it.
        let y = x.adaptive_avg_pool2d([1, 1]).view([b, c]);
        let mut h = self.fc0.forward(&y); // [B, C / r]
        let _ = h.relu_();
        let y = self.fc2.forward(&h).sigmoid().view([b, c, 1, 1]);
        x * &y
    }
}

/// `ContextGuidedBlock`: a ConvModule (3x3 stride 2 when downsampling,
/// else 1x1 to half the channels), a local and a dilated surrounding
/// depthwise conv, concatenated, BN, PReLU, a 1x1 bottleneck when
/// downsampling, the global context gate, and the input added back unless
/// downsampling.
struct ContextGuidedBlock {
    conv1x1: ConvBnPRelu,
    f_loc: Conv2d,
    f_sur: Conv2d,
    norm_act: NormPRelu,
    bottleneck: Option<Conv2d>,
    f_glo: GlobalContext,
}

/// A block's channels and settings.
struct BlockShape {
    in_channels: i64,
    out_channels: i64,
    dilation: i64,
    reduction: i64,
    downsample: bool,
}

impl ContextGuidedBlock {
    fn new(p: &mut ParamScope, s: &BlockShape, norm: &NormCfg) -> Self {
        let channels = if s.downsample {
            s.out_channels
        } else {
            s.out_channels / 2
        };
        let (kernel, stride) = if s.downsample { (3, 2) } else { (1, 1) };
        let conv1x1 = ConvBnPRelu::new(
            &mut p.sub("conv1x1"),
            ConvSpec::new(s.in_channels, channels, kernel)
                .stride(stride)
                .padding((kernel - 1) / 2),
            norm,
        );
        let depthwise = |p: &mut ParamScope, name: &str, dilation: i64| {
            Conv2d::new(
                &mut p.sub(name),
                ConvSpec::new(channels, channels, 3)
                    .padding(dilation)
                    .dilation(dilation)
                    .groups(channels)
                    .bias(false),
            )
        };
        let f_loc = depthwise(p, "f_loc", 1);
        let f_sur = depthwise(p, "f_sur", s.dilation);
        // The block's own `activate` is nn.PReLU(2 * channels).
        let norm_act = NormPRelu::new(p, 2 * channels, norm, ["bn", "activate"]);
        let bottleneck = s.downsample.then(|| {
            Conv2d::new(
                &mut p.sub("bottleneck"),
                ConvSpec::new(2 * channels, s.out_channels, 1).bias(false),
            )
        });
        let f_glo = GlobalContext::new(&mut p.sub("f_glo"), s.out_channels, s.reduction);
        ContextGuidedBlock {
            conv1x1,
            f_loc,
            f_sur,
            norm_act,
            bottleneck,
            f_glo,
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let out = self.conv1x1.forward(x, training); // [B, ch, H', W']
        let loc = self.f_loc.forward(&out);
        let sur = self.f_sur.forward(&out);
        let mut joi_feat = Tensor::cat(&[&loc, &sur], 1); // [B, 2 ch, H', W']
        joi_feat = self.norm_act.forward(&joi_feat, training);
        if let Some(bottleneck) = &self.bottleneck {
            joi_feat = bottleneck.forward(&joi_feat); // [B, out, H', W']
        }
        let out = self.f_glo.forward(&joi_feat);
        let result = match self.bottleneck {
            None => x + &out,
            Some(_) => out,
        };
        // The Python locals (loc, sur, joi_feat, out) live until return.
        drop((loc, sur, joi_feat));
        result
    }
}

/// `InputInjection(n)`: `n` times `nn.AvgPool2d(3, stride=2, padding=1)`.
fn inject(x: &Tensor, times: usize) -> Tensor {
    let mut y = x.shallow_clone();
    for _ in 0..times {
        y = y.avg_pool2d([3, 3], [2, 2], [1, 1], false, true, None);
    }
    y
}

pub struct CgNet {
    stem: Vec<ConvBnPRelu>,
    norm_prelu_0: NormPRelu,
    level1: Vec<ContextGuidedBlock>,
    norm_prelu_1: NormPRelu,
    level2: Vec<ContextGuidedBlock>,
    norm_prelu_2: NormPRelu,
}

impl CgNet {
    pub fn new(p: &mut ParamScope, c: &CgNetCfg) -> CgNet {
        let [c0, c1, c2] = c.num_channels;
        let norm = &c.norm;
        let stem = (0..3)
            .map(|i| {
                let from = if i == 0 { c.in_channels } else { c0 };
                let stride = if i == 0 { 2 } else { 1 };
                let spec = ConvSpec::new(from, c0, 3).stride(stride).padding(1);
                ConvBnPRelu::new(&mut p.sub("stem").sub(i), spec, norm)
            })
            .collect();
        let seq = ["0", "1"];
        let norm_prelu_0 =
            NormPRelu::new(&mut p.sub("norm_prelu_0"), c0 + c.in_channels, norm, seq);
        let level =
            |p: &mut ParamScope, stage: usize, from: i64, to: i64| -> Vec<ContextGuidedBlock> {
                (0..c.num_blocks[stage])
                    .map(|i| {
                        let shape = BlockShape {
                            in_channels: if i == 0 { from } else { to },
                            out_channels: to,
                            dilation: c.dilations[stage],
                            reduction: c.reductions[stage],
                            downsample: i == 0,
                        };
                        let name = format!("level{}", stage + 1);
                        ContextGuidedBlock::new(&mut p.sub(name).sub(i), &shape, norm)
                    })
                    .collect()
            };
        let level1 = level(p, 0, c0 + c.in_channels, c1);
        let cur = 2 * c1 + c.in_channels;
        let norm_prelu_1 = NormPRelu::new(&mut p.sub("norm_prelu_1"), cur, norm, seq);
        let level2 = level(p, 1, cur, c2);
        let norm_prelu_2 = NormPRelu::new(&mut p.sub("norm_prelu_2"), 2 * c2, norm, seq);
        CgNet {
            stem,
            norm_prelu_0,
            level1,
            norm_prelu_1,
            level2,
            norm_prelu_2,
        }
    }

    /// A stage's blocks; `(x, down)`: the last block's output and the first's.
    fn run_level(blocks: &[ContextGuidedBlock], x: Tensor, training: bool) -> (Tensor, Tensor) {
        let mut x = x;
        let mut down = None;
        for (i, block) in blocks.iter().enumerate() {
            x = block.forward(&x, training);
            if i == 0 {
                down = Some(x.shallow_clone());
            }
        }
        let down = down.expect("CGNet's stages have at least one block");
        (x, down)
    }
}

impl Backbone for CgNet {
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let (inp_2x, inp_4x, out0) = {
            let _part = crate::models::scope::enter("stage0");
            let inp_2x = inject(x, 1); // [B, 3, H/2, W/2]
            let inp_4x = inject(x, 2); // [B, 3, H/4, W/4]
            let mut y = x.shallow_clone();
            for layer in &self.stem {
                y = layer.forward(&y, training); // [B, c0, H/2, W/2]
            }
            let out0 = self
                .norm_prelu_0
                .forward(&Tensor::cat(&[&y, &inp_2x], 1), training);
            (inp_2x, inp_4x, out0)
        };
        let (down1, out1) = {
            let _part = crate::models::scope::enter("level1");
            let (y, down1) = Self::run_level(&self.level1, out0.shallow_clone(), training);
            let cat = Tensor::cat(&[&y, &down1, &inp_4x], 1); // [B, 2 c1 + 3, H/4, W/4]
            (down1, self.norm_prelu_1.forward(&cat, training))
        };
        let (down2, out2) = {
            let _part = crate::models::scope::enter("level2");
            let (y, down2) = Self::run_level(&self.level2, out1.shallow_clone(), training);
            let cat = Tensor::cat(&[&down2, &y], 1); // [B, 2 c2, H/8, W/8]
            (down2, self.norm_prelu_2.forward(&cat, training))
        };
        // inp_2x, inp_4x, down1 and down2 are locals until return.
        drop((inp_2x, inp_4x, down1, down2));
        vec![out0, out1, out2]
    }
}

#[cfg(test)]
#[path = "cgnet_tests.rs"]
mod tests;
