//! `ResNet`, `ResNetV1c` and `ResNetV1d` as MMSeg's
//! `mmseg/models/backbones/resnet.py` builds them, with the residual blocks
//! (`BasicBlock`, `Bottleneck`) and `ResLayer`
//! (`mmseg/models/utils/res_layer.py`) that HRNet reuses.
//!
//! He et al., "Deep Residual Learning for Image Recognition", CVPR 2016,
//! arXiv:1512.03385; the V1c deep stem (three 3x3 convs) and V1d average-pool
//! shortcut from He et al., "Bag of Tricks for Image Classification with
//! Convolutional Neural Networks", CVPR 2019, arXiv:1812.01187; dilated
//! (D8/D16) stages and multi-grid from Chen et al., "Rethinking Atrous
//! Convolution for Semantic Image Segmentation", arXiv:1706.05587.
//!
//! A stem (7x7 conv or the deep stem) and a 3x3/2 max pool, then
//! `num_stages` ResLayers of `depth`'s blocks; `strides`/`dilations` per
//! stage set the output stride. `frozen_stages` freezes the stem and the
//! first stages (no gradients, BN in eval mode), `norm_eval` puts every BN
//! in eval mode.

use super::resnest::{SplitBottleneck, SplitSettings};
use super::Backbone;
use crate::config::Dict;
use crate::models::layers::{checkpoint_if, BatchNorm2d, Conv2d, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/resnet.py";

mod cfg;
pub use cfg::ResNetCfg;

/// The registry's constructor for `ResNet`.
pub fn build_resnet(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = ResNetCfg::from_cfg(cfg, Variant::ResNet)?;
    Ok(Box::new(ResNet::new(p, &cfg)))
}

/// The registry's constructor for `ResNetV1c` (deep stem).
pub fn build_resnet_v1c(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = ResNetCfg::from_cfg(cfg, Variant::V1c)?;
    Ok(Box::new(ResNet::new(p, &cfg)))
}

/// The registry's constructor for `ResNetV1d` (deep stem, average-pool shortcut).
pub fn build_resnet_v1d(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = ResNetCfg::from_cfg(cfg, Variant::V1d)?;
    Ok(Box::new(ResNet::new(p, &cfg)))
}

/// The registry's constructor for `ResNeSt` (split-attention blocks).
pub fn build_resnest(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = ResNetCfg::from_cfg(cfg, Variant::ResNeSt)?;
    Ok(Box::new(ResNet::new(p, &cfg)))
}

/// Which class the config names: the V1c/V1d subclasses fix `deep_stem`
/// (and `avg_down`) themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    ResNet,
    V1c,
    V1d,
    /// `ResNeSt`: a ResNetV1d of split-attention bottlenecks (`resnest.rs`).
    ResNeSt,
}

impl Variant {
    fn class_name(self) -> &'static str {
        match self {
            Variant::ResNet => "ResNet",
            Variant::V1c => "ResNetV1c",
            Variant::V1d => "ResNetV1d",
            Variant::ResNeSt => "ResNeSt",
        }
    }

    fn source(self) -> &'static str {
        match self {
            Variant::ResNeSt => "mmseg/models/backbones/resnest.py",
            _ => SOURCE,
        }
    }
}

/// The residual block kind of a depth (`ResNet.arch_settings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    Basic,
    Bottleneck,
    /// ResNeSt's split-attention bottleneck.
    Split(SplitSettings),
}

impl BlockKind {
    /// `block.expansion`.
    pub fn expansion(self) -> i64 {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck | BlockKind::Split(_) => 4,
        }
    }
}

/// Where a Bottleneck puts its stride: on the 3x3 conv (`pytorch`) or on the
/// first 1x1 conv (`caffe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Pytorch,
    Caffe,
}

/// `nn.Conv2d` without bias, as `build_conv_layer(None, ...)` is called in
/// the blocks.
fn conv(p: &mut ParamScope, name: &str, spec: ConvSpec) -> Conv2d {
    Conv2d::new(&mut p.sub(name), spec.bias(false))
}

/// `BasicBlock`: two 3x3 convs.
pub struct BasicBlock {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    downsample: Option<Downsample>,
}

