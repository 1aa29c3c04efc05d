//! `HRNet` (HRNetV2) as MMSeg's `mmseg/models/backbones/hrnet.py` builds
//! it: the stem, `layer1`, then stages 2-4 of `HRModule`s joined by
//! transition layers.
//!
//! Sun et al., "Deep High-Resolution Representation Learning for Human Pose
//! Estimation", CVPR 2019, arXiv:1902.09212; the segmentation variant from
//! Sun et al., "High-Resolution Representations for Labeling Pixels and
//! Regions", arXiv:1904.04514.
//!
//! The stem (two stride-2 3x3 convs, each with BN and ReLU) brings the input
//! to 1/4; `layer1` is a stack of residual blocks (`BasicBlock`/`Bottleneck`
//! of `resnet.rs`, as MMSeg imports them). Each later stage keeps one branch
//! per resolution (1/4, 1/8, ...) and adds one: a transition layer makes the
//! new branch (stride-2 3x3 conv, BN, ReLU) from the lowest-resolution one
//! and adapts the channels of the others. An `HRModule` runs residual blocks
//! on every branch, then fuses: each output branch `i` sums every branch `j`
//! brought to its resolution (1x1 conv, BN and bilinear upsampling for
//! `j > i`, a chain of stride-2 3x3 conv + BN (+ ReLU but for the last) for
//! `j < i`), then a ReLU. The backbone returns the branches of the last
//! stage, 1/4 to 1/32 in the usual four-branch setting.
//!
//! The sums follow MMSeg's Python exactly, since each form allocates
//! differently: `y = 0` then `y += ...` makes a new tensor (`t + 0`) at the
//! first term and adds in place after it, while an upsampled term is added
//! out of place (`y = y + resize(...)`); the fuse chains' ReLUs and the
//! final one are out of place, the stem's, the blocks' and the
//! transitions' in place.

use super::resnet::{BlockKind, BlockSpec, ResBlock, Style};
use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{BatchNorm2d, Conv2d, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/hrnet.py";

/// The keys MMSeg's `HRNet` reads from each `extra.stage<n>` dict.
const STAGE_KEYS: [&str; 5] = [
    "num_modules",
    "num_branches",
    "block",
    "num_blocks",
    "num_channels",
];

/// The registry's constructor (`BACKBONES` row `HRNet`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = HRNetCfg::from_cfg(cfg)?;
    Ok(Box::new(HRNet::new(p, &cfg)))
}

/// One `extra.stage<n>` dict.
#[derive(Debug, Clone, PartialEq)]
pub struct StageCfg {
    pub num_modules: i64,
    pub num_branches: i64,
    pub block: BlockKind,
    /// Blocks per branch (MMSeg builds at least one even for 0).
    pub num_blocks: Vec<i64>,
    /// Channels per branch, before the block's expansion.
    pub num_channels: Vec<i64>,
}

impl StageCfg {
    /// Channels per branch after the block's expansion (what MMSeg's
    /// `HRNet.__init__` passes to the transition and the stage).
    fn expanded_channels(&self) -> Vec<i64> {
        self.num_channels
            .iter()
            .map(|c| c * self.block.expansion())
            .collect()
    }
}

/// The backbone's settings (`model.backbone` of the config).
#[derive(Debug, Clone, PartialEq)]
pub struct HRNetCfg {
    /// `extra.stage1` .. `extra.stage4`.
    pub stages: Vec<StageCfg>,
    pub in_channels: i64,
    pub norm: NormCfg,
    pub norm_eval: bool,
    pub frozen_stages: i64,
    pub multiscale_output: bool,
}

fn config_error(what: impl std::fmt::Display) -> ModelError {
    ModelError::config("HRNet", what)
}

