//! The building blocks MMSeg models are made of, each calling the same ATen
//! ops, with the same views and copies, as the PyTorch/mmcv module it
//! reproduces: so that libtorch allocates, saves for backward and frees
//! exactly what the Python model does.

use super::params::ParamScope;
use std::cell::Cell;
use std::sync::OnceLock;
use tch::{Kind, Tensor};

/// Keeps a softmax's input alive as long as its output (see
/// [`emulate_softmax_saving_input`]).
type KeepInputHook = fn(input: &Tensor, output: &Tensor);

static SOFTMAX_KEEPS_INPUT: OnceLock<KeepInputHook> = OnceLock::new();

/// Makes `softmax` and `log_softmax` keep their input for backward next to
/// their output, as autograd did up to PyTorch 1.10 (pytorch/pytorch#64000,
/// fixed in 1.11): what MMSeg's model-zoo memory figures were measured with.
/// `hook` ties the input's lifetime to the output's. Process-wide; PyTorch
/// 2.x behaviour (output only) is the default.
pub fn emulate_softmax_saving_input(hook: KeepInputHook) {
    let _ = SOFTMAX_KEEPS_INPUT.set(hook);
}

/// Whether softmax inputs are being kept (see [`emulate_softmax_saving_input`]).
pub fn softmax_keeps_input() -> bool {
    SOFTMAX_KEEPS_INPUT.get().is_some()
}

/// Called after every softmax / log_softmax whose backward may run.
pub fn softmax_saved(input: &Tensor, output: &Tensor) {
    if let Some(hook) = SOFTMAX_KEEPS_INPUT.get() {
        if input.requires_grad() {
            hook(input, output);
        }
    }
}

thread_local! {
    static FORWARD_FLOPS: Cell<f64> = const { Cell::new(0.0) };
}

/// Adds to the forward FLOP count of the current thread (multiply-adds
/// count two).
fn count_flops(flops: f64) {
    FORWARD_FLOPS.with(|f| f.set(f.get() + flops));
}

/// Takes (and resets) the forward FLOPs counted by convolutions, linear
/// layers and attention matmuls on this thread.
pub fn take_forward_flops() -> f64 {
    FORWARD_FLOPS.with(|f| f.replace(0.0))
}

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
    pub fn stride(mut self, s: i64) -> ConvSpec {
        self.stride = s;
        self
    }
    pub fn padding(mut self, p: i64) -> ConvSpec {
        self.padding = p;
        self
    }
    pub fn groups(mut self, g: i64) -> ConvSpec {
        self.groups = g;
        self
    }
    pub fn bias(mut self, b: bool) -> ConvSpec {
        self.bias = b;
        self
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

/// `nn.Linear`.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn new(p: &mut ParamScope, in_features: i64, out_features: i64, bias: bool) -> Linear {
        let weight = p.param_normal("weight", &[out_features, in_features], 0.02);
        let bias = bias.then(|| p.param_zeros("bias", &[out_features]));
        Linear { weight, bias }
    }
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let rows: i64 = x.size()[..x.dim() - 1].iter().product();
        count_flops(2.0 * (rows * self.weight.size()[0] * self.weight.size()[1]) as f64);
        x.linear(&self.weight, self.bias.as_ref())
    }
}

/// `nn.LayerNorm` over the last dimension.
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    dim: i64,
    eps: f64,
}

impl LayerNorm {
    pub fn new(p: &mut ParamScope, dim: i64, eps: f64) -> LayerNorm {
        LayerNorm {
            weight: p.param_ones("weight", &[dim]),
            bias: p.param_zeros("bias", &[dim]),
            dim,
            eps,
        }
    }
    pub fn forward(&self, x: &Tensor) -> Tensor {
        // F.layer_norm passes torch.backends.cudnn.enabled (True).
        x.layer_norm(
            [self.dim],
            Some(&self.weight),
            Some(&self.bias),
            self.eps,
            true,
        )
    }
}

