//! Unit tests of `activation.rs`: each activation's values against its formula.
use super::*;
use tch::{Device, Kind};

fn ramp() -> Tensor {
    Tensor::from_slice(&[-5.0f32, -3.0, -1.0, 0.0, 1.0, 3.0, 5.0])
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.to_kind(Kind::Float).to_device(Device::Cpu)).unwrap()
}

#[test]
fn hswish_is_x_relu6_x_plus_3_over_6() {
    let y = Activation::HSwish.apply(ramp());
    let expect = [0.0, 0.0, -1.0 / 3.0, 0.0, 2.0 / 3.0, 3.0, 5.0];
    for (a, b) in values(&y).iter().zip(expect) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
}

#[test]
fn hsigmoid_clamps_x_plus_bias_over_divisor() {
    let act = Activation::HSigmoid {
        bias: 3.0,
        divisor: 6.0,
    };
    let y = act.apply(ramp());
    let expect = [0.0, 0.0, 1.0 / 3.0, 0.5, 2.0 / 3.0, 1.0, 1.0];
    for (a, b) in values(&y).iter().zip(expect) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
}

#[test]
fn relu_and_sigmoid() {
    assert_eq!(
        values(&Activation::Relu.apply(ramp())),
        [0.0, 0.0, 0.0, 0.0, 1.0, 3.0, 5.0]
    );
    let s = values(&Activation::Sigmoid.apply(ramp()));
    assert!((s[3] - 0.5).abs() < 1e-6);
    assert_eq!(Activation::from_name("HSwish"), Some(Activation::HSwish));
    assert_eq!(Activation::from_name("GELU"), None);
}
