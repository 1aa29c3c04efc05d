//! The optimizer wrapper of a config (`optim_wrapper`), reproduced op for op
//! on libtorch: PyTorch's AdamW/Adam/SGD, single-tensor (what `torch.optim`
//! runs on CPU) or foreach (its default on CUDA), mmengine's param groups from
//! `paramwise_cfg`, `clip_grad`, `accumulative_counts`, and
//! `AmpOptimWrapper` (autocast to fp16 with dynamic loss scaling, or bf16).

use super::memory;
use crate::config::{Dict, Value};
use crate::models::params::ParamStore;
use tch::{Kind, Tensor};

/// Mixed precision (of a trial, a prediction, a search candidate).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Amp {
    Off,
    Fp16,
    Bf16,
}

impl Amp {
    /// The name on the command line and in reports (`off`, `fp16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Amp::Off => "off",
            Amp::Fp16 => "fp16",
            Amp::Bf16 => "bf16",
        }
    }

    pub fn kind(self) -> Option<Kind> {
        match self {
            Amp::Off => None,
            Amp::Fp16 => Some(Kind::Half),
            Amp::Bf16 => Some(Kind::BFloat16),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Algorithm {
    Adam {
        betas: (f64, f64),
        eps: f64,
        decoupled: bool,
        amsgrad: bool,
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
    /// mmengine makes one param group per parameter when `paramwise_cfg`
    /// is set (and non-empty), else one group of all parameters; the
    /// foreach optimizers work a group at a time.
    pub per_param_groups: bool,
}

fn num(d: &Dict, k: &str, default: f64) -> Result<f64, String> {
    match d.get(k) {
        None | Some(Value::None) => Ok(default),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| format!("optimizer `{k}` must be a number")),
    }
}

impl OptimCfg {
    pub fn from_cfg(cfg: &Dict) -> Result<OptimCfg, String> {
        let ow = cfg
            .get("optim_wrapper")
            .and_then(Value::as_dict)
            .ok_or("the config has no `optim_wrapper` dict")?;
        let wrapper = ow
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("OptimWrapper");
        if !matches!(wrapper, "OptimWrapper" | "AmpOptimWrapper") {
            return Err(format!(
                "optim_wrapper type `{wrapper}` is not supported (OptimWrapper, AmpOptimWrapper)"
            ));
        }
        let opt = ow
            .get("optimizer")
            .and_then(Value::as_dict)
            .ok_or("optim_wrapper has no `optimizer` dict")?;
        let type_name = opt
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let algorithm = match type_name.as_str() {
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
                }
            }
            "SGD" => Algorithm::Sgd {
                momentum: num(opt, "momentum", 0.0)?,
                dampening: num(opt, "dampening", 0.0)?,
                nesterov: opt.get("nesterov").is_some_and(Value::truthy),
            },
            other => {
                return Err(format!(
                    "optimizer `{other}` is not supported (AdamW, Adam, SGD)"
                ))
            }
        };
        let default_wd = if type_name == "AdamW" { 0.01 } else { 0.0 };
        let pw = ow.get("paramwise_cfg").and_then(Value::as_dict);
        let mut custom_keys: Vec<(String, f64, f64)> = Vec::new();
        if let Some(keys) = pw
            .and_then(|p| p.get("custom_keys"))
            .and_then(Value::as_dict)
        {
            for (k, v) in keys {
                let d = v
                    .as_dict()
                    .ok_or("paramwise_cfg.custom_keys values must be dicts")?;
                custom_keys.push((
                    k.clone(),
                    num(d, "lr_mult", 1.0)?,
                    num(d, "decay_mult", 1.0)?,
                ));
            }
        }
        // mmengine matches longer keys first, alphabetically among equals.
        custom_keys.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        let pw_num = |k: &str| -> Result<f64, String> { pw.map_or(Ok(1.0), |p| num(p, k, 1.0)) };
        let clip_grad = match ow.get("clip_grad") {
            None | Some(Value::None) => None,
            Some(Value::Dict(c)) => Some((num(c, "max_norm", 0.0)?, num(c, "norm_type", 2.0)?)),
            Some(_) => return Err("optim_wrapper.clip_grad must be a dict or None".into()),
        };
        let accumulative_counts = ow
            .get("accumulative_counts")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        if accumulative_counts < 1 {
            return Err("optim_wrapper.accumulative_counts must be >= 1".into());
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
            per_param_groups: pw.is_some_and(|p| !p.is_empty()),
        })
    }

    /// `(lr, weight_decay)` of one parameter, as mmengine's
    /// `DefaultOptimWrapperConstructor` assigns them.
    fn group_of(&self, name: &str) -> (f64, f64) {
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
    param: Tensor,
    lr: f64,
    weight_decay: f64,
    step: Option<Tensor>,
    exp_avg: Option<Tensor>,
    exp_avg_sq: Option<Tensor>,
    max_exp_avg_sq: Option<Tensor>,
    momentum_buffer: Option<Tensor>,
}