/// `Bottleneck`: 1x1 reduce, 3x3, 1x1 expand (x4).
pub struct Bottleneck {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    conv3: Conv2d,
    bn3: BatchNorm2d,
    downsample: Option<Downsample>,
}

/// The shortcut projection: optional `AvgPool2d` (avg_down), 1x1 conv, BN.
pub struct Downsample {
    avg_pool_stride: Option<i64>,
    conv: Conv2d,
    bn: BatchNorm2d,
}

impl Downsample {
    pub(super) fn forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        let pooled;
        let input = match self.avg_pool_stride {
            Some(s) => {
                // nn.AvgPool2d(stride, stride, ceil_mode=True, count_include_pad=False)
                pooled = x.avg_pool2d([s, s], [s, s], [0, 0], true, false, None::<i64>);
                &pooled
            }
            None => x,
        };
        let y = self.conv.forward(input);
        self.bn.forward(&y, bn_training)
    }
}

/// One residual block of either kind.
pub enum ResBlock {
    Basic(BasicBlock),
    Bottleneck(Bottleneck),
    Split(Box<SplitBottleneck>),
}

/// A block's shape: `BasicBlock(inplanes, planes, stride, dilation,
/// downsample, style)` / `Bottleneck(...)`.
#[derive(Debug, Clone, Copy)]
pub struct BlockSpec {
    pub kind: BlockKind,
    pub inplanes: i64,
    pub planes: i64,
    pub stride: i64,
    pub dilation: i64,
    pub style: Style,
}

impl ResBlock {
    /// Builds a block under `p` (`layer1.0`); `downsample` is the shortcut
    /// built by [`ResBlock::downsample`] when the shape changes.
    pub fn new(
        p: &mut ParamScope,
        spec: BlockSpec,
        norm: &NormCfg,
        downsample: Option<(i64, bool)>,
    ) -> ResBlock {
        let BlockSpec {
            inplanes,
            planes,
            stride,
            dilation,
            ..
        } = spec;
        match spec.kind {
            BlockKind::Split(settings) => ResBlock::Split(Box::new(SplitBottleneck::new(
                p,
                spec,
                &settings,
                norm,
                |p: &mut ParamScope| {
                    downsample.map(|(stride, avg)| {
                        Downsample::new(p, inplanes, planes * 4, stride, avg, norm)
                    })
                },
            ))),
            BlockKind::Basic => {
                let conv1 = conv(
                    p,
                    "conv1",
                    ConvSpec::new(inplanes, planes, 3)
                        .stride(stride)
                        .padding(dilation)
                        .dilation(dilation),
                );
                let bn1 = BatchNorm2d::from_cfg(&mut p.sub("bn1"), planes, norm);
                let conv2 = conv(p, "conv2", ConvSpec::new(planes, planes, 3).padding(1));
                let bn2 = BatchNorm2d::from_cfg(&mut p.sub("bn2"), planes, norm);
                let downsample = downsample
                    .map(|(stride, avg)| Downsample::new(p, inplanes, planes, stride, avg, norm));
                ResBlock::Basic(BasicBlock {
                    conv1,
                    bn1,
                    conv2,
                    bn2,
                    downsample,
                })
            }
            BlockKind::Bottleneck => {
                let (conv1_stride, conv2_stride) = match spec.style {
                    Style::Pytorch => (1, stride),
                    Style::Caffe => (stride, 1),
                };
                let conv1 = conv(
                    p,
                    "conv1",
                    ConvSpec::new(inplanes, planes, 1).stride(conv1_stride),
                );
                let bn1 = BatchNorm2d::from_cfg(&mut p.sub("bn1"), planes, norm);
                let conv2 = conv(
                    p,
                    "conv2",
                    ConvSpec::new(planes, planes, 3)
                        .stride(conv2_stride)
                        .padding(dilation)
                        .dilation(dilation),
                );
                let bn2 = BatchNorm2d::from_cfg(&mut p.sub("bn2"), planes, norm);
                let conv3 = conv(p, "conv3", ConvSpec::new(planes, planes * 4, 1));
                let bn3 = BatchNorm2d::from_cfg(&mut p.sub("bn3"), planes * 4, norm);
                let downsample = downsample.map(|(stride, avg)| {
                    Downsample::new(p, inplanes, planes * 4, stride, avg, norm)
                });
                ResBlock::Bottleneck(Bottleneck {
                    conv1,
                    bn1,
                    conv2,
                    bn2,
                    conv3,
                    bn3,
                    downsample,
                })
            }
        }
    }