/// `nn.BatchNorm2d` in training mode (SyncBN on one device is plain BN).
pub struct BatchNorm2d {
    weight: Tensor,
    bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
    num_batches_tracked: Tensor,
    eps: f64,
    momentum: f64,
}

impl BatchNorm2d {
    pub fn new(
        p: &mut ParamScope,
        channels: i64,
        eps: f64,
        momentum: f64,
        requires_grad: bool,
    ) -> BatchNorm2d {
        let weight = p.param_ones("weight", &[channels]);
        let bias = p.param_zeros("bias", &[channels]);
        if !requires_grad {
            p.freeze_last(2);
        }
        BatchNorm2d {
            weight,
            bias,
            running_mean: p.buffer(
                "running_mean",
                Tensor::zeros([channels], (Kind::Float, p.device())),
            ),
            running_var: p.buffer(
                "running_var",
                Tensor::ones([channels], (Kind::Float, p.device())),
            ),
            num_batches_tracked: p.buffer(
                "num_batches_tracked",
                Tensor::zeros([], (Kind::Int64, p.device())),
            ),
            eps,
            momentum,
        }
    }
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        if training {
            tch::no_grad(|| {
                let _ = self.num_batches_tracked.shallow_clone().g_add_scalar_(1);
            });
        }
        Tensor::batch_norm(
            x,
            Some(&self.weight),
            Some(&self.bias),
            Some(&self.running_mean),
            Some(&self.running_var),
            training,
            self.momentum,
            self.eps,
            true,
        )
    }
}

/// mmcv's `ConvModule` with the default order conv -> norm -> act, BN and
/// an in-place ReLU (mmcv's default `inplace=True`).
pub struct ConvModule {
    conv: Conv2d,
    norm: Option<BatchNorm2d>,
    relu: bool,
}

impl ConvModule {
    /// `norm`: BN eps/momentum/requires_grad, or `None` for no norm (then
    /// the conv has a bias, as mmcv's `bias='auto'` gives).
    pub fn new(
        p: &mut ParamScope,
        spec: ConvSpec,
        norm: Option<super::NormCfg>,
        relu: bool,
    ) -> ConvModule {
        let conv = Conv2d::new(&mut p.sub("conv"), spec.bias(norm.is_none()));
        let norm = norm.map(|n| {
            BatchNorm2d::new(
                &mut p.sub(n.module_name()),
                spec.out_channels,
                n.eps,
                n.momentum,
                n.requires_grad,
            )
        });
        ConvModule { conv, norm, relu }
    }
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut y = self.conv.forward(x);
        if let Some(n) = &self.norm {
            y = n.forward(&y, training);
        }
        if self.relu {
            let _ = y.relu_();
        }
        y
    }
}

/// mmcv's `DropPath` (stochastic depth), as `drop_path()` computes it.
pub struct DropPath {
    pub prob: f64,
}

impl DropPath {
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        if self.prob == 0.0 || !training {
            return x.shallow_clone();
        }
        let keep = 1.0 - self.prob;
        let mut shape = vec![x.size()[0]];
        shape.extend(std::iter::repeat_n(1, x.dim() - 1));
        let random = Tensor::rand(&shape, (x.kind(), x.device())) + keep;
        x.g_div_scalar(keep) * random.floor()
    }
}

/// `nn.MultiheadAttention` in training mode with `need_weights=True` (its
/// default): the explicit `(B*heads, L, S)` attention matrix is computed and
/// kept for backward, and the head-averaged weights are computed too, as
/// `F.multi_head_attention_forward` does.
pub struct MultiheadAttention {
    in_proj_weight: Tensor,
    in_proj_bias: Option<Tensor>,
    out_proj: Linear,
    embed_dims: i64,
    num_heads: i64,
}

