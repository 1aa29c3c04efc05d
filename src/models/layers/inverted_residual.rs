//! MobileNetV3's blocks, as `mmseg/models/utils/inverted_residual.py`
//! (`InvertedResidualV3`), `se_layer.py` (`SELayer`) and
//! `make_divisible.py` build them, with mmcv's `ConvModule` taking any
//! [`Activation`] and mmcv's `Conv2dAdaptivePadding`
//! (`mmcv/cnn/bricks/conv2d_adaptive_padding.py`).
//!
//! Howard et al., "Searching for MobileNetV3", ICCV 2019, arXiv:1905.02244.
//!
//! MobileNetV2's block, `InvertedResidual` of the same file, is
//! [`InvertedResidual`] here, for MobileNetV2 (ReLU6) and Fast-SCNN (its
//! `act_cfg`, ReLU): Sandler et al., "MobileNetV2: Inverted Residuals and
//! Linear Bottlenecks", CVPR 2018, arXiv:1801.04381.

use super::activation::Activation;
use super::conv::{ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::NormCfg;
use tch::Tensor;

/// mmseg's `make_divisible(value, divisor)` (`min_value=divisor`,
/// `min_ratio=0.9`): `value` rounded to the nearest multiple of `divisor`,
/// but never below 90% of it.
pub fn make_divisible(value: f64, divisor: i64) -> i64 {
    let d = divisor as f64;
    let mut new_value = divisor.max(((value + d / 2.0) as i64) / divisor * divisor);
    if (new_value as f64) < 0.9 * value {
        new_value += divisor;
    }
    new_value
}

/// mmcv's `ConvModule` (conv -> norm -> act) with any activation (or
/// none), its conv optionally a `Conv2dAdaptivePadding`: TensorFlow's
/// 'same' padding, which `F.pad` adds to the input (a new tensor, which
/// the conv saves) before a conv without padding.
pub struct ConvAct {
    module: ConvModule,
    act: Option<Activation>,
    /// `Conv2dAdaptivePadding`'s `(kernel, stride, dilation)`.
    same_padding: Option<(i64, i64, i64)>,
}

impl ConvAct {
    /// `bias`: the conv's (mmcv's `'auto'` is `norm.is_none()`).
    pub fn new(
        p: &mut ParamScope,
        spec: ConvSpec,
        norm: Option<NormCfg>,
        act: Option<Activation>,
        bias: bool,
    ) -> ConvAct {
        ConvAct {
            module: ConvModule::with_conv_bias(p, spec, norm, false, bias),
            act,
            same_padding: None,
        }
    }

    /// The conv as `Conv2dAdaptivePadding` (its own padding is 0, whatever
    /// `spec` says: its `__init__` passes 0 to `nn.Conv2d`).
    pub fn adaptive(
        p: &mut ParamScope,
        spec: ConvSpec,
        norm: Option<NormCfg>,
        act: Option<Activation>,
    ) -> ConvAct {
        let mut conv = ConvAct::new(p, spec.padding(0), norm, act, norm.is_none());
        conv.same_padding = Some((spec.kernel, spec.stride, spec.dilation));
        conv
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let y = match self.same_padding {
            Some(geometry) => match same_pad(x, geometry) {
                Some(padded) => self.module.forward(&padded, training),
                None => self.module.forward(x, training),
            },
            None => self.module.forward(x, training),
        };
        match self.act {
            Some(act) => act.apply(y),
            None => y,
        }
    }
}

/// `Conv2dAdaptivePadding.forward`'s `F.pad`, `None` when it pads nothing.
fn same_pad(x: &Tensor, (kernel, stride, dilation): (i64, i64, i64)) -> Option<Tensor> {
    let size = x.size();
    let pad = |img: i64| {
        let out = (img + stride - 1) / stride; // math.ceil(img / stride)
        ((out - 1) * stride + (kernel - 1) * dilation + 1 - img).max(0)
    };
    let (pad_h, pad_w) = (pad(size[2]), pad(size[3]));
    (pad_h > 0 || pad_w > 0)
        .then(|| x.constant_pad_nd([pad_w / 2, pad_w - pad_w / 2, pad_h / 2, pad_h - pad_h / 2]))
}

/// `SELayer(channels, ratio, act_cfg=(ReLU, HSigmoid(bias=3, divisor=6)))`:
/// global average pooling, two 1x1 ConvModules without norm (so with
/// bias), and the input scaled by their output (`x * out`).
pub struct SeLayer {
    conv1: ConvAct,
    conv2: ConvAct,
}

impl SeLayer {
    pub fn new(p: &mut ParamScope, channels: i64, ratio: i64) -> SeLayer {
        let squeezed = make_divisible((channels / ratio) as f64, 8);
        let hsigmoid = Activation::HSigmoid {
            bias: 3.0,
            divisor: 6.0,
        };
        SeLayer {
            conv1: ConvAct::new(
                &mut p.sub("conv1"),
                ConvSpec::new(channels, squeezed, 1),
                None,
                Some(Activation::Relu),
                true,
            ),
            conv2: ConvAct::new(
                &mut p.sub("conv2"),
                ConvSpec::new(squeezed, channels, 1),
                None,
                Some(hsigmoid),
                true,
            ),
        }
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        // nn.AdaptiveAvgPool2d(1) (a mean over H, W on the CPU).
        let out = x.adaptive_avg_pool2d([1, 1]); // [B, C, 1, 1]
        let out = self.conv1.forward(&out, training);
        let out = self.conv2.forward(&out, training);
        x * out
    }
}

/// The depthwise conv's geometry once the backbone has changed it
/// (MobileNetV3 sets the stride, dilation and padding of its deep stages'
/// depthwise convs after building them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DepthwiseGeometry {
    pub stride: i64,
    pub dilation: i64,
    /// Ignored by a `Conv2dAdaptivePadding` (a block built with stride 2).
    pub padding: i64,
}

