//! The activation layers mmcv's `ConvModule` builds beyond its ReLU
//! (`mmcv/cnn/bricks/activation.py`, `hswish.py`, `hsigmoid.py`), with the
//! `inplace` flag ConvModule gives them (`True`, except for the types it
//! passes none: `Sigmoid`, `HSigmoid`, ...).

use tch::Tensor;

/// An activation as a ConvModule applies it after its norm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `nn.ReLU(inplace=True)`: `relu_`.
    Relu,
    /// `HSwish`, which mmcv registers as `nn.Hardswish` (torch >= 1.7),
    /// `inplace=True`: `hardswish_`; before mmcv 1.4.5 its own
    /// `x * ReLU6(x + 3) / 6` (see [`super::emulate_mmcv_hswish_composite`]).
    HSwish,
    /// mmcv's `HSigmoid(bias, divisor)` (`min_value=0`, `max_value=1`):
    /// `((x + bias) / divisor).clamp_(0, 1)`, two new tensors, the second
    /// clamped in place.
    HSigmoid { bias: f64, divisor: f64 },
    /// `nn.Sigmoid()`: `sigmoid`, out of place.
    Sigmoid,
}

impl Activation {
    /// The activation of `x` (which it may overwrite, as the in-place
    /// PyTorch module does).
    pub fn apply(self, mut x: Tensor) -> Tensor {
        match self {
            Activation::Relu => {
                let _ = x.relu_();
                x
            }
            Activation::HSwish if super::mmcv_hswish_composite() => {
                let mut t = x.g_add_scalar(3.0);
                super::relu6_(&mut t);
                (&x * &t).g_div_scalar(6.0)
            }
            Activation::HSwish => {
                let _ = x.hardswish_();
                x
            }
            Activation::HSigmoid { bias, divisor } => {
                let mut y = x.g_add_scalar(bias).g_div_scalar(divisor);
                let _ = y.clamp_(0.0, 1.0);
                y
            }
            Activation::Sigmoid => x.sigmoid(),
        }
    }

    /// An `act` name of MobileNetV3's `arch_settings` (`'ReLU'`,
    /// `'HSwish'`).
    pub fn from_name(name: &str) -> Option<Activation> {
        match name {
            "ReLU" => Some(Activation::Relu),
            "HSwish" => Some(Activation::HSwish),
            "Sigmoid" => Some(Activation::Sigmoid),
            _ => None,
        }
    }
}

#[cfg(test)]
#[path = "activation_tests.rs"]
mod tests;