/// GradScaler state for fp16.
struct LossScaler {
    scale: Tensor,
    growth_tracker: Tensor,
}

/// The optimizer wrapper: `update_params(loss)` = scale, backward, and
/// every `accumulative_counts` calls step + `zero_grad(set_to_none=True)`.
pub struct OptimWrapper {
    cfg: OptimCfg,
    params: Vec<ParamState>,
    scaler: Option<LossScaler>,
    calls: i64,
    zero_in_place: bool,
    foreach: bool,
}

impl OptimWrapper {
    pub fn new(cfg: OptimCfg, store: &ParamStore, amp: Amp) -> OptimWrapper {
        let params = store
            .params
            .iter()
            .filter(|p| p.trainable())
            .map(|p| {
                let (lr, weight_decay) = cfg.group_of(&p.name);
                ParamState {
                    param: p.tensor.shallow_clone(),
                    lr,
                    weight_decay,
                    step: None,
                    exp_avg: None,
                    exp_avg_sq: None,
                    max_exp_avg_sq: None,
                    momentum_buffer: None,
                }
            })
            .collect();
        let device = store
            .params
            .first()
            .map_or(tch::Device::Cpu, |p| p.tensor.device());
        // GradScaler only works on CUDA; on CPU it disables itself (as mmengine's AmpOptimWrapper does).
        let scaler = (amp == Amp::Fp16 && device.is_cuda()).then(|| LossScaler {
            scale: Tensor::full([1], 65536.0, (Kind::Float, device)),
            growth_tracker: Tensor::zeros([1], (Kind::Int, device)),
        });
        OptimWrapper {
            cfg,
            params,
            scaler,
            calls: 0,
            zero_in_place: false,
            // torch.optim defaults to the foreach implementation for CUDA tensors.
            foreach: device.is_cuda(),
        }
    }

    /// Scales the loss and unscales gradients as fp16's GradScaler does on
    /// CUDA, on whatever device (a CPU trace standing in for a CUDA run).
    pub fn use_grad_scaler(&mut self) {
        let device = self
            .params
            .first()
            .map_or(tch::Device::Cpu, |p| p.param.device());
        self.scaler = Some(LossScaler {
            scale: Tensor::full([1], 65536.0, (Kind::Float, device)),
            growth_tracker: Tensor::zeros([1], (Kind::Int, device)),
        });
    }

    /// Runs the foreach (multi-tensor) implementation that `torch.optim`
    /// takes on CUDA, on whatever device (a CPU trace standing in for CUDA).
    pub fn use_foreach(&mut self) {
        self.foreach = true;
    }

    /// `zero_grad()` zeroes the gradients in place and keeps them (PyTorch
    /// < 2.0's `set_to_none=False`) instead of freeing them.
    pub fn zero_grad_in_place(&mut self, on: bool) {
        self.zero_in_place = on;
    }

