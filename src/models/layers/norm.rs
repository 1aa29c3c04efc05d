//! `nn.LayerNorm`, `nn.BatchNorm2d` and `nn.GroupNorm`.

use crate::config::Value;
use crate::models::component_config::ComponentConfig;
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::{Kind, Tensor};

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

/// How many GPUs a SyncBN layer's batch statistics span (the trial's
/// `--gpus`): each GPU's batch of one image is enough for MMSeg's SyncBN
/// when it trains on several.
static SYNC_BN_WORLD_SIZE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1);

/// Sets the number of GPUs SyncBN layers gather their statistics over.
pub fn set_sync_bn_world_size(gpus: i64) {
    SYNC_BN_WORLD_SIZE.store(gpus.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// `nn.BatchNorm2d` in training mode (SyncBN on one device is plain BN; on
/// several its statistics span every GPU's batch).
pub struct BatchNorm2d {
    weight: Tensor,
    bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
    num_batches_tracked: Tensor,
    eps: f64,
    momentum: f64,
    synced: bool,
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
            synced: false,
        }
    }
    /// A BN layer from a config's `norm_cfg`.
    pub fn from_cfg(p: &mut ParamScope, channels: i64, norm: &NormCfg) -> BatchNorm2d {
        BatchNorm2d {
            synced: norm.synced,
            ..BatchNorm2d::new(p, channels, norm.eps, norm.momentum, norm.requires_grad)
        }
    }

    /// `training`: batch statistics (and running-stat updates), as in
    /// `train()` mode; `false` for `eval()` mode (also what `norm_eval` and
    /// frozen stages give).
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        if training {
            let size = x.size();
            let gpus = if self.synced {
                SYNC_BN_WORLD_SIZE.load(std::sync::atomic::Ordering::Relaxed)
            } else {
                1
            };
            if gpus * size[0] * size[2..].iter().product::<i64>() == 1 {
                // F.batch_norm's `_verify_batch_size` (Python-side, so libtorch
                // does not check it): one value per channel has no variance.
                panic!("{}", one_value_per_channel(&size));
            }
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

/// `nn.GroupNorm` (mmcv's `GN`).
pub struct GroupNorm {
    weight: Tensor,
    bias: Tensor,
    num_groups: i64,
    eps: f64,
}

impl GroupNorm {
    pub fn new(p: &mut ParamScope, channels: i64, norm: &NormCfg) -> GroupNorm {
        let weight = p.param_ones("weight", &[channels]);
        let bias = p.param_zeros("bias", &[channels]);
        if !norm.requires_grad {
            p.freeze_last(2);
        }
        GroupNorm {
            weight,
            bias,
            num_groups: norm.num_groups.unwrap_or(1),
            eps: norm.eps,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        // F.group_norm passes torch.backends.cudnn.enabled (True).
        x.group_norm(
            self.num_groups,
            Some(&self.weight),
            Some(&self.bias),
            self.eps,
            true,
        )
    }
}

/// A ConvModule's norm layer: BN or GN.
pub enum ConvNorm {
    Batch(BatchNorm2d),
    Group(GroupNorm),
}

impl ConvNorm {
    pub fn new(p: &mut ParamScope, channels: i64, norm: &NormCfg) -> ConvNorm {
        match norm.num_groups {
            Some(_) => ConvNorm::Group(GroupNorm::new(p, channels, norm)),
            None => ConvNorm::Batch(BatchNorm2d::from_cfg(p, channels, norm)),
        }
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        match self {
            ConvNorm::Batch(bn) => bn.forward(x, training),
            ConvNorm::Group(gn) => gn.forward(x),
        }
    }
}

/// What PyTorch raises (`ValueError`) for BN in training on one value per
/// channel: batch 1 after global pooling (PSP, ASPP image pool).
pub fn one_value_per_channel(size: &[i64]) -> String {
    let dims: Vec<String> = size.iter().map(i64::to_string).collect();
    format!(
        "{ONE_VALUE_PER_CHANNEL}, got input size torch.Size([{}])",
        dims.join(", ")
    )
}

/// The start of [`one_value_per_channel`]'s message, to recognise it.
pub const ONE_VALUE_PER_CHANNEL: &str = "Expected more than 1 value per channel when training";

/// `norm_cfg=dict(type='LN', ...)`: mmcv's `build_norm_layer` of an
/// `nn.LayerNorm` (the transformer backbones' and heads' norms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormCfg {
    pub eps: f64,
    pub requires_grad: bool,
}

impl LayerNormCfg {
    /// `nn.LayerNorm`'s own defaults (`eps=1e-5`).
    pub const DEFAULT: LayerNormCfg = LayerNormCfg {
        eps: 1e-5,
        requires_grad: true,
    };

    /// The LN dict at `key`, `DEFAULT` when absent; any other norm type is
    /// refused naming the key.
    pub fn from_cfg(
        r: &mut ComponentConfig,
        key: &str,
        default: LayerNormCfg,
    ) -> Result<LayerNormCfg, ModelError> {
        match r.value(key) {
            None => Ok(default),
            Some(Value::Dict(d)) if d.get("type").and_then(Value::as_str) == Some("LN") => {
                if let Some(k) = d
                    .keys()
                    .find(|k| !matches!(k.as_str(), "type" | "eps" | "requires_grad"))
                {
                    return Err(r.unsupported(key, format!("LN setting `{k}` is not implemented")));
                }
                Ok(LayerNormCfg {
                    eps: d
                        .get("eps")
                        .and_then(Value::as_f64)
                        .unwrap_or(Self::DEFAULT.eps),
                    requires_grad: d.get("requires_grad").map(Value::truthy).unwrap_or(true),
                })
            }
            Some(_) => Err(r.unsupported(key, "only dict(type='LN') is implemented")),
        }
    }

    /// An `nn.LayerNorm(dims)` registered in `p` (frozen without
    /// `requires_grad`).
    pub fn build(&self, p: &mut ParamScope, dims: i64) -> LayerNorm {
        let norm = LayerNorm::new(p, dims, self.eps);
        if !self.requires_grad {
            p.freeze_last(2);
        }
        norm
    }
}

/// `F.normalize(x, dim=dim, p=p)`: `x / norm(x).clamp_min(1e-12)`.
pub fn normalize(x: &Tensor, p: f64, dim: i64) -> Tensor {
    let denom = x
        .linalg_norm(p, &[dim][..], true, None::<Kind>) // dispatches to linalg_vector_norm
        .clamp_min(1e-12);
    x / denom.expand_as(x)
}

#[cfg(test)]
#[path = "norm_tests.rs"]
mod tests;
