//! The optimizer wrapper of a config (`optim_wrapper`), reproduced op for op
//! on libtorch: PyTorch's AdamW/Adam/SGD, single-tensor (what `torch.optim`
//! runs on CPU) or foreach (its default on CUDA), mmengine's param groups from
//! `paramwise_cfg`, `clip_grad`, `accumulative_counts`, and
//! `AmpOptimWrapper` (autocast to fp16 with dynamic loss scaling, or bf16).
//!
//! [`OptimCfg`] reads the config, [`OptimWrapper`] (`wrapper.rs`) runs
//! `update_params`, `adam.rs` and `sgd.rs` hold the update arithmetic.

mod adam;
mod layer_decay;

pub use layer_decay::LayerDecay;
mod sgd;
mod wrapper;

pub use crate::kinds::Amp;
pub use wrapper::OptimWrapper;

use crate::config::{Dict, Value};
use tch::Tensor;

#[derive(Debug, Clone, PartialEq)]
enum Algorithm {
    Adam {
        betas: (f64, f64),
        eps: f64,
        decoupled: bool,
        amsgrad: bool,
        /// `fused=True`: torch.optim's `_fused_adam` kernel.
        fused: bool,
    },
    Sgd {
        momentum: f64,
        dampening: f64,
        nesterov: bool,
    },
}

/// The optimizer settings read from `optim_wrapper`.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimCfg {
    algorithm: Algorithm,
    pub type_name: String,
    lr: f64,
    weight_decay: f64,
    custom_keys: Vec<(String, f64, f64)>,
    bias_lr_mult: f64,
    bias_decay_mult: f64,
    norm_decay_mult: f64,
    pub clip_grad: Option<(f64, f64)>,
    pub accumulative_counts: i64,
    /// How parameters are grouped: the foreach optimizers, and the lazy
    /// state of every optimizer, work a group at a time.
    pub grouping: Grouping,
}

/// The optimizer's param groups, as the optim wrapper constructor makes them.
#[derive(Debug, Clone, PartialEq)]
pub enum Grouping {
    /// mmengine's `DefaultOptimWrapperConstructor` without `paramwise_cfg`:
    /// one group of all parameters.
    One,
    /// `DefaultOptimWrapperConstructor` with a (non-empty) `paramwise_cfg`:
    /// one group per parameter.
    PerParameter,
    /// MMSeg's layer-decay constructors: a group per layer and decay kind.
    LayerDecay(LayerDecay),
}

/// An `optim_wrapper` segtune cannot reproduce, or one that is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptimConfigError {
    #[error("the config has no `optim_wrapper` dict")]
    NoOptimWrapper,
    #[error("optim_wrapper type `{0}` is not supported (OptimWrapper, AmpOptimWrapper)")]
    UnsupportedWrapper(String),
    #[error("optim_wrapper has no `optimizer` dict")]
    NoOptimizer,
    #[error("optimizer `{0}` is not supported (AdamW, Adam, SGD)")]
    UnsupportedOptimizer(String),
    #[error("optimizer: fused=True with amsgrad=True is not built")]
    FusedAmsgrad,
    /// A setting (`lr`, `eps`, `max_norm`, ...) that is not a number.
    #[error("optimizer `{0}` must be a number")]
    NotANumber(String),
    #[error("paramwise_cfg.custom_keys values must be dicts")]
    CustomKeyNotADict,
    #[error("optim_wrapper.clip_grad must be a dict or None")]
    ClipGradNotADict,
    #[error("optim_wrapper.accumulative_counts must be >= 1")]
    NoAccumulation,
    /// A `constructor` segtune does not reproduce.
    #[error("optim_wrapper.constructor `{0}` is not supported (DefaultOptimWrapperConstructor, LearningRateDecayOptimizerConstructor, LayerDecayOptimizerConstructor)")]
    UnsupportedConstructor(String),
    /// A layer-decay constructor with settings MMSeg cannot take.
    #[error("optim_wrapper.constructor `{0}`: {1}")]
    Constructor(String, String),
}