    /// Backward of `loss`, then the optimizer step when due; returns whether
    /// the step ran (fp16 skips steps whose gradients overflowed).
    pub fn backward(&mut self, loss: &Tensor) {
        let loss = if self.cfg.accumulative_counts > 1 {
            loss / self.cfg.accumulative_counts as f64
        } else {
            loss.shallow_clone()
        };
        match &self.scaler {
            Some(s) => (&loss * &s.scale).backward(),
            None => loss.backward(),
        }
    }

    /// Whether this call is the last of an accumulation window.
    pub fn should_update(&self) -> bool {
        (self.calls + 1) % self.cfg.accumulative_counts == 0
    }

    /// After `backward`: step and zero_grad if due. Returns the steps taken.
    pub fn step_if_due(&mut self) -> Result<bool, String> {
        let due = self.should_update();
        self.calls += 1;
        if !due {
            return Ok(false);
        }
        let mut stepped = true;
        tch::no_grad(|| -> Result<(), String> {
            if let Some(mut s) = self.scaler.take() {
                let mut grads: Vec<Tensor> = self
                    .params
                    .iter()
                    .map(|p| p.param.grad())
                    .filter(Tensor::defined)
                    .collect();
                let inv_scale = s
                    .scale
                    .to_kind(Kind::Double)
                    .reciprocal()
                    .to_kind(Kind::Float);
                let mut found_inf = Tensor::zeros([1], (Kind::Float, s.scale.device()));
                memory::amp_unscale_(&mut grads, &mut found_inf, &inv_scale)?;
                if let Some((max_norm, norm_type)) = self.cfg.clip_grad {
                    memory::clip_grad_norm_(&mut grads, max_norm, norm_type)?;
                }
                stepped = found_inf.sum(Kind::Float).double_value(&[]) == 0.0;
                if stepped {
                    self.apply();
                }
                let _ = s.scale.internal_amp_update_scale_(
                    &s.growth_tracker,
                    &found_inf,
                    2.0,
                    0.5,
                    2000,
                );
                self.scaler = Some(s);
            } else {
                if let Some((max_norm, norm_type)) = self.cfg.clip_grad {
                    let mut grads: Vec<Tensor> = self
                        .params
                        .iter()
                        .map(|p| p.param.grad())
                        .filter(Tensor::defined)
                        .collect();
                    memory::clip_grad_norm_(&mut grads, max_norm, norm_type)?;
                }
                self.apply();
            }
            Ok(())
        })?;
        for p in &mut self.params {
            if self.zero_in_place {
                let mut grad = p.param.grad();
                if grad.defined() {
                    let _ = grad.zero_();
                }
            } else {
                // zero_grad(set_to_none=True)
                memory::grad_set_none(&mut p.param);
            }
        }
        Ok(stepped)
    }