/// A tuple/list of ints of `extra.<stage>`.
fn int_list(stage: &str, key: &str, v: &Value) -> Result<Vec<i64>, ModelError> {
    v.as_seq()
        .and_then(|s| s.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
        .ok_or_else(|| {
            config_error(format!(
                "extra.{stage}.{key} must be a tuple of ints, not {}",
                v.type_name()
            ))
        })
}

impl StageCfg {
    fn from_extra(extra: &Dict, stage: &str) -> Result<StageCfg, ModelError> {
        let d = match extra.get(stage) {
            Some(Value::Dict(d)) => d,
            Some(other) => {
                return Err(config_error(format!(
                    "extra.{stage} must be a dict, not {}",
                    other.type_name()
                )))
            }
            None => {
                return Err(config_error(format!(
                    "`extra` lacks `{stage}` (it needs stage1 to stage4)"
                )))
            }
        };
        if let Some(key) = d.keys().find(|k| !STAGE_KEYS.contains(&k.as_str())) {
            return Err(ModelError::unsupported_in(
                "HRNet",
                SOURCE,
                format!("extra.{stage}.{key}"),
                format!(
                    "MMSeg reads only {} from a stage; \
                     segtune refuses other keys rather than ignore them",
                    STAGE_KEYS.join(", ")
                ),
            ));
        }
        let get = |key: &str| {
            d.get(key)
                .ok_or_else(|| config_error(format!("extra.{stage} lacks `{key}`")))
        };
        let int = |key: &str| {
            let v = get(key)?;
            v.as_i64().ok_or_else(|| {
                config_error(format!(
                    "extra.{stage}.{key} must be an int, not {}",
                    v.type_name()
                ))
            })
        };
        let num_modules = int("num_modules")?;
        let num_branches = int("num_branches")?;
        let block = match get("block")? {
            Value::Str(s) if s == "BASIC" => BlockKind::Basic,
            Value::Str(s) if s == "BOTTLENECK" => BlockKind::Bottleneck,
            other => {
                return Err(config_error(format!(
                    "extra.{stage}.block {} is not a block type ('BASIC' or 'BOTTLENECK')",
                    crate::config::value::python_repr(other)
                )))
            }
        };
        let num_blocks = int_list(stage, "num_blocks", get("num_blocks")?)?;
        let num_channels = int_list(stage, "num_channels", get("num_channels")?)?;
        if num_modules < 0 {
            return Err(config_error(format!(
                "extra.{stage}.num_modules must not be negative ({num_modules})"
            )));
        }
        if num_branches < 1 {
            return Err(config_error(format!(
                "extra.{stage}.num_branches must be at least 1 ({num_branches})"
            )));
        }
        // HRNet.__init__'s assertion, with HRModule._check_branches' words.
        for (what, len) in [
            ("NUM_BLOCKS", num_blocks.len()),
            ("NUM_CHANNELS", num_channels.len()),
        ] {
            if len as i64 != num_branches {
                return Err(config_error(format!(
                    "extra.{stage}: NUM_BRANCHES({num_branches}) <> {what}({len})"
                )));
            }
        }
        if let Some(c) = num_channels.iter().find(|&&c| c < 1) {
            return Err(config_error(format!(
                "extra.{stage}.num_channels must be positive, not {c}"
            )));
        }
        Ok(StageCfg {
            num_modules,
            num_branches,
            block,
            num_blocks,
            num_channels,
        })
    }
}

impl HRNetCfg {
    pub fn from_cfg(d: &Dict) -> Result<HRNetCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "HRNet", SOURCE);
        let extra = match c.value("extra") {
            Some(Value::Dict(e)) => e,
            Some(other) => {
                return Err(
                    c.config_error(format!("`extra` must be a dict, not {}", other.type_name()))
                )
            }
            None => {
                return Err(c.config_error("lacks `extra` (the stage1 to stage4 settings)"));
            }
        };
        let names = ["stage1", "stage2", "stage3", "stage4"];
        if let Some(key) = extra.keys().find(|k| !names.contains(&k.as_str())) {
            return Err(c.unsupported(
                &format!("extra.{key}"),
                "MMSeg reads only stage1 to stage4 from `extra`; segtune refuses other keys rather than ignore them",
            ));
        }
        let stages = names
            .iter()
            .map(|s| StageCfg::from_extra(extra, s))
            .collect::<Result<Vec<_>, _>>()?;
        // HRNet.forward feeds the last branch to every transition it has:
        // one that changes the channels of another existing branch gets the
        // wrong input (a channel error, or a map of the wrong size).
        for n in 1..3 {
            let pre = stages[n].expanded_channels();
            let cur = stages[n + 1].expanded_channels();
            for i in 0..pre.len().min(cur.len()) {
                if i + 1 < pre.len() && cur[i] != pre[i] {
                    return Err(c.config_error(format!(
                        "stage{} changes branch {i}'s channels ({} to {}): MMSeg's HRNet.forward \
                         applies that transition to the last branch, which it cannot run",
                        n + 2,
                        pre[i],
                        cur[i]
                    )));
                }
            }
        }
        let frozen_stages = c.int("frozen_stages", -1)?;
        if frozen_stages > 4 {
            return Err(c.config_error(format!(
                "frozen_stages must be at most 4 (there is no stage{frozen_stages})"
            )));
        }
        let norm = c.batch_norm("norm_cfg")?.unwrap_or(NormCfg::BN_DEFAULT);
        c.unimplemented("conv_cfg", &Value::None)?;
        c.unimplemented("with_cp", &Value::Bool(false))?;
        let pretrained = c.value("pretrained").is_some_and(Value::truthy);
        let init_cfg = c.value("init_cfg").is_some_and(Value::truthy);
        if pretrained && init_cfg {
            return Err(
                c.config_error("init_cfg and pretrained cannot be setting at the same time")
            );
        }
        // Weight initialisation only.
        c.inert(&["zero_init_residual"]);
        let cfg = HRNetCfg {
            stages,
            in_channels: c.int("in_channels", 3)?,
            norm,
            norm_eval: c.flag("norm_eval", false),
            frozen_stages,
            multiscale_output: c.flag("multiscale_output", true),
        };
        c.finish()?;
        Ok(cfg)
    }
}

