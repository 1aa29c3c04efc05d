//! MMSeg's pyramid pooling modules of the real-time backbones
//! (`mmseg/models/utils/ppm.py`): `DAPPM` (Hong et al., "Deep
//! Dual-resolution Networks for Real-time and Accurate Semantic
//! Segmentation of Road Scenes", arXiv:2101.06085) and its parallel
//! variant `PAPPM` (Xu et al., "PIDNet: A Real-time Semantic Segmentation
//! Network Inspired by PID Controllers", CVPR 2023, arXiv:2206.02066).
//!
//! Every ConvModule is `order=('norm', 'act', 'conv')` without a conv
//! bias, and the norm is the modules' own default `dict(type='BN',
//! momentum=0.1)`: neither DDRNet nor PIDNet passes its `norm_cfg` down.

use super::{resize_bilinear, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::NormCfg;
use tch::Tensor;

/// `kernel_sizes=[5, 9, 17]`, `strides=[2, 4, 8]`, `paddings=[2, 4, 8]`:
/// the average pools of scales 1 to 3 (the last scale pools globally).
const POOLS: [(i64, i64, i64); 3] = [(5, 2, 2), (9, 4, 4), (17, 8, 8)];

/// The modules' ConvModule: BN, in-place ReLU, conv without bias.
fn conv(p: &mut ParamScope, spec: ConvSpec) -> ConvModule {
    ConvModule::norm_act_conv(p, spec, NormCfg::BN_DEFAULT, true)
}

/// One entry of `scales`: the input itself (scale 0), an `nn.AvgPool2d`,
/// or an `nn.AdaptiveAvgPool2d((1, 1))` (the last), then a 1x1 ConvModule.
struct Scale {
    /// `(kernel, stride, padding)` of the average pool; `None` for scale 0.
    pool: Option<Option<(i64, i64, i64)>>,
    conv: ConvModule,
}

impl Scale {
    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        match self.pool {
            None => self.conv.forward(x, training),
            Some(Some((k, s, pad))) => {
                let pooled = x.avg_pool2d([k, k], [s, s], [pad, pad], false, true, None);
                self.conv.forward(&pooled, training)
            }
            Some(None) => {
                let pooled = x.adaptive_avg_pool2d([1, 1]);
                self.conv.forward(&pooled, training)
            }
        }
    }
}

/// `scales`: `scales.0` (a ConvModule), `scales.<i>.1` after a pool.
fn scales(p: &mut ParamScope, in_channels: i64, branch: i64, num_scales: i64) -> Vec<Scale> {
    let mut sp = p.sub("scales");
    let spec = ConvSpec::new(in_channels, branch, 1);
    let mut scales = vec![Scale {
        pool: None,
        conv: conv(&mut sp.sub(0), spec),
    }];
    for i in 1..num_scales {
        let pool = if i < num_scales - 1 {
            Some(POOLS[(i - 1) as usize])
        } else {
            None
        };
        scales.push(Scale {
            pool: Some(pool),
            conv: conv(&mut sp.sub(i).sub(1), spec),
        });
    }
    scales
}

/// `DAPPM(in_channels, branch_channels, out_channels, num_scales)` or
/// `PAPPM(...)`, with the default kernel sizes, strides and paddings.
pub struct Pappm {
    scales: Vec<Scale>,
    /// DAPPM: one 3x3 ConvModule per scale after the first; PAPPM: one
    /// grouped 3x3 ConvModule over the concatenated scales.
    processes: Vec<ConvModule>,
    compression: ConvModule,
    shortcut: ConvModule,
    parallel: bool,
}

impl Pappm {
    /// `DAPPM` when `parallel` is false, `PAPPM` when true. `num_scales`
    /// must be 2 to 5 (three pools are given).
    pub fn new(
        p: &mut ParamScope,
        in_channels: i64,
        branch: i64,
        out_channels: i64,
        num_scales: i64,
        parallel: bool,
    ) -> Pappm {
        let scales = scales(p, in_channels, branch, num_scales);
        let processes = if parallel {
            // PAPPM replaces DAPPM's ModuleList under the same name.
            let n = branch * (num_scales - 1);
            let spec = ConvSpec::new(n, n, 3).padding(1).groups(num_scales - 1);
            vec![conv(&mut p.sub("processes"), spec)]
        } else {
            let mut pp = p.sub("processes");
            (0..num_scales - 1)
                .map(|i| conv(&mut pp.sub(i), ConvSpec::new(branch, branch, 3).padding(1)))
                .collect()
        };
        let compression = conv(
            &mut p.sub("compression"),
            ConvSpec::new(branch * num_scales, out_channels, 1),
        );
        let shortcut = conv(
            &mut p.sub("shortcut"),
            ConvSpec::new(in_channels, out_channels, 1),
        );
        Pappm {
            scales,
            processes,
            compression,
            shortcut,
            parallel,
        }
    }

    /// `[B, in, h, w]` -> `[B, out, h, w]`.
    pub fn forward(&self, inputs: &Tensor, training: bool) -> Tensor {
        if self.parallel {
            return self.forward_parallel(inputs, training);
        }
        let size = (inputs.size()[2], inputs.size()[3]);
        let mut feats = vec![self.scales[0].forward(inputs, training)]; // [B, branch, h, w]
                                                                        // `feat_up` lives until it is rebound (and the last one to return).
        let mut feat_up: Option<Tensor> = None;
        for (i, scale) in self.scales.iter().enumerate().skip(1) {
            // F.interpolate(..., mode='bilinear'): align_corners None is False.
            let up = feat_up.insert(resize_bilinear(
                &scale.forward(inputs, training),
                size,
                false,
            ));
            let sum = &*up + &feats[i - 1];
            feats.push(self.processes[i - 1].forward(&sum, training));
        }
        let cat = Tensor::cat(&feats, 1); // [B, branch * num_scales, h, w]
        let out =
            self.compression.forward(&cat, training) + self.shortcut.forward(inputs, training);
        drop((cat, feat_up));
        out
    }

    /// PAPPM's forward: every scale added to `x_` in parallel, one grouped
    /// conv over them.
    fn forward_parallel(&self, inputs: &Tensor, training: bool) -> Tensor {
        let size = (inputs.size()[2], inputs.size()[3]);
        let x_ = self.scales[0].forward(inputs, training); // [B, branch, h, w]
        let mut feats = Vec::with_capacity(self.scales.len() - 1);
        let mut feat_up: Option<Tensor> = None;
        for scale in &self.scales[1..] {
            let up = feat_up.insert(resize_bilinear(
                &scale.forward(inputs, training),
                size,
                false,
            ));
            feats.push(&*up + &x_);
        }
        let scale_out = self.processes[0].forward(&Tensor::cat(&feats, 1), training);
        let cat = Tensor::cat(&[&x_, &scale_out], 1); // [B, branch * num_scales, h, w]
        let out =
            self.compression.forward(&cat, training) + self.shortcut.forward(inputs, training);
        drop((cat, feat_up));
        out
    }
}

#[cfg(test)]
#[path = "ppm_tests.rs"]
mod tests;
