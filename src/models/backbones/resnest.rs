//! ResNeSt's split-attention bottleneck, as MMSeg's
//! `mmseg/models/backbones/resnest.py` builds it; the backbone itself is
//! `resnet.rs`'s ResNetV1d with these blocks (`Variant::ResNeSt`).
//!
//! Zhang et al., "ResNeSt: Split-Attention Networks", arXiv:2004.08955.
//!
//! The 3x3 conv of each bottleneck becomes `SplitAttentionConv2d`: a
//! grouped conv to `radix` splits, their sum pooled globally, two grouped
//! 1x1 convs (BN and ReLU between), a softmax across the splits (`RSoftmax`)
//! and the splits summed with those weights. With `avg_down_stride` the
//! block's stride moves to a 3x3 average pool after it.

use super::resnet::{BlockSpec, Downsample};
use crate::models::layers::{softmax_saved, BatchNorm2d, Conv2d, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::NormCfg;
use tch::{Kind, Tensor};

/// ResNeSt's block settings (`ResNeSt(groups, base_width, radix,
/// reduction_factor, avg_down_stride)` and the backbone's `base_channels`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitSettings {
    pub groups: i64,
    pub base_width: i64,
    pub base_channels: i64,
    pub radix: i64,
    pub reduction_factor: i64,
    pub avg_down_stride: bool,
}

/// `SplitAttentionConv2d` (`conv2` of the block).
struct SplitAttentionConv2d {
    conv: Conv2d,
    bn0: BatchNorm2d,
    fc1: Conv2d,
    bn1: BatchNorm2d,
    fc2: Conv2d,
    radix: i64,
    groups: i64,
}

impl SplitAttentionConv2d {
    fn new(
        p: &mut ParamScope,
        spec: ConvSpec,
        s: &SplitSettings,
        norm: &NormCfg,
    ) -> SplitAttentionConv2d {
        let (channels, radix, groups) = (spec.out_channels, s.radix, s.groups);
        let inter = (spec.in_channels * radix / s.reduction_factor).max(32);
        let conv = Conv2d::new(
            &mut p.sub("conv"),
            ConvSpec {
                out_channels: channels * radix,
                groups: groups * radix,
                bias: false,
                ..spec
            },
        );
        let bn0 = BatchNorm2d::from_cfg(&mut p.sub("bn0"), channels * radix, norm);
        let fc1 = Conv2d::new(
            &mut p.sub("fc1"),
            ConvSpec::new(channels, inter, 1).groups(groups),
        );
        let bn1 = BatchNorm2d::from_cfg(&mut p.sub("bn1"), inter, norm);
        let fc2 = Conv2d::new(
            &mut p.sub("fc2"),
            ConvSpec::new(inter, channels * radix, 1).groups(groups),
        );
        SplitAttentionConv2d {
            conv,
            bn0,
            fc1,
            bn1,
            fc2,
            radix,
            groups,
        }
    }

    fn forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        let mut x = self.conv.forward(x);
        x = self.bn0.forward(&x, bn_training);
        let _ = x.relu_();
        let s = x.size();
        let batch = s[0];
        let splits = (self.radix > 1).then(|| x.view([batch, self.radix, -1, s[2], s[3]]));
        let gap = {
            let summed = match &splits {
                Some(splits) => splits.sum_dim_intlist(1, false, None::<Kind>),
                None => x.shallow_clone(),
            };
            let pooled = summed.adaptive_avg_pool2d([1, 1]);
            let mut gap = self.bn1.forward(&self.fc1.forward(&pooled), bn_training);
            let _ = gap.relu_();
            gap
        };
        let atten = {
            let logits = self.fc2.forward(&gap);
            self.rsoftmax(&logits).view([batch, -1, 1, 1])
        };
        let out = match &splits {
            Some(splits) => {
                let attens = atten.view([batch, self.radix, -1, 1, 1]);
                (&attens * splits).sum_dim_intlist(1, false, None::<Kind>)
            }
            None => &atten * &x,
        };
        out.contiguous()
    }

    /// `RSoftmax`: a softmax across the radix splits (a sigmoid for radix 1).
    fn rsoftmax(&self, x: &Tensor) -> Tensor {
        let batch = x.size()[0];
        if self.radix > 1 {
            let grouped = x.view([batch, self.groups, self.radix, -1]).transpose(1, 2);
            let weights = grouped.softmax(1, None::<Kind>);
            softmax_saved(&grouped, &weights);
            weights.reshape([batch, -1])
        } else {
            x.sigmoid()
        }
    }
}