/// `nn.Conv2d` (no bias) then BN: the `nn.Sequential(conv, bn, ...)` items
/// `0` and `1` of the transition and fuse layers.
struct ConvBn {
    conv: Conv2d,
    bn: BatchNorm2d,
}

impl ConvBn {
    /// `p`: the Sequential (`transition1.1`, `fuse_layers.0.1`).
    fn new(p: &mut ParamScope, spec: ConvSpec, norm: &NormCfg) -> ConvBn {
        let conv = Conv2d::new(&mut p.sub("0"), spec.bias(false));
        let bn = BatchNorm2d::from_cfg(&mut p.sub("1"), spec.out_channels, norm);
        ConvBn { conv, bn }
    }

    /// The conv output dies once BN has run (unless autograd keeps it), as
    /// in `nn.Sequential`.
    fn forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        self.bn.forward(&self.conv.forward(x), bn_training)
    }
}

/// `nn.Sequential` of residual blocks (`layer1`, one branch of an HRModule).
struct Blocks(Vec<ResBlock>);

impl Blocks {
    /// `HRNet._make_layer` / `HRModule._make_one_branch` (stride 1): a 1x1
    /// conv + BN shortcut on the first block when the channels change; the
    /// first block is built even for `num_blocks` 0, as MMSeg does.
    /// Returns the blocks and their output channels.
    fn new(
        p: &mut ParamScope,
        kind: BlockKind,
        inplanes: i64,
        planes: i64,
        num_blocks: i64,
        norm: &NormCfg,
    ) -> (Blocks, i64) {
        let out = planes * kind.expansion();
        let downsample = (inplanes != out).then_some((1, false));
        let mut blocks = Vec::with_capacity(num_blocks.max(1) as usize);
        for i in 0..num_blocks.max(1) {
            let spec = BlockSpec {
                kind,
                inplanes: if i == 0 { inplanes } else { out },
                planes,
                stride: 1,
                dilation: 1,
                style: Style::Pytorch,
            };
            let ds = if i == 0 { downsample } else { None };
            blocks.push(ResBlock::new(&mut p.sub(i), spec, norm, ds));
        }
        (Blocks(blocks), out)
    }

    fn forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        let mut x = x.shallow_clone();
        for block in &self.0 {
            x = block.forward(&x, bn_training);
        }
        x
    }
}

