//! SGD with momentum, dampening and Nesterov, with `torch.optim`'s
//! arithmetic: `_single_tensor_sgd` and `_multi_tensor_sgd` (foreach).

use super::ParamState;
use crate::trial::memory;
use tch::Tensor;

/// One SGD update with `torch.optim`'s arithmetic.
pub(super) struct SgdStep {
    pub(super) momentum: f64,
    pub(super) dampening: f64,
    pub(super) nesterov: bool,
}

impl SgdStep {
    /// `_single_tensor_sgd` for one parameter.
    pub(super) fn single(&self, p: &mut ParamState) {
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
    pub(super) fn foreach(&self, params: &mut [ParamState], group: &[usize]) {
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