/// ResNeSt's `Bottleneck`: 1x1, split-attention 3x3 (then the average pool
/// that carries the stride), 1x1 (x4); no `bn2`.
pub struct SplitBottleneck {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    conv2: SplitAttentionConv2d,
    avd_stride: Option<i64>,
    conv3: Conv2d,
    bn3: BatchNorm2d,
    pub(super) downsample: Option<Downsample>,
}

impl SplitBottleneck {
    /// `downsample` is built by the caller after the block's own layers
    /// (it comes last in MMSeg's module order).
    pub fn new(
        p: &mut ParamScope,
        spec: BlockSpec,
        s: &SplitSettings,
        norm: &NormCfg,
        downsample: impl FnOnce(&mut ParamScope) -> Option<Downsample>,
    ) -> SplitBottleneck {
        let planes = spec.planes;
        let width = if s.groups == 1 {
            planes
        } else {
            (planes as f64 * (s.base_width as f64 / s.base_channels as f64)).floor() as i64
                * s.groups
        };
        // mmseg's Bottleneck (style pytorch): the stride on the 3x3.
        let (conv1_stride, conv2_stride) = match spec.style {
            super::resnet::Style::Pytorch => (1, spec.stride),
            super::resnet::Style::Caffe => (spec.stride, 1),
        };
        let avd = s.avg_down_stride && conv2_stride > 1;
        let conv1 = Conv2d::new(
            &mut p.sub("conv1"),
            ConvSpec::new(spec.inplanes, width, 1)
                .stride(conv1_stride)
                .bias(false),
        );
        let bn1 = BatchNorm2d::from_cfg(&mut p.sub("bn1"), width, norm);
        let conv2 = SplitAttentionConv2d::new(
            &mut p.sub("conv2"),
            ConvSpec::new(width, width, 3)
                .stride(if avd { 1 } else { conv2_stride })
                .padding(spec.dilation)
                .dilation(spec.dilation)
                .groups(s.groups),
            s,
            norm,
        );
        let conv3 = Conv2d::new(
            &mut p.sub("conv3"),
            ConvSpec::new(width, planes * 4, 1).bias(false),
        );
        let bn3 = BatchNorm2d::from_cfg(&mut p.sub("bn3"), planes * 4, norm);
        SplitBottleneck {
            conv1,
            bn1,
            conv2,
            avd_stride: avd.then_some(conv2_stride),
            conv3,
            bn3,
            downsample: downsample(p),
        }
    }

    /// The residual branch up to `bn3` (the caller adds the identity).
    pub fn residual(&self, x: &Tensor, bn_training: bool) -> Tensor {
        let mut out = self.conv1.forward(x);
        out = self.bn1.forward(&out, bn_training);
        let _ = out.relu_();
        out = self.conv2.forward(&out, bn_training);
        if let Some(stride) = self.avd_stride {
            // nn.AvgPool2d(3, stride, padding=1)
            out = out.avg_pool2d([3, 3], [stride, stride], [1, 1], false, true, None::<i64>);
        }
        out = self.conv3.forward(&out);
        self.bn3.forward(&out, bn_training)
    }
}

#[cfg(test)]
#[path = "resnest_tests.rs"]
mod tests;