    /// `forward(x)`: the residual branch plus the (projected) input, then an
    /// in-place ReLU. `bn_training`: BN in train mode.
    pub fn forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        self.forward_with_cp(x, bn_training, false)
    }

    /// [`Self::forward`], the residual part through [`checkpoint`] when
    /// `with_cp` and the input requires grad (the final ReLU stays outside,
    /// as in mmseg's blocks).
    pub fn forward_with_cp(&self, x: &Tensor, bn_training: bool, with_cp: bool) -> Tensor {
        // SAFETY: the block borrows this module, which outlives the step's graph
        // (a trial keeps its model for all its steps).
        let mut out = unsafe {
            checkpoint_if(with_cp, x, move |x: &Tensor| {
                self.inner_forward(x, bn_training)
            })
        };
        let _ = out.relu_();
        out
    }

    /// `_inner_forward`: each intermediate is released when the next one
    /// exists, as Python's reassigned `out` is (it matters without grad,
    /// under checkpointing, where autograd keeps nothing).
    fn inner_forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        // mmseg: `out += identity` and `nn.ReLU(inplace=True)` throughout.
        let (mut out, downsample) = match self {
            ResBlock::Basic(b) => {
                let mut out = b.conv1.forward(x);
                out = b.bn1.forward(&out, bn_training);
                let _ = out.relu_();
                out = b.conv2.forward(&out);
                (b.bn2.forward(&out, bn_training), &b.downsample)
            }
            ResBlock::Bottleneck(b) => {
                let mut out = b.conv1.forward(x);
                out = b.bn1.forward(&out, bn_training);
                let _ = out.relu_();
                out = b.conv2.forward(&out);
                out = b.bn2.forward(&out, bn_training);
                let _ = out.relu_();
                out = b.conv3.forward(&out);
                (b.bn3.forward(&out, bn_training), &b.downsample)
            }
            ResBlock::Split(b) => (b.residual(x, bn_training), &b.downsample),
        };
        match downsample {
            Some(d) => {
                let identity = d.forward(x, bn_training);
                let _ = out.g_add_(&identity);
            }
            None => {
                let _ = out.g_add_(x);
            }
        }
        out
    }
}

impl Downsample {
    pub(super) fn new(
        p: &mut ParamScope,
        inplanes: i64,
        out_channels: i64,
        stride: i64,
        avg_down: bool,
        norm: &NormCfg,
    ) -> Downsample {
        let mut ds = p.sub("downsample");
        // nn.Sequential numbering: the pool, when present, is item 0.
        let (avg_pool_stride, conv_stride, first) = if avg_down {
            (Some(stride), 1, 1)
        } else {
            (None, stride, 0)
        };
        let conv = conv(
            &mut ds,
            &first.to_string(),
            ConvSpec::new(inplanes, out_channels, 1).stride(conv_stride),
        );
        let bn = BatchNorm2d::from_cfg(&mut ds.sub(first + 1), out_channels, norm);
        Downsample {
            avg_pool_stride,
            conv,
            bn,
        }
    }
}

/// `ResLayer`: the blocks of one stage.
pub struct ResLayer {
    blocks: Vec<ResBlock>,
    with_cp: bool,
}

/// `ResLayer(block, inplanes, planes, num_blocks, stride, dilation,
/// avg_down, multi_grid, contract_dilation, style)`.
#[derive(Debug, Clone)]
pub struct ResLayerSpec {
    pub kind: BlockKind,
    pub inplanes: i64,
    pub planes: i64,
    pub num_blocks: i64,
    pub stride: i64,
    pub dilation: i64,
    pub avg_down: bool,
    pub multi_grid: Option<Vec<i64>>,
    pub contract_dilation: bool,
    pub style: Style,
    /// Gradient checkpointing of each block's residual branch (`with_cp`).
    pub with_cp: bool,
}

