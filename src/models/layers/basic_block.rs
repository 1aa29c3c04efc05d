//! MMSeg's residual blocks of the real-time dual-branch backbones
//! (`mmseg/models/utils/basic_block.py`): `BasicBlock` and `Bottleneck`,
//! as DDRNet and PIDNet stack them (from He et al., "Deep Residual Learning
//! for Image Recognition", CVPR 2016, arXiv:1512.03385).
//!
//! Both are ConvModules (conv, BN, in-place ReLU) with the residual added
//! in place (`out += residual`) and an optional in-place ReLU at the end
//! (`act_cfg_out`); their `downsample` is whatever the backbone builds:
//! DDRNet's `nn.Sequential(nn.Conv2d, norm)` or PIDNet's ConvModule.

use super::{BatchNorm2d, Conv2d, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::NormCfg;
use tch::Tensor;

/// A block's `downsample` on the identity path.
pub enum Downsample {
    /// DDRNet's `nn.Sequential(nn.Conv2d(in, out, 1, stride, bias=False),
    /// build_norm_layer(norm_cfg, out)[1])`: `downsample.0`, `downsample.1`.
    ConvNorm(Conv2d, BatchNorm2d),
    /// PIDNet's `ConvModule(in, out, 1, stride, norm_cfg=norm_cfg,
    /// act_cfg=None)`: `downsample.conv`, `downsample.bn`.
    Module(ConvModule),
}

/// How a backbone builds its blocks' `downsample`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownsampleStyle {
    ConvNorm,
    Module,
}

impl Downsample {
    /// `downsample` from `in_channels` to `out_channels` at `stride`.
    pub fn new(
        p: &mut ParamScope,
        style: DownsampleStyle,
        in_channels: i64,
        out_channels: i64,
        stride: i64,
        norm: &NormCfg,
    ) -> Downsample {
        let spec = ConvSpec::new(in_channels, out_channels, 1).stride(stride);
        match style {
            DownsampleStyle::ConvNorm => Downsample::ConvNorm(
                Conv2d::new(&mut p.sub(0), spec.bias(false)),
                BatchNorm2d::from_cfg(&mut p.sub(1), out_channels, norm),
            ),
            DownsampleStyle::Module => {
                Downsample::Module(ConvModule::new(p, spec, Some(*norm), false))
            }
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        match self {
            Downsample::ConvNorm(conv, bn) => bn.forward(&conv.forward(x), training),
            Downsample::Module(m) => m.forward(x, training),
        }
    }
}

/// The block type of a `_make_layer` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Basic,
    Bottleneck,
}

impl BlockKind {
    /// `block.expansion`.
    pub fn expansion(self) -> i64 {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 2,
        }
    }

    /// `act_cfg_out`'s default: a ReLU for BasicBlock, none for Bottleneck.
    pub fn default_act_out(self) -> bool {
        self == BlockKind::Basic
    }
}

/// The arguments of one block: `block(in_channels, channels, stride,
/// downsample, norm_cfg=..., act_cfg_out=...)`.
pub struct BlockArgs {
    pub in_channels: i64,
    pub channels: i64,
    pub stride: i64,
    /// The block's `norm_cfg` (its default `dict(type='BN')` unless passed).
    pub norm: NormCfg,
    /// `act_cfg_out`: a final in-place ReLU.
    pub act_out: bool,
}

/// `BasicBlock` (two 3x3 ConvModules) or `Bottleneck` (1x1, 3x3, 1x1 to
/// `2 * channels`), with their `downsample` and final ReLU.
pub struct ResBlock {
    convs: Vec<ConvModule>,
    downsample: Option<Downsample>,
    act_out: bool,
}

