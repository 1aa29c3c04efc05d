//! `OptimWrapper.update_params`: loss scaling for fp16, backward, and every
//! `accumulative_counts` calls gradient unscaling and clipping, the
//! optimizer step param group by param group, and `zero_grad`.

use super::adam::AdamStep;
use super::sgd::SgdStep;
use super::{Algorithm, Amp, Grouping, OptimCfg, ParamState};
use crate::models::params::ParamStore;
use crate::shim::ffi::ShimError;
use crate::trial::memory;
use tch::{Kind, Tensor};

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
                let (group, lr, weight_decay) = cfg.group_of(&p.name, p.tensor.dim());
                ParamState {
                    group,
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

    /// The gradients that exist, parameter by parameter.
    fn grads(&self) -> Vec<Tensor> {
        self.params
            .iter()
            .map(|p| p.param.grad())
            .filter(Tensor::defined)
            .collect()
    }

    /// Whether this call is the last of an accumulation window.
    pub fn should_update(&self) -> bool {
        (self.calls + 1) % self.cfg.accumulative_counts == 0
    }

    /// After `backward`: step and zero_grad if due. Returns the steps taken.
    pub fn step_if_due(&mut self) -> Result<bool, ShimError> {
        let due = self.should_update();
        self.calls += 1;
        if !due {
            return Ok(false);
        }
        let mut stepped = true;
        tch::no_grad(|| -> Result<(), ShimError> {
            if let Some(mut s) = self.scaler.take() {
                let mut grads = self.grads();
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
                    self.apply()?;
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
                    let mut grads = self.grads();
                    memory::clip_grad_norm_(&mut grads, max_norm, norm_type)?;
                }
                self.apply()?;
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
    /// see [`OptimCfg::grouping`]), each as `torch.optim` steps it:
    /// lazy state for the whole group first, then the single-tensor or the
    /// foreach update.
    fn apply(&mut self) -> Result<(), ShimError> {
        let with_grad: Vec<usize> = (0..self.params.len())
            .filter(|&i| self.params[i].param.grad().defined())
            .collect();
        let groups: Vec<Vec<usize>> = match self.cfg.grouping {
            Grouping::PerParameter => with_grad.into_iter().map(|i| vec![i]).collect(),
            Grouping::One => vec![with_grad],
            // Groups in order of their first parameter, as MMSeg's dict of groups.
            Grouping::LayerDecay(_) => {
                let mut keyed: Vec<(&str, Vec<usize>)> = Vec::new();
                for i in with_grad {
                    let key = self.params[i].group.as_str();
                    match keyed.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, members)) => members.push(i),
                        None => keyed.push((key, vec![i])),
                    }
                }
                keyed.into_iter().map(|(_, members)| members).collect()
            }
        };
        let groups = groups.iter().filter(|g| !g.is_empty());
        match self.cfg.algorithm {
            Algorithm::Adam {
                betas,
                eps,
                decoupled,
                amsgrad,
                fused,
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
                            // A fused optimizer keeps `step` on the parameter's device.
                            p.step = Some(if fused {
                                Tensor::zeros([], (Kind::Float, p.param.device()))
                            } else {
                                crate::models::layers::host::scalar_from_host(0.0f32)
                            });
                            p.exp_avg = Some(p.param.zeros_like());
                            p.exp_avg_sq = Some(p.param.zeros_like());
                            if amsgrad {
                                p.max_exp_avg_sq = Some(p.param.zeros_like());
                            }
                        }
                    }
                    if fused {
                        adam.fused(&mut self.params, group)?;
                    } else if self.foreach {
                        adam.foreach(&mut self.params, group);
                    } else {
                        let mut denom = None;
                        for &i in group {
                            adam.single(&mut self.params[i], &mut denom);
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
        Ok(())
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
