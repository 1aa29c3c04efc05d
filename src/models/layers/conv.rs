//! `nn.Conv2d` and mmcv's `ConvModule` (`mmcv/cnn/bricks/conv_module.py`).

use super::count_flops;
use super::norm::ConvNorm;
use crate::models::params::ParamScope;
use crate::models::NormCfg;
use tch::Tensor;

/// `nn.Conv2d` (mmcv `Conv2d` behaves the same on non-empty input).
pub struct Conv2d {
    weight: Tensor,
    bias: Option<Tensor>,
    stride: i64,
    padding: i64,
    dilation: i64,
    groups: i64,
}

/// The shape of a convolution.
#[derive(Debug, Clone, Copy)]
pub struct ConvSpec {
    pub in_channels: i64,
    pub out_channels: i64,
    pub kernel: i64,
    pub stride: i64,
    pub padding: i64,
    pub dilation: i64,
    pub groups: i64,
    pub bias: bool,
}

impl ConvSpec {
    pub fn new(in_channels: i64, out_channels: i64, kernel: i64) -> ConvSpec {
        ConvSpec {
            in_channels,
            out_channels,
            kernel,
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
            bias: true,
        }
    }
    pub fn stride(self, stride: i64) -> ConvSpec {
        ConvSpec { stride, ..self }
    }
    pub fn padding(self, padding: i64) -> ConvSpec {
        ConvSpec { padding, ..self }
    }
    pub fn dilation(self, dilation: i64) -> ConvSpec {
        ConvSpec { dilation, ..self }
    }
    pub fn groups(self, groups: i64) -> ConvSpec {
        ConvSpec { groups, ..self }
    }
    pub fn bias(self, bias: bool) -> ConvSpec {
        ConvSpec { bias, ..self }
    }
}

impl Conv2d {
    /// Weights drawn as MMSeg's backbones draw them: normal with std
    /// `sqrt(2 / fan_out)` (the values do not change memory or speed).
    pub fn new(p: &mut ParamScope, spec: ConvSpec) -> Conv2d {
        let fan_out = spec.kernel * spec.kernel * spec.out_channels / spec.groups;
        let std = (2.0 / fan_out as f64).sqrt();
        let weight = p.param_normal(
            "weight",
            &[
                spec.out_channels,
                spec.in_channels / spec.groups,
                spec.kernel,
                spec.kernel,
            ],
            std,
        );
        let bias = spec
            .bias
            .then(|| p.param_zeros("bias", &[spec.out_channels]));
        Conv2d {
            weight,
            bias,
            stride: spec.stride,
            padding: spec.padding,
            dilation: spec.dilation,
            groups: spec.groups,
        }
    }

    /// `conv.weight`, `[out, in / groups, kh, kw]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let (b, h, w) = (x.size()[0], x.size()[2], x.size()[3]);
        let ws = self.weight.size();
        let out =
            |n: i64, k: i64| (n + 2 * self.padding - self.dilation * (k - 1) - 1) / self.stride + 1;
        count_flops(
            2.0 * (b * ws[0] * ws[1] * ws[2] * ws[3]) as f64
                * (out(h, ws[2]) * out(w, ws[3])) as f64,
        );
        x.conv2d(
            &self.weight,
            self.bias.as_ref(),
            [self.stride, self.stride],
            [self.padding, self.padding],
            [self.dilation, self.dilation],
            self.groups,
        )
    }
}

/// mmcv's `ConvModule` with the default order conv -> norm -> act, BN and
/// a ReLU, in place unless built with `inplace=False`
/// ([`ConvModule::out_of_place`]); or with `order=('norm', 'act', 'conv')`
/// ([`ConvModule::norm_act_conv`]).
pub struct ConvModule {
    conv: Conv2d,
    norm: Option<ConvNorm>,
    relu: bool,
    inplace: bool,
    /// `order=('norm', 'act', 'conv')`: the norm (on the input channels)
    /// and the ReLU come before the conv.
    norm_first: bool,
}

impl ConvModule {
    /// `norm`: BN eps/momentum/requires_grad, or `None` for no norm (then
    /// the conv has a bias, as mmcv's `bias='auto'` gives).
    pub fn new(
        p: &mut ParamScope,
        spec: ConvSpec,
        norm: Option<NormCfg>,
        relu: bool,
    ) -> ConvModule {
        Self::with_conv_bias(p, spec, norm, relu, norm.is_none())
    }

    /// `ConvModule(..., bias=True/False)` set explicitly rather than `'auto'`.
    pub fn with_conv_bias(
        p: &mut ParamScope,
        spec: ConvSpec,
        norm: Option<NormCfg>,
        relu: bool,
        bias: bool,
    ) -> ConvModule {
        Self::registered(p, spec.bias(bias), norm, relu, false)
    }

    /// `ConvModule(..., bias=False, order=('norm', 'act', 'conv'))`, the
    /// only pre-norm form MMSeg's models build: mmcv registers the conv,
    /// then the norm over the *input* channels; the forward normalises,
    /// applies the ReLU in place, then convolves.
    pub fn norm_act_conv(
        p: &mut ParamScope,
        spec: ConvSpec,
        norm: NormCfg,
        relu: bool,
    ) -> ConvModule {
        Self::registered(p, spec.bias(false), Some(norm), relu, true)
    }