impl MultiheadAttention {
    pub fn new(
        p: &mut ParamScope,
        embed_dims: i64,
        num_heads: i64,
        bias: bool,
    ) -> MultiheadAttention {
        let bound = (6.0 / (embed_dims + 3 * embed_dims) as f64).sqrt();
        let in_proj_weight =
            p.param_uniform("in_proj_weight", &[3 * embed_dims, embed_dims], bound);
        let in_proj_bias = bias.then(|| p.param_zeros("in_proj_bias", &[3 * embed_dims]));
        let out_proj = Linear::new(&mut p.sub("out_proj"), embed_dims, embed_dims, bias);
        MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
            embed_dims,
            num_heads,
        }
    }

    /// `query`: (L, B, E); `key_value`: (S, B, E), one tensor used as both
    /// key and value (the `k is v` branch of `_in_projection_packed`).
    pub fn forward(&self, query: &Tensor, key_value: &Tensor) -> Tensor {
        let (e, heads) = (self.embed_dims, self.num_heads);
        let (tgt_len, bsz) = (query.size()[0], query.size()[1]);
        let src_len = key_value.size()[0];
        let head_dim = e / heads;
        let w = self.in_proj_weight.split_with_sizes([e, 2 * e], 0);
        let (q, kv) = match &self.in_proj_bias {
            Some(b) => {
                let b = b.split_with_sizes([e, 2 * e], 0);
                (
                    query.linear(&w[0], Some(&b[0])),
                    key_value.linear(&w[1], Some(&b[1])),
                )
            }
            None => (
                query.linear::<Tensor>(&w[0], None),
                key_value.linear::<Tensor>(&w[1], None),
            ),
        };
        let kv = kv
            .unflatten(-1, [2, e])
            .unsqueeze(0)
            .transpose(0, -2)
            .squeeze_dim(-2)
            .contiguous();
        let (k, v) = (kv.select(0, 0), kv.select(0, 1));
        let q = q.view([tgt_len, bsz * heads, head_dim]).transpose(0, 1);
        let k = k.view([src_len, bsz * heads, head_dim]).transpose(0, 1);
        let v = v.view([src_len, bsz * heads, head_dim]).transpose(0, 1);
        // in-projections, the two attention matmuls (the out-projection counts itself)
        count_flops(2.0 * ((tgt_len * bsz) * e * e + (src_len * bsz) * 2 * e * e) as f64);
        count_flops(2.0 * 2.0 * (bsz * heads * tgt_len * src_len * head_dim) as f64);
        let q_scaled = q * (1.0 / head_dim as f64).sqrt();
        let logits = q_scaled.bmm(&k.transpose(-2, -1));
        let weights = logits.softmax(-1, None::<Kind>);
        softmax_saved(&logits, &weights);
        drop(logits);
        let out = weights.bmm(&v);
        let out = out.transpose(0, 1).contiguous().view([tgt_len * bsz, e]);
        let out = self.out_proj.forward(&out).view([tgt_len, bsz, e]);
        // The averaged weights are returned (and dropped) by nn.MultiheadAttention.
        let _averaged =
            weights
                .view([bsz, heads, tgt_len, src_len])
                .mean_dim(1, false, None::<Kind>);
        out
    }
}

/// mmseg's `nlc_to_nchw`: `x.transpose(1, 2).reshape(B, C, H, W)` (a copy).
pub fn nlc_to_nchw(x: &Tensor, hw: (i64, i64)) -> Tensor {
    let s = x.size();
    x.transpose(1, 2).reshape([s[0], s[2], hw.0, hw.1])
}

/// mmseg's `nchw_to_nlc`: `x.flatten(2).transpose(1, 2).contiguous()`.
pub fn nchw_to_nlc(x: &Tensor) -> Tensor {
    x.flatten(2, -1).transpose(1, 2).contiguous()
}

/// mmseg's `resize` (F.interpolate, bilinear, to a size).
pub fn resize_bilinear(x: &Tensor, size: (i64, i64), align_corners: bool) -> Tensor {
    x.upsample_bilinear2d([size.0, size.1], align_corners, None, None)
}