/// `fuse_layers[i][j]`: how branch `j` reaches output branch `i`.
enum Fuse {
    /// `j == i` (`None`).
    Same,
    /// `j > i`: 1x1 conv, BN, `Upsample(scale_factor=2**(j-i), bilinear)`.
    Up { conv_bn: ConvBn, scale: i64 },
    /// `j < i`: `i - j` stride-2 3x3 conv + BN, with an out-of-place ReLU
    /// after each but the last.
    Down(Vec<ConvBn>),
}

/// `HRModule`: branches of residual blocks, then the fuse layers.
struct HRModule {
    branches: Vec<Blocks>,
    /// `None` with a single branch.
    fuse_layers: Option<Vec<Vec<Fuse>>>,
}

impl HRModule {
    /// `in_channels` is MMSeg's list, shared by the stage's modules and
    /// updated by `_make_one_branch`.
    fn new(
        p: &mut ParamScope,
        stage: &StageCfg,
        in_channels: &mut [i64],
        multiscale_output: bool,
        norm: &NormCfg,
    ) -> HRModule {
        let num_branches = stage.num_branches as usize;
        let mut branches = Vec::with_capacity(num_branches);
        {
            let mut bp = p.sub("branches");
            for (b, channels) in in_channels.iter_mut().enumerate() {
                let (blocks, out) = Blocks::new(
                    &mut bp.sub(b),
                    stage.block,
                    *channels,
                    stage.num_channels[b],
                    stage.num_blocks[b],
                    norm,
                );
                *channels = out;
                branches.push(blocks);
            }
        }
        let fuse_layers = (num_branches > 1).then(|| {
            let mut fp = p.sub("fuse_layers");
            let num_out = if multiscale_output { num_branches } else { 1 };
            (0..num_out)
                .map(|i| {
                    let mut rp = fp.sub(i);
                    (0..num_branches)
                        .map(|j| {
                            let mut jp = rp.sub(j);
                            if j > i {
                                let spec = ConvSpec::new(in_channels[j], in_channels[i], 1);
                                Fuse::Up {
                                    conv_bn: ConvBn::new(&mut jp, spec, norm),
                                    scale: 1 << (j - i),
                                }
                            } else if j == i {
                                Fuse::Same
                            } else {
                                Fuse::Down(
                                    (0..i - j)
                                        .map(|k| {
                                            let to = if k == i - j - 1 {
                                                in_channels[i]
                                            } else {
                                                in_channels[j]
                                            };
                                            let spec = ConvSpec::new(in_channels[j], to, 3)
                                                .stride(2)
                                                .padding(1);
                                            ConvBn::new(&mut jp.sub(k), spec, norm)
                                        })
                                        .collect(),
                                )
                            }
                        })
                        .collect()
                })
                .collect()
        });
        HRModule {
            branches,
            fuse_layers,
        }
    }

    fn forward(&self, mut x: Vec<Tensor>, bn_training: bool) -> Vec<Tensor> {
        let Some(fuse_layers) = &self.fuse_layers else {
            return vec![self.branches[0].forward(&x[0], bn_training)];
        };
        for (i, branch) in self.branches.iter().enumerate() {
            x[i] = branch.forward(&x[i], bn_training);
        }
        // `y += t` on `y = 0`: `t.__radd__(0)`, a new tensor; in place after.
        fn add_assign(y: &mut Option<Tensor>, t: &Tensor) {
            match y {
                None => *y = Some(t.g_add_scalar(0)),
                Some(y) => {
                    let _ = y.g_add_(t);
                }
            }
        }
        let mut x_fuse = Vec::with_capacity(fuse_layers.len());
        for (i, row) in fuse_layers.iter().enumerate() {
            let mut y: Option<Tensor> = None;
            for (j, fuse) in row.iter().enumerate() {
                match fuse {
                    Fuse::Same => add_assign(&mut y, &x[j]),
                    Fuse::Up { conv_bn, scale } => {
                        let t = conv_bn.forward(&x[j], bn_training);
                        let s = t.size();
                        // Upsample: resize to int(size * scale_factor) ...
                        let up =
                            t.upsample_bilinear2d([s[2] * scale, s[3] * scale], false, None, None);
                        drop(t);
                        // ... then HRModule's own resize to x[i]'s size
                        // (a copy when the sizes already agree).
                        let target = x[i].size();
                        let up2 = up.upsample_bilinear2d([target[2], target[3]], false, None, None);
                        drop(up);
                        // `y = y + resize(...)`: out of place.
                        let sum = match &y {
                            Some(y) => y.g_add(&up2),
                            None => up2.g_add_scalar(0),
                        };
                        drop(up2);
                        y = Some(sum);
                    }
                    Fuse::Down(chain) => {
                        let mut t = x[j].shallow_clone();
                        let last = chain.len() - 1;
                        for (k, conv_bn) in chain.iter().enumerate() {
                            let z = conv_bn.forward(&t, bn_training);
                            // nn.ReLU(inplace=False) but after the last.
                            t = if k < last { z.relu() } else { z };
                        }
                        add_assign(&mut y, &t);
                    }
                }
            }
            let y = y.expect("an output branch sums at least its own branch");
            // self.relu: nn.ReLU(inplace=False).
            x_fuse.push(y.relu());
        }
        x_fuse
    }
}

