//! `nn.Linear`.

use super::count_flops;
use crate::models::params::ParamScope;
use tch::Tensor;

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

#[cfg(test)]
#[path = "linear_tests.rs"]
mod tests;