    /// Registers the conv, then the norm: over the conv's output channels,
    /// or its input channels when the norm comes first.
    fn registered(
        p: &mut ParamScope,
        spec: ConvSpec,
        norm: Option<NormCfg>,
        relu: bool,
        norm_first: bool,
    ) -> ConvModule {
        let conv = Conv2d::new(&mut p.sub("conv"), spec);
        let norm_channels = if norm_first {
            spec.in_channels
        } else {
            spec.out_channels
        };
        let norm = norm.map(|n| ConvNorm::new(&mut p.sub(n.module_name()), norm_channels, &n));
        ConvModule {
            conv,
            norm,
            relu,
            inplace: true,
            norm_first,
        }
    }

    /// `ConvModule(..., inplace=False)`: the ReLU makes a new tensor (which
    /// autograd saves instead of the norm's output).
    pub fn out_of_place(mut self) -> ConvModule {
        self.inplace = false;
        self
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        if self.norm_first {
            return self.forward_norm_first(x, training);
        }
        let mut y = self.conv.forward(x);
        if let Some(n) = &self.norm {
            y = n.forward(&y, training);
        }
        if self.relu {
            if self.inplace {
                let _ = y.relu_();
            } else {
                y = y.relu();
            }
        }
        y
    }

    /// `order=('norm', 'act', 'conv')`.
    fn forward_norm_first(&self, x: &Tensor, training: bool) -> Tensor {
        let mut y = match &self.norm {
            Some(n) => n.forward(x, training),
            None => x.shallow_clone(),
        };
        if self.relu {
            if self.inplace {
                let _ = y.relu_();
            } else {
                y = y.relu();
            }
        }
        self.conv.forward(&y)
    }
}

/// mmcv's `DepthwiseSeparableConvModule`
/// (`mmcv/cnn/bricks/depthwise_separable_conv_module.py`): a depthwise
/// ConvModule (`groups = in_channels`) then a pointwise 1x1 ConvModule, both
/// with the module's norm; the pointwise one with a ReLU, the depthwise one
/// too unless `dw_act_cfg=None` (`depthwise_relu == false`).
/// [`DepthwiseSeparableConvModule::with_parts`] sets each part's norm and
/// ReLU apart (`dw_norm_cfg`, `dw_act_cfg`, `pw_norm_cfg`, `pw_act_cfg`).
pub struct DepthwiseSeparableConvModule {
    depthwise_conv: ConvModule,
    pointwise_conv: ConvModule,
}

impl DepthwiseSeparableConvModule {
    /// `spec`: the depthwise conv's shape with the module's in/out channels
    /// (its groups are set here).
    pub fn new(
        p: &mut ParamScope,
        spec: ConvSpec,
        norm: Option<NormCfg>,
        depthwise_relu: bool,
    ) -> Self {
        Self::with_parts(p, spec, (norm, depthwise_relu), (norm, true))
    }

    /// `depthwise` and `pointwise`: each ConvModule's norm (`None`: none,
    /// and then a conv bias, mmcv's `bias='auto'`) and whether it has a
    /// ReLU.
    pub fn with_parts(
        p: &mut ParamScope,
        spec: ConvSpec,
        depthwise: (Option<NormCfg>, bool),
        pointwise: (Option<NormCfg>, bool),
    ) -> Self {
        let depthwise_spec = ConvSpec {
            out_channels: spec.in_channels,
            groups: spec.in_channels,
            ..spec
        };
        DepthwiseSeparableConvModule {
            depthwise_conv: ConvModule::new(
                &mut p.sub("depthwise_conv"),
                depthwise_spec,
                depthwise.0,
                depthwise.1,
            ),
            pointwise_conv: ConvModule::new(
                &mut p.sub("pointwise_conv"),
                ConvSpec::new(spec.in_channels, spec.out_channels, 1),
                pointwise.0,
                pointwise.1,
            ),
        }
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let x = self.depthwise_conv.forward(x, training);
        self.pointwise_conv.forward(&x, training)
    }
}

/// `nn.ConvTranspose2d` (groups 1, no dilation, no output padding, a bias).
pub struct ConvTranspose2d {
    weight: Tensor,
    bias: Tensor,
    stride: i64,
    padding: i64,
}

impl ConvTranspose2d {
    pub fn new(
        p: &mut ParamScope,
        cin: i64,
        cout: i64,
        kernel: i64,
        stride: i64,
        padding: i64,
    ) -> Self {
        // The values (nn.ConvTranspose2d's kaiming-uniform bound) do not
        // change memory or speed.
        let bound = 1.0 / ((cout * kernel * kernel) as f64).sqrt();
        ConvTranspose2d {
            weight: p.param_uniform("weight", &[cin, cout, kernel, kernel], bound),
            bias: p.param_uniform("bias", &[cout], bound),
            stride,
            padding,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let s = x.size(); // [B, C_in, H, W]
        let ws = self.weight.size();
        count_flops(2.0 * (s[0] * ws[0] * ws[1] * ws[2] * ws[3]) as f64 * (s[2] * s[3]) as f64);
        x.conv_transpose2d(
            &self.weight,
            Some(&self.bias),
            [self.stride, self.stride],
            [self.padding, self.padding],
            [0, 0],
            1,
            [1, 1],
        )
    }
}

#[cfg(test)]
#[path = "conv_tests.rs"]
mod tests;