impl ResLayer {
    pub fn new(p: &mut ParamScope, spec: &ResLayerSpec, norm: &NormCfg) -> ResLayer {
        let expansion = spec.kind.expansion();
        // With avg_down the shortcut pools (even a 1x1 pool at stride 1, a
        // copy MMSeg makes too) and its conv keeps stride 1.
        let downsample = (spec.stride != 1 || spec.inplanes != spec.planes * expansion)
            .then_some((spec.stride, spec.avg_down));
        let first_dilation = match &spec.multi_grid {
            Some(grid) => grid[0],
            None if spec.dilation > 1 && spec.contract_dilation => spec.dilation / 2,
            None => spec.dilation,
        };
        let mut blocks = Vec::with_capacity(spec.num_blocks as usize);
        let mut inplanes = spec.inplanes;
        for i in 0..spec.num_blocks {
            let (stride, dilation) = if i == 0 {
                (spec.stride, first_dilation)
            } else {
                let dilation = spec
                    .multi_grid
                    .as_ref()
                    .map_or(spec.dilation, |g| g[i as usize]);
                (1, dilation)
            };
            let block_spec = BlockSpec {
                kind: spec.kind,
                inplanes,
                planes: spec.planes,
                stride,
                dilation,
                style: spec.style,
            };
            let ds = if i == 0 { downsample } else { None };
            blocks.push(ResBlock::new(&mut p.sub(i), block_spec, norm, ds));
            inplanes = spec.planes * expansion;
        }
        ResLayer {
            blocks,
            with_cp: spec.with_cp,
        }
    }

    /// The blocks in sequence; each intermediate dies when the next exists.
    pub fn forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        let mut x = x.shallow_clone();
        for block in &self.blocks {
            x = block.forward_with_cp(&x, bn_training, self.with_cp);
        }
        x
    }
}

/// The stem: `conv1`, `bn1`, ReLU, or the deep stem (`stem.0`..`stem.7`).
enum Stem {
    Plain { conv1: Conv2d, bn1: BatchNorm2d },
    Deep(Vec<(Conv2d, BatchNorm2d)>),
}

pub struct ResNet {
    stem: Stem,
    layers: Vec<ResLayer>,
    out_indices: Vec<i64>,
    /// Stages `1..=frozen_stages` (and the stem when >= 0) run BN in eval mode.
    frozen_stages: i64,
    norm_eval: bool,
}

impl ResNet {
    pub fn new(p: &mut ParamScope, cfg: &ResNetCfg) -> ResNet {
        let norm = &cfg.norm;
        let stem_mark = p.registered();
        let stem = if cfg.deep_stem {
            let half = cfg.stem_channels / 2;
            let mut sp = p.sub("stem");
            let shapes = [
                (cfg.in_channels, half, 2),
                (half, half, 1),
                (half, cfg.stem_channels, 1),
            ];
            Stem::Deep(
                shapes
                    .iter()
                    .enumerate()
                    .map(|(i, &(from, to, stride))| {
                        // nn.Sequential(conv, bn, relu) x 3: items 0,1 / 3,4 / 6,7.
                        let conv = conv(
                            &mut sp,
                            &(3 * i).to_string(),
                            ConvSpec::new(from, to, 3).stride(stride).padding(1),
                        );
                        let bn = BatchNorm2d::from_cfg(&mut sp.sub(3 * i + 1), to, norm);
                        (conv, bn)
                    })
                    .collect(),
            )
        } else {
            let conv1 = conv(
                p,
                "conv1",
                ConvSpec::new(cfg.in_channels, cfg.stem_channels, 7)
                    .stride(2)
                    .padding(3),
            );
            let bn1 = BatchNorm2d::from_cfg(&mut p.sub("bn1"), cfg.stem_channels, norm);
            Stem::Plain { conv1, bn1 }
        };
        if cfg.frozen_stages >= 0 {
            p.freeze_since(stem_mark);
        }
        let mut inplanes = cfg.stem_channels;
        let last = cfg.stage_blocks.len() - 1;
        let mut layers = Vec::with_capacity(cfg.stage_blocks.len());
        for (i, &num_blocks) in cfg.stage_blocks.iter().enumerate() {
            let planes = cfg.base_channels * (1 << i);
            let spec = ResLayerSpec {
                kind: cfg.block,
                inplanes,
                planes,
                num_blocks,
                stride: cfg.strides[i],
                dilation: cfg.dilations[i],
                avg_down: cfg.avg_down,
                // "multi grid is applied to last layer only"
                multi_grid: if i == last {
                    cfg.multi_grid.clone()
                } else {
                    None
                },
                contract_dilation: cfg.contract_dilation,
                style: cfg.style,
                with_cp: cfg.with_cp,
            };
            let mark = p.registered();
            layers.push(ResLayer::new(
                &mut p.sub(format!("layer{}", i + 1)),
                &spec,
                norm,
            ));
            if (i as i64) < cfg.frozen_stages {
                p.freeze_since(mark);
            }
            inplanes = planes * cfg.block.expansion();
        }
        ResNet {
            stem,
            layers,
            out_indices: cfg.out_indices.clone(),
            frozen_stages: cfg.frozen_stages,
            norm_eval: cfg.norm_eval,
        }
    }
}