/// `InvertedResidualV3(in_channels, out_channels, mid_channels,
/// kernel_size, stride, se_cfg, with_expand_conv, norm_cfg, act_cfg)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InvertedResidualV3Spec {
    pub in_channels: i64,
    pub out_channels: i64,
    pub mid_channels: i64,
    pub kernel_size: i64,
    /// The stride it is built with: 2 makes the depthwise conv a
    /// `Conv2dAdaptivePadding`; 1 with equal channels adds the shortcut.
    pub stride: i64,
    /// `se_cfg=dict(channels=mid_channels, ratio=4, ...)` (else `None`).
    pub with_se: bool,
    pub with_expand_conv: bool,
    pub act: Activation,
    pub norm: Option<NormCfg>,
    pub depthwise: DepthwiseGeometry,
}

/// `expand_conv` (1x1, unless `with_expand_conv` is false),
/// `depthwise_conv`, `se`, `linear_conv` (1x1, no activation) and the
/// identity shortcut.
pub struct InvertedResidualV3 {
    expand_conv: Option<ConvAct>,
    depthwise_conv: ConvAct,
    se: Option<SeLayer>,
    linear_conv: ConvAct,
    with_res_shortcut: bool,
}

impl InvertedResidualV3 {
    pub fn new(p: &mut ParamScope, s: &InvertedResidualV3Spec) -> InvertedResidualV3 {
        let (norm, act) = (s.norm, Some(s.act));
        let bias = norm.is_none();
        let expand_conv = s.with_expand_conv.then(|| {
            let spec = ConvSpec::new(s.in_channels, s.mid_channels, 1);
            ConvAct::new(&mut p.sub("expand_conv"), spec, norm, act, bias)
        });
        let g = s.depthwise;
        let spec = ConvSpec::new(s.mid_channels, s.mid_channels, s.kernel_size)
            .stride(g.stride)
            .padding(g.padding)
            .dilation(g.dilation)
            .groups(s.mid_channels);
        let mut dp = p.sub("depthwise_conv");
        let depthwise_conv = if s.stride == 2 {
            ConvAct::adaptive(&mut dp, spec, norm, act)
        } else {
            ConvAct::new(&mut dp, spec, norm, act, bias)
        };
        let se = s
            .with_se
            .then(|| SeLayer::new(&mut p.sub("se"), s.mid_channels, 4));
        let spec = ConvSpec::new(s.mid_channels, s.out_channels, 1);
        let linear_conv = ConvAct::new(&mut p.sub("linear_conv"), spec, norm, None, bias);
        InvertedResidualV3 {
            expand_conv,
            depthwise_conv,
            se,
            linear_conv,
            with_res_shortcut: s.stride == 1 && s.in_channels == s.out_channels,
        }
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut out = match &self.expand_conv {
            Some(conv) => conv.forward(x, training),
            None => x.shallow_clone(),
        };
        out = self.depthwise_conv.forward(&out, training);
        if let Some(se) = &self.se {
            out = se.forward(&out, training);
        }
        out = self.linear_conv.forward(&out, training);
        if self.with_res_shortcut {
            x + out
        } else {
            out
        }
    }
}