impl ResBlock {
    /// Registers `conv1`, `conv2` (, `conv3`) and `downsample` under `p`, in
    /// the block's `__init__` order; `downsample` builds it under its name.
    pub fn new(
        p: &mut ParamScope,
        kind: BlockKind,
        a: &BlockArgs,
        downsample: Option<&dyn Fn(&mut ParamScope) -> Downsample>,
    ) -> ResBlock {
        let norm = Some(a.norm);
        let (ch, out) = (a.channels, a.channels * kind.expansion());
        let specs: Vec<(ConvSpec, bool)> = match kind {
            BlockKind::Basic => vec![
                (
                    ConvSpec::new(a.in_channels, ch, 3)
                        .stride(a.stride)
                        .padding(1),
                    true,
                ),
                (ConvSpec::new(ch, ch, 3).padding(1), false),
            ],
            BlockKind::Bottleneck => vec![
                (ConvSpec::new(a.in_channels, ch, 1), true),
                (ConvSpec::new(ch, ch, 3).stride(a.stride).padding(1), true),
                (ConvSpec::new(ch, out, 1), false),
            ],
        };
        let convs = specs
            .into_iter()
            .enumerate()
            .map(|(i, (spec, relu))| {
                ConvModule::new(&mut p.sub(format!("conv{}", i + 1)), spec, norm, relu)
            })
            .collect();
        let downsample = downsample.map(|build| build(&mut p.sub("downsample")));
        ResBlock {
            convs,
            downsample,
            act_out: a.act_out,
        }
    }

    /// `[B, in, H, W]` -> `[B, channels * expansion, H / stride, W / stride]`.
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut out = x.shallow_clone();
        for conv in &self.convs {
            out = conv.forward(&out, training);
        }
        // `out += residual`, the residual `x` or `downsample(x)`.
        match &self.downsample {
            Some(d) => {
                let residual = d.forward(x, training);
                let _ = out.g_add_(&residual);
            }
            None => {
                let _ = out.g_add_(x);
            }
        }
        if self.act_out {
            let _ = out.relu_();
        }
        out
    }
}

/// An `nn.Sequential` of blocks (`_make_layer`'s result).
pub struct ResLayer {
    blocks: Vec<ResBlock>,
}

impl ResLayer {
    pub fn new(blocks: Vec<ResBlock>) -> ResLayer {
        ResLayer { blocks }
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut x = x.shallow_clone();
        for block in &self.blocks {
            x = block.forward(&x, training);
        }
        x
    }
}

/// DDRNet's and PIDNet's stem: two stride-2 ConvModules to `channels`, a
/// layer of BasicBlocks, a ReLU, a stride-2 layer to `2 * channels`, a
/// ReLU (`stem.0` to `stem.5`). `layer(p, (in, out), stride)` is the
/// backbone's own `_make_layer` of BasicBlocks.
pub struct BranchStem {
    convs: [ConvModule; 2],
    layers: [ResLayer; 2],
}

impl BranchStem {
    pub fn new(
        p: &mut ParamScope,
        (in_channels, channels): (i64, i64),
        (norm, relu): (NormCfg, bool),
        layer: impl Fn(&mut ParamScope, (i64, i64), i64) -> ResLayer,
    ) -> BranchStem {
        let s2 = |from: i64| ConvSpec::new(from, channels, 3).stride(2).padding(1);
        let conv0 = ConvModule::new(&mut p.sub(0), s2(in_channels), Some(norm), relu);
        let conv1 = ConvModule::new(&mut p.sub(1), s2(channels), Some(norm), relu);
        let layer2 = layer(&mut p.sub(2), (channels, channels), 1);
        let layer4 = layer(&mut p.sub(4), (channels, channels * 2), 2);
        BranchStem {
            convs: [conv0, conv1],
            layers: [layer2, layer4],
        }
    }

    /// `[B, in, H, W]` -> `[B, 2 * channels, H/8, W/8]`.
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut x = self.convs[0].forward(x, training); // [B, ch, H/2, W/2]
        x = self.convs[1].forward(&x, training); // [B, ch, H/4, W/4]
        x = self.layers[0].forward(&x, training).relu(); // [B, ch, H/4, W/4]
        self.layers[1].forward(&x, training).relu() // [B, 2ch, H/8, W/8]
    }
}

#[cfg(test)]
#[path = "basic_block_tests.rs"]
mod tests;
