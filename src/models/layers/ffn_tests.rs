//! Unit tests of `ffn.rs`: mmcv's `FFN` parameters by name and its output.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind, Tensor};

#[test]
fn two_linears_with_biases_under_mmcvs_names() {
    // FFN(256, 1024): Linear(256, 1024) + Linear(1024, 256), with biases:
    // 256 * 1024 + 1024 + 1024 * 256 + 256 = 525_568.
    let mut store = ParamStore::new(Device::Cpu);
    let ffn = Ffn::new(
        &mut store.scope("ffn"),
        256,
        1024,
        FfnActivation::Gelu,
        0.0,
        0.0,
    );
    assert_eq!(store.total(), 525_568);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "ffn.layers.0.0.weight",
            "ffn.layers.0.0.bias",
            "ffn.layers.1.weight",
            "ffn.layers.1.bias"
        ]
    );
    let x = Tensor::randn([2, 10, 256], (Kind::Float, Device::Cpu));
    let with_identity = ffn.forward(&x, &x, true);
    let without = ffn.forward_no_identity(&x, true);
    assert_eq!(with_identity.size(), [2, 10, 256]);
    // No dropout: the identity is added to the same layers' output.
    let diff = (with_identity - without - &x).abs().max();
    assert!(diff.double_value(&[]) < 1e-5);
}