/// The activation after an [`InvertedResidual`]'s expansion and depthwise
/// convs (`act_cfg`; the projection has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockAct {
    /// mmcv's `ReLU6(inplace=True)` (`hardtanh_(x, 0, 6)`: `relu6_`, whose
    /// output autograd saves): MMSeg's default, MobileNetV2's.
    Relu6,
    /// `ReLU(inplace=True)` through the `ConvModule` (Fast-SCNN).
    Relu,
    /// None (a linear conv).
    Linear,
}

/// A `ConvModule` with BN and a [`BlockAct`].
struct ConvNormAct {
    conv: ConvModule,
    relu6: bool,
}

impl ConvNormAct {
    fn new(p: &mut ParamScope, spec: ConvSpec, norm: Option<NormCfg>, act: BlockAct) -> Self {
        ConvNormAct {
            conv: ConvModule::new(p, spec, norm, act == BlockAct::Relu),
            relu6: act == BlockAct::Relu6,
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut y = self.conv.forward(x, training);
        if self.relu6 {
            super::relu6_(&mut y);
        }
        y
    }
}

/// MMSeg's `InvertedResidual(in_channels, out_channels, stride,
/// expand_ratio, dilation, norm_cfg, act_cfg)`: `conv.0` the 1x1
/// expansion (absent when `expand_ratio == 1`), the 3x3 depthwise (padding
/// and dilation `dilation`), both with `act`, then the linear 1x1
/// projection; the input added back where the shape allows.
pub struct InvertedResidual {
    convs: Vec<ConvNormAct>,
    use_res_connect: bool,
}

impl InvertedResidual {
    pub fn new(
        p: &mut ParamScope,
        (in_channels, out_channels): (i64, i64),
        (stride, dilation): (i64, i64),
        expand_ratio: i64,
        norm: Option<NormCfg>,
        act: BlockAct,
    ) -> InvertedResidual {
        let hidden = (in_channels as f64 * expand_ratio as f64).round() as i64;
        let mut cp = p.sub("conv");
        let mut convs = Vec::new();
        if expand_ratio != 1 {
            let spec = ConvSpec::new(in_channels, hidden, 1);
            convs.push(ConvNormAct::new(&mut cp.sub(0), spec, norm, act));
        }
        let depthwise = ConvSpec::new(hidden, hidden, 3)
            .stride(stride)
            .padding(dilation)
            .dilation(dilation)
            .groups(hidden);
        convs.push(ConvNormAct::new(
            &mut cp.sub(convs.len() as i64),
            depthwise,
            norm,
            act,
        ));
        let project = ConvSpec::new(hidden, out_channels, 1);
        convs.push(ConvNormAct::new(
            &mut cp.sub(convs.len() as i64),
            project,
            norm,
            BlockAct::Linear,
        ));
        InvertedResidual {
            convs,
            use_res_connect: stride == 1 && in_channels == out_channels,
        }
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        // nn.Sequential: each intermediate dies once the next exists.
        let mut out = self.convs[0].forward(x, training);
        for conv in &self.convs[1..] {
            out = conv.forward(&out, training);
        }
        if self.use_res_connect {
            x + out
        } else {
            out
        }
    }
}

#[cfg(test)]
#[path = "inverted_residual_tests.rs"]
mod tests;
