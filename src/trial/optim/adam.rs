//! Adam and AdamW with `torch.optim`'s arithmetic: `_single_tensor_adam`
//! and `_multi_tensor_adam` (foreach), AMSGrad included.

use super::ParamState;
use crate::shim::ffi::ShimError;
use crate::trial::memory;
use tch::Tensor;

/// One Adam/AdamW update with `torch.optim`'s arithmetic.
pub(super) struct AdamStep {
    pub(super) betas: (f64, f64),
    pub(super) eps: f64,
    pub(super) decoupled: bool,
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
    ///
    /// `previous_denom`: the group's last `denom`, which Python frees only
    /// when the loop rebinds the name, after this parameter's is computed;
    /// this one's is left there (the caller drops the last when the group's
    /// `_single_tensor_adam` returns).
    pub(super) fn single(&self, p: &mut ParamState, previous_denom: &mut Option<Tensor>) {
        let (step_size, bias_correction2_sqrt) = self.count_step(p);
        // Python's `grad` lives to the end of the iteration.
        let _grad = self.moments(p);
        let sqrt = Self::second_moment(p).sqrt();
        let mut denom = sqrt / bias_correction2_sqrt;
        let _ = denom.g_add_scalar_(self.eps);
        *previous_denom = None;
        let exp_avg = p.exp_avg.as_ref().expect("state initialised");
        memory::addcdiv_(&mut p.param, exp_avg, &denom, -step_size);
        *previous_denom = Some(denom);
    }

    /// `_multi_tensor_adam` for one group: every update of the group in
    /// turn, and the roots of the whole group's second moments held at once.
    pub(super) fn foreach(&self, params: &mut [ParamState], group: &[usize]) {
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

    /// `_fused_adam` for one group (`fused=True`): the step counts, then one
    /// in-place kernel over the group's lists, with no temporaries.
    pub(super) fn fused(
        &self,
        params: &mut [ParamState],
        group: &[usize],
    ) -> Result<(), ShimError> {
        let Some(&first) = group.first() else {
            return Ok(());
        };
        let (lr, weight_decay) = (params[first].lr, params[first].weight_decay);
        let take = |f: &dyn Fn(&ParamState) -> Tensor| -> Vec<Tensor> {
            group.iter().map(|&i| f(&params[i])).collect()
        };
        let state = |t: &Option<Tensor>| t.as_ref().expect("state initialised").shallow_clone();
        let mut p = take(&|s| s.param.shallow_clone());
        let mut g = take(&|s| s.param.grad());
        let mut m = take(&|s| state(&s.exp_avg));
        let mut v = take(&|s| state(&s.exp_avg_sq));
        let mut steps = take(&|s| state(&s.step));
        memory::fused_adam_(
            memory::FusedAdamLists {
                params: &mut p,
                grads: &mut g,
                exp_avgs: &mut m,
                exp_avg_sqs: &mut v,
                steps: &mut steps,
            },
            (lr, self.betas.0, self.betas.1, weight_decay, self.eps),
            self.decoupled,
        )
    }
}