    /// One optimizer step over every parameter with a gradient, the
    /// single-tensor way (`foreach=False`, PyTorch's choice for CPU tensors).
    /// `optimizer.step()`: param group by param group (mmengine's groups,
    /// see [`OptimCfg::per_param_groups`]), each as `torch.optim` steps it:
    /// lazy state for the whole group first, then the single-tensor or the
    /// foreach update.
    fn apply(&mut self) {
        let with_grad: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.params[i].param.grad().defined())
            .collect();
        let groups: Vec<Vec<usize>> = if self.cfg.per_param_groups {
            with_grad.into_iter().map(|i| vec![i]).collect()
        } else {
            vec![with_grad]
        };
        let groups = groups.iter().filter(|g| !g.is_empty());
        match self.cfg.algorithm {
            Algorithm::Adam {
                betas,
                eps,
                decoupled,
                amsgrad,
            } => {
                let adam = AdamStep {
                    betas,
                    eps,
                    decoupled,
                };
                for group in groups {
                    for &i in group {
                        let p = &mut self.params[i];
                        if p.step.is_none() {
                            p.step = Some(Tensor::from(0.0f32));
                            p.exp_avg = Some(p.param.zeros_like());
                            p.exp_avg_sq = Some(p.param.zeros_like());
                            if amsgrad {
                                p.max_exp_avg_sq = Some(p.param.zeros_like());
                            }
                        }
                    }
                    if self.foreach {
                        adam.foreach(&mut self.params, group);
                    } else {
                        for &i in group {
                            adam.single(&mut self.params[i]);
                        }
                    }
                }
            }
            Algorithm::Sgd {
                momentum,
                dampening,
                nesterov,
            } => {
                let sgd = SgdStep {
                    momentum,
                    dampening,
                    nesterov,
                };
                for group in groups {
                    if self.foreach {
                        sgd.foreach(&mut self.params, group);
                    } else {
                        for &i in group {
                            sgd.single(&mut self.params[i]);
                        }
                    }
                }
            }
        }
    }

    /// Bytes of optimizer state (AdamW: 2 x params + steps; SGD: momentum).
    pub fn state_bytes(&self) -> i64 {
        let bytes = |t: &Option<Tensor>| {
            t.as_ref().map_or(0, |t| {
                t.numel() as i64 * t.kind().elt_size_in_bytes() as i64
            })
        };
        self.params
            .iter()
            .map(|p| {
                bytes(&p.step)
                    + bytes(&p.exp_avg)
                    + bytes(&p.exp_avg_sq)
                    + bytes(&p.max_exp_avg_sq)
                    + bytes(&p.momentum_buffer)
            })
            .sum()
    }
}

/// One Adam/AdamW update with `torch.optim`'s arithmetic.
struct AdamStep {
    betas: (f64, f64),
    eps: f64,
    decoupled: bool,
}

impl AdamStep {
    /// `step += 1`; returns `(step_size, sqrt(bias_correction2))`.
    fn count_step(&self, p: &mut ParamState) -> (f64, f64) {
        let step_t = p.step.as_mut().expect("state initialised");
        let _ = step_t.g_add_scalar_(1.0);
        let step = step_t.double_value(&[]);
        let bias_correction1 = 1.0 - self.betas.0.powf(step);
        let bias_correction2 = 1.0 - self.betas.1.powf(step);
        (p.lr / bias_correction1, bias_correction2.sqrt())
    }

    /// Weight decay and the moment updates; returns the gradient used
    /// (a new tensor for coupled weight decay, as `grad.add(param, ...)`).
    fn moments(&self, p: &mut ParamState) -> Tensor {
        let mut grad = p.param.grad();
        if p.weight_decay != 0.0 {
            if self.decoupled {
                let _ = p.param.g_mul_scalar_(1.0 - p.lr * p.weight_decay);
            } else {
                grad = memory::add_alpha(&grad, &p.param, p.weight_decay);
            }
        }
        let _ = p
            .exp_avg
            .as_mut()
            .expect("state initialised")
            .lerp_(&grad, 1.0 - self.betas.0);
        let exp_avg_sq = p.exp_avg_sq.as_mut().expect("state initialised");
        let _ = exp_avg_sq.g_mul_scalar_(self.betas.1);
        memory::addcmul_(exp_avg_sq, &grad, &grad, 1.0 - self.betas.1);
        if let Some(max) = p.max_exp_avg_sq.as_mut() {
            let _ = max.maximum_out(&max.shallow_clone(), p.exp_avg_sq.as_ref().expect("set"));
        }
        grad
    }

    /// The second moment whose root divides the step.
    fn second_moment(p: &ParamState) -> &Tensor {
        p.max_exp_avg_sq
            .as_ref()
            .or(p.exp_avg_sq.as_ref())
            .expect("state initialised")
    }

    /// `_single_tensor_adam` for one parameter.
    fn single(&self, p: &mut ParamState) {
        let (step_size, bias_correction2_sqrt) = self.count_step(p);
        // Python's `grad` lives to the end of the iteration.
        let _grad = self.moments(p);
        let sqrt = Self::second_moment(p).sqrt();
        let mut denom = sqrt / bias_correction2_sqrt;
        let _ = denom.g_add_scalar_(self.eps);
        let exp_avg = p.exp_avg.as_ref().expect("state initialised");
        memory::addcdiv_(&mut p.param, exp_avg, &denom, -step_size);
    }