fn num(d: &Dict, k: &str, default: f64) -> Result<f64, OptimConfigError> {
    match d.get(k) {
        None | Some(Value::None) => Ok(default),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| OptimConfigError::NotANumber(k.to_string())),
    }
}

/// The optimizer's algorithm and its settings, from `optim_wrapper.optimizer`.
fn algorithm_of(type_name: &str, opt: &Dict) -> Result<Algorithm, OptimConfigError> {
    let algorithm = match type_name {
        "AdamW" | "Adam" => {
            let betas = match opt.get("betas").and_then(Value::as_seq) {
                Some([a, b]) => (a.as_f64().unwrap_or(0.9), b.as_f64().unwrap_or(0.999)),
                _ => (0.9, 0.999),
            };
            Algorithm::Adam {
                betas,
                eps: num(opt, "eps", 1e-8)?,
                decoupled: type_name == "AdamW",
                amsgrad: opt.get("amsgrad").is_some_and(Value::truthy),
                fused: opt.get("fused").is_some_and(Value::truthy),
            }
        }
        "SGD" => Algorithm::Sgd {
            momentum: num(opt, "momentum", 0.0)?,
            dampening: num(opt, "dampening", 0.0)?,
            nesterov: opt.get("nesterov").is_some_and(Value::truthy),
        },
        other => return Err(OptimConfigError::UnsupportedOptimizer(other.to_string())),
    };
    if let Algorithm::Adam {
        amsgrad: true,
        fused: true,
        ..
    } = algorithm
    {
        return Err(OptimConfigError::FusedAmsgrad);
    }
    Ok(algorithm)
}

/// `paramwise_cfg.custom_keys` as `(key, lr_mult, decay_mult)`, in the
/// order mmengine matches them: longer keys first, alphabetically among
/// equals.
fn custom_keys_of(pw: Option<&Dict>) -> Result<Vec<(String, f64, f64)>, OptimConfigError> {
    let mut custom_keys: Vec<(String, f64, f64)> = Vec::new();
    if let Some(keys) = pw
        .and_then(|p| p.get("custom_keys"))
        .and_then(Value::as_dict)
    {
        for (k, v) in keys {
            let d = v.as_dict().ok_or(OptimConfigError::CustomKeyNotADict)?;
            custom_keys.push((
                k.clone(),
                num(d, "lr_mult", 1.0)?,
                num(d, "decay_mult", 1.0)?,
            ));
        }
    }
    custom_keys.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    Ok(custom_keys)
}