impl Variant {
    /// The variant a `type` names, for a module that builds a ResNet from
    /// its own `backbone_cfg` (ICNet).
    pub fn from_type(name: &str) -> Option<Variant> {
        match name {
            "ResNet" => Some(Variant::ResNet),
            "ResNetV1c" => Some(Variant::V1c),
            "ResNetV1d" => Some(Variant::V1d),
            _ => None,
        }
    }
}

impl ResNet {
    /// Whether BN runs in training mode in a part (`frozen`: a frozen stage).
    fn bn_training(&self, training: bool, frozen: bool) -> bool {
        training && !self.norm_eval && !frozen
    }

    /// Whether the stem is the V1c/V1d deep stem (the `stem` module that
    /// ICNet calls by name).
    pub fn has_deep_stem(&self) -> bool {
        matches!(self.stem, Stem::Deep(_))
    }

    /// The stem without the max pool: `[B, stem_channels, H/2, W/2]`.
    pub fn stem_forward(&self, x: &Tensor, training: bool) -> Tensor {
        let _part = crate::models::scope::enter("stem");
        let stem_training = self.bn_training(training, self.frozen_stages >= 0);
        match &self.stem {
            Stem::Plain { conv1, bn1 } => {
                let y = conv1.forward(x);
                let mut y = bn1.forward(&y, stem_training);
                let _ = y.relu_();
                y
            }
            Stem::Deep(convs) => {
                let mut y = x.shallow_clone();
                for (conv, bn) in convs {
                    let z = conv.forward(&y);
                    y = bn.forward(&z, stem_training);
                    let _ = y.relu_();
                }
                y
            }
        }
    }

    /// `layer{i + 1}` on `x`.
    pub fn layer_forward(&self, i: usize, x: &Tensor, training: bool) -> Tensor {
        let _part = crate::models::scope::enter(&format!("layer{}", i + 1));
        let frozen = (i as i64) < self.frozen_stages;
        self.layers[i].forward(x, self.bn_training(training, frozen))
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

impl Backbone for ResNet {
    /// One `[B, base_channels * 2^i * expansion, H / s_i, W / s_i]` map per
    /// output stage (`s_i`: 4 times the product of the strides so far).
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let stem = self.stem_forward(x, training);
        // nn.MaxPool2d(3, 2, 1)
        let mut x = {
            let _part = crate::models::scope::enter("stem");
            stem.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false) // [B, stem, H/4, W/4]
        };
        drop(stem);
        let mut outs = Vec::with_capacity(self.out_indices.len());
        for i in 0..self.layers.len() {
            x = self.layer_forward(i, &x, training);
            if self.out_indices.contains(&(i as i64)) {
                outs.push(x.shallow_clone());
            }
        }
        outs
    }
}

#[cfg(test)]
#[path = "resnet_tests.rs"]
mod tests;