/// A transition layer's entry for one branch of the next stage.
enum Transition {
    /// `None`: the branch passes as it is.
    Keep,
    /// Convs (3x3, BN, in-place ReLU each) on the last branch (a new branch:
    /// stride 2 each) or on an existing one whose channels change (stride 1).
    Convs(Vec<ConvBn>),
}

impl Transition {
    /// `HRNet._make_transition_layer(pre, cur)`, under `p` (`transition1`).
    fn layer(p: &mut ParamScope, pre: &[i64], cur: &[i64], norm: &NormCfg) -> Vec<Transition> {
        (0..cur.len())
            .map(|i| {
                let mut tp = p.sub(i);
                if i < pre.len() {
                    if cur[i] != pre[i] {
                        let spec = ConvSpec::new(pre[i], cur[i], 3).padding(1);
                        Transition::Convs(vec![ConvBn::new(&mut tp, spec, norm)])
                    } else {
                        Transition::Keep
                    }
                } else {
                    let from = *pre.last().expect("a stage has branches");
                    Transition::Convs(
                        (0..i + 1 - pre.len())
                            .map(|j| {
                                let to = if j == i - pre.len() { cur[i] } else { from };
                                let spec = ConvSpec::new(from, to, 3).stride(2).padding(1);
                                ConvBn::new(&mut tp.sub(j), spec, norm)
                            })
                            .collect(),
                    )
                }
            })
            .collect()
    }
}

pub struct HRNet {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    layer1: Blocks,
    /// `transition1` .. `transition3`.
    transitions: Vec<Vec<Transition>>,
    /// `stage2` .. `stage4`.
    stages: Vec<Vec<HRModule>>,
    /// The stem (>= 0), then layer1 + transition1 (>= 1), stage2 +
    /// transition2 (>= 2), ... run BN in eval mode and are frozen.
    frozen_stages: i64,
    norm_eval: bool,
}