    /// `_multi_tensor_adam` for one group: every update of the group in
    /// turn, and the roots of the whole group's second moments held at once.
    fn foreach(&self, params: &mut [ParamState], group: &[usize]) {
        let steps: Vec<(f64, f64)> = group
            .iter()
            .map(|&i| self.count_step(&mut params[i]))
            .collect();
        let grads: Vec<Tensor> = group
            .iter()
            .map(|&i| self.moments(&mut params[i]))
            .collect();
        drop(grads);
        let mut roots: Vec<Tensor> = group
            .iter()
            .map(|&i| Self::second_moment(&params[i]).sqrt())
            .collect();
        for (root, (_, bias_correction2_sqrt)) in roots.iter_mut().zip(&steps) {
            let _ = root.g_div_scalar_(*bias_correction2_sqrt);
            let _ = root.g_add_scalar_(self.eps);
        }
        for ((&i, root), (step_size, _)) in group.iter().zip(&roots).zip(&steps) {
            let p = &mut params[i];
            let exp_avg = p
                .exp_avg
                .as_ref()
                .expect("state initialised")
                .shallow_clone();
            memory::addcdiv_(&mut p.param, &exp_avg, root, -step_size);
        }
    }
}

/// One SGD update with `torch.optim`'s arithmetic.
struct SgdStep {
    momentum: f64,
    dampening: f64,
    nesterov: bool,
}

impl SgdStep {
    /// `_single_tensor_sgd` for one parameter.
    fn single(&self, p: &mut ParamState) {
        let mut grad = p.param.grad();
        if p.weight_decay != 0.0 {
            grad = memory::add_alpha(&grad, &p.param, p.weight_decay);
        }
        if self.momentum != 0.0 {
            match &mut p.momentum_buffer {
                None => p.momentum_buffer = Some(grad.detach().copy()),
                Some(buf) => {
                    let _ = buf.g_mul_scalar_(self.momentum);
                    memory::add_alpha_(buf, &grad, 1.0 - self.dampening);
                }
            }
            let buf = p.momentum_buffer.as_ref().expect("set above");
            grad = if self.nesterov {
                memory::add_alpha(&grad, buf, self.momentum)
            } else {
                buf.shallow_clone()
            };
        }
        memory::add_alpha_(&mut p.param, &grad, -p.lr);
    }

    /// `_multi_tensor_sgd` for one group: the weight-decayed gradients of
    /// the whole group are new tensors held at once.
    fn foreach(&self, params: &mut [ParamState], group: &[usize]) {
        let mut grads: Vec<Tensor> = group
            .iter()
            .map(|&i| {
                let p = &params[i];
                let grad = p.param.grad();
                if p.weight_decay != 0.0 {
                    memory::add_alpha(&grad, &p.param, p.weight_decay)
                } else {
                    grad
                }
            })
            .collect();
        if self.momentum != 0.0 {
            let mut bufs = Vec::with_capacity(group.len());
            for (&i, grad) in group.iter().zip(&grads) {
                let p = &mut params[i];
                match &mut p.momentum_buffer {
                    None => p.momentum_buffer = Some(grad.detach().copy()),
                    Some(buf) => {
                        let _ = buf.g_mul_scalar_(self.momentum);
                        memory::add_alpha_(buf, grad, 1.0 - self.dampening);
                    }
                }
                bufs.push(p.momentum_buffer.as_ref().expect("set").shallow_clone());
            }
            if self.nesterov {
                for (grad, buf) in grads.iter_mut().zip(&bufs) {
                    memory::add_alpha_(grad, buf, self.momentum);
                }
            } else {
                grads = bufs;
            }
        }
        for (&i, grad) in group.iter().zip(&grads) {
            let p = &mut params[i];
            memory::add_alpha_(&mut p.param, grad, -p.lr);
        }
    }
}