/// The grouping `optim_wrapper.constructor` makes (mmengine's default when
/// none is named).
fn grouping_of(cfg: &Dict, ow: &Dict, pw: Option<&Dict>) -> Result<Grouping, OptimConfigError> {
    let default = if pw.is_some_and(|p| !p.is_empty()) {
        Grouping::PerParameter
    } else {
        Grouping::One
    };
    match ow.get("constructor").and_then(Value::as_str) {
        None | Some("DefaultOptimWrapperConstructor") => Ok(default),
        Some(
            name @ ("LearningRateDecayOptimizerConstructor" | "LayerDecayOptimizerConstructor"),
        ) => {
            let backbone = cfg
                .get("model")
                .and_then(Value::as_dict)
                .and_then(|m| m.get("backbone"))
                .and_then(Value::as_dict)
                .and_then(|b| b.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("");
            Ok(Grouping::LayerDecay(LayerDecay::from_cfg(
                name, pw, backbone,
            )?))
        }
        Some(other) => Err(OptimConfigError::UnsupportedConstructor(other.to_string())),
    }
}

impl OptimCfg {
    pub fn from_cfg(cfg: &Dict) -> Result<OptimCfg, OptimConfigError> {
        let ow = cfg
            .get("optim_wrapper")
            .and_then(Value::as_dict)
            .ok_or(OptimConfigError::NoOptimWrapper)?;
        let wrapper = ow
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("OptimWrapper");
        if !matches!(wrapper, "OptimWrapper" | "AmpOptimWrapper") {
            return Err(OptimConfigError::UnsupportedWrapper(wrapper.to_string()));
        }
        let opt = ow
            .get("optimizer")
            .and_then(Value::as_dict)
            .ok_or(OptimConfigError::NoOptimizer)?;
        let type_name = opt
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let algorithm = algorithm_of(&type_name, opt)?;
        let default_wd = if type_name == "AdamW" { 0.01 } else { 0.0 };
        let pw = ow.get("paramwise_cfg").and_then(Value::as_dict);
        let grouping = grouping_of(cfg, ow, pw)?;
        let custom_keys = match grouping {
            // Its add_params replaces mmengine's: no custom keys, no multipliers.
            Grouping::LayerDecay(_) => Vec::new(),
            _ => custom_keys_of(pw)?,
        };
        let pw_num =
            |k: &str| -> Result<f64, OptimConfigError> { pw.map_or(Ok(1.0), |p| num(p, k, 1.0)) };
        let clip_grad = match ow.get("clip_grad") {
            None | Some(Value::None) => None,
            Some(Value::Dict(c)) => Some((num(c, "max_norm", 0.0)?, num(c, "norm_type", 2.0)?)),
            Some(_) => return Err(OptimConfigError::ClipGradNotADict),
        };
        let accumulative_counts = crate::config::train_loop::accumulative_counts(cfg).unwrap_or(1);
        if accumulative_counts < 1 {
            return Err(OptimConfigError::NoAccumulation);
        }
        Ok(OptimCfg {
            algorithm,
            type_name,
            lr: num(opt, "lr", 0.01)?,
            weight_decay: num(opt, "weight_decay", default_wd)?,
            custom_keys,
            bias_lr_mult: pw_num("bias_lr_mult")?,
            bias_decay_mult: pw_num("bias_decay_mult")?,
            norm_decay_mult: pw_num("norm_decay_mult")?,
            clip_grad,
            accumulative_counts,
            grouping,
        })
    }

    /// The group key, learning rate and weight decay of a parameter with
    /// `dims` dimensions (the key only matters for layer decay).
    pub(super) fn group_of(&self, name: &str, dims: usize) -> (String, f64, f64) {
        match &self.grouping {
            Grouping::LayerDecay(ld) => {
                let g = ld.group(name, dims, self.lr, self.weight_decay);
                (g.key, g.lr, g.weight_decay)
            }
            _ => {
                let (lr, wd) = self.default_group_of(name);
                (name.to_string(), lr, wd)
            }
        }
    }

    /// `(lr, weight_decay)` of one parameter, as mmengine's
    /// `DefaultOptimWrapperConstructor` assigns them.
    fn default_group_of(&self, name: &str) -> (f64, f64) {
        for (key, lr_mult, decay_mult) in &self.custom_keys {
            if name.contains(key.as_str()) {
                return (self.lr * lr_mult, self.weight_decay * decay_mult);
            }
        }
        let is_bias = name.ends_with(".bias");
        let is_norm = name.split('.').any(|part| {
            part.starts_with("norm") || part.starts_with("bn") || part.starts_with("ln")
        });
        let mut lr = self.lr;
        let mut wd = self.weight_decay;
        if is_norm {
            wd *= self.norm_decay_mult;
        } else if is_bias {
            lr *= self.bias_lr_mult;
            wd *= self.bias_decay_mult;
        }
        (lr, wd)
    }
}

struct ParamState {
    /// The key of its param group (its name unless layer decay groups it).
    group: String,
    param: Tensor,
    lr: f64,
    weight_decay: f64,
    step: Option<Tensor>,
    exp_avg: Option<Tensor>,
    exp_avg_sq: Option<Tensor>,
    max_exp_avg_sq: Option<Tensor>,
    momentum_buffer: Option<Tensor>,
}