impl HRNet {
    pub fn new(p: &mut ParamScope, cfg: &HRNetCfg) -> HRNet {
        let norm = &cfg.norm;
        let mark = p.registered();
        // Registration order: conv1, bn1 (added after conv1), conv2, bn2.
        let stem_conv = |p: &mut ParamScope, name: &str, from: i64| {
            Conv2d::new(
                &mut p.sub(name),
                ConvSpec::new(from, 64, 3).stride(2).padding(1).bias(false),
            )
        };
        let conv1 = stem_conv(p, "conv1", cfg.in_channels);
        let bn1 = BatchNorm2d::from_cfg(&mut p.sub("bn1"), 64, norm);
        let conv2 = stem_conv(p, "conv2", 64);
        let bn2 = BatchNorm2d::from_cfg(&mut p.sub("bn2"), 64, norm);
        if cfg.frozen_stages >= 0 {
            p.freeze_since(mark);
        }

        // _freeze_stages freezes {layer1, transition1}, {stage2,
        // transition2}, {stage3, transition3}, {stage4}: runs of
        // registration order, each starting at `mark`.
        let mut mark = p.registered();
        let s1 = &cfg.stages[0];
        let (layer1, stage1_out) = Blocks::new(
            &mut p.sub("layer1"),
            s1.block,
            64,
            s1.num_channels[0],
            s1.num_blocks[0],
            norm,
        );
        let mut pre = vec![stage1_out];
        let mut transitions = Vec::with_capacity(3);
        let mut stages = Vec::with_capacity(3);
        for (n, stage) in cfg.stages.iter().enumerate().skip(1) {
            let cur = stage.expanded_channels();
            transitions.push(Transition::layer(
                &mut p.sub(format!("transition{n}")),
                &pre,
                &cur,
                norm,
            ));
            if n as i64 <= cfg.frozen_stages {
                p.freeze_since(mark);
            }
            mark = p.registered();
            let mut in_channels = cur;
            let mut sp = p.sub(format!("stage{}", n + 1));
            let modules = (0..stage.num_modules)
                .map(|m| {
                    // multiscale_output only for stage4's last module.
                    let multiscale = n != 3 || cfg.multiscale_output || m != stage.num_modules - 1;
                    HRModule::new(&mut sp.sub(m), stage, &mut in_channels, multiscale, norm)
                })
                .collect();
            stages.push(modules);
            pre = in_channels;
        }
        if cfg.frozen_stages >= 4 {
            p.freeze_since(mark);
        }
        HRNet {
            conv1,
            bn1,
            conv2,
            bn2,
            layer1,
            transitions,
            stages,
            frozen_stages: cfg.frozen_stages,
            norm_eval: cfg.norm_eval,
        }
    }
}

impl Backbone for HRNet {
    /// One `[B, C_i, H / 2^(i+2), W / 2^(i+2)]` map per branch of the last
    /// stage (only the first with `multiscale_output=False`).
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let bn_training = |frozen: bool| training && !self.norm_eval && !frozen;
        // Each step's input dies once the step has run, as when Python
        // rebinds `x` (unless autograd keeps it).
        let stem = bn_training(self.frozen_stages >= 0);
        let stem_part = crate::models::scope::enter("stem");
        let mut h = self.conv1.forward(x); // [B, 64, H/2, W/2]
        h = self.bn1.forward(&h, stem);
        let _ = h.relu_();
        h = self.conv2.forward(&h); // [B, 64, H/4, W/4]
        h = self.bn2.forward(&h, stem);
        let _ = h.relu_();
        drop(stem_part);
        h = {
            let _part = crate::models::scope::enter("layer1");
            self.layer1
                .forward(&h, bn_training(self.frozen_stages >= 1))
        };

        // HRNet.forward never rebinds `x` after layer1: its output lives
        // until the backbone returns, even where autograd does not keep it.
        let layer1_out = h.shallow_clone();
        let mut y_list = vec![h];
        for (n, (transition, stage)) in self.transitions.iter().zip(&self.stages).enumerate() {
            let _part = crate::models::scope::enter(&format!("stage{}", n + 2));
            // transition<n+1> is frozen with the stage before it.
            let t_training = bn_training(self.frozen_stages > n as i64);
            let x_list: Vec<Tensor> = transition
                .iter()
                .enumerate()
                .map(|(i, t)| match t {
                    Transition::Keep => y_list[i].shallow_clone(),
                    Transition::Convs(convs) => {
                        // HRNet.forward: `transition[i](y_list[-1])`.
                        let mut t = y_list[y_list.len() - 1].shallow_clone();
                        for conv_bn in convs {
                            t = conv_bn.forward(&t, t_training);
                            let _ = t.relu_();
                        }
                        t
                    }
                })
                .collect();
            let s_training = bn_training(self.frozen_stages > n as i64 + 1);
            let mut x_list = x_list;
            for module in stage {
                x_list = module.forward(x_list, s_training);
            }
            y_list = x_list;
        }
        drop(layer1_out);
        y_list
    }
}

#[cfg(test)]
#[path = "hrnet_tests.rs"]
mod tests;
