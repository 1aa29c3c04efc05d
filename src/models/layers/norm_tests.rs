//! Unit tests of `norm.rs`: LayerNorm, BatchNorm2d and GroupNorm's
//! parameters and buffers as PyTorch registers them, their outputs, the LN
//! `norm_cfg` reader, `normalize`.
use super::*;
use crate::config::Dict;
use crate::models::component_config::test_support::dict;
use crate::models::params::ParamStore;
use serde_json::json;
use tch::{Device, Kind, Tensor};

#[test]
fn layer_norm_normalises_the_last_dimension() {
    // nn.LayerNorm(96): weight and bias, 2 * 96 = 192.
    let mut store = ParamStore::new(Device::Cpu);
    let norm = LayerNorm::new(&mut store.scope("norm"), 96, 1e-6);
    assert_eq!(store.total(), 192);
    let x = Tensor::randn([2, 10, 96], (Kind::Float, Device::Cpu)) * 3.0 + 1.0;
    let y = norm.forward(&x);
    assert_eq!(y.size(), [2, 10, 96]);
    let mean = y.mean_dim(-1, false, Kind::Float).abs().max();
    assert!(mean.double_value(&[]) < 1e-4);
}

#[test]
fn batch_norm_has_two_parameters_and_three_buffers_per_layer() {
    // nn.BatchNorm2d(64): weight, bias (2 * 64 = 128); running_mean,
    // running_var, num_batches_tracked.
    let mut store = ParamStore::new(Device::Cpu);
    let bn = BatchNorm2d::new(&mut store.scope("bn"), 64, 1e-5, 0.1, true);
    assert_eq!(store.total(), 128);
    let buffers: Vec<&str> = store.buffers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        buffers,
        [
            "bn.running_mean",
            "bn.running_var",
            "bn.num_batches_tracked"
        ]
    );
    let x = Tensor::randn([2, 64, 4, 4], (Kind::Float, Device::Cpu));
    assert_eq!(bn.forward(&x, true).size(), [2, 64, 4, 4]);
}

#[test]
#[should_panic(expected = "Expected more than 1 value per channel when training")]
fn batch_norm_in_training_refuses_one_value_per_channel() {
    let mut store = ParamStore::new(Device::Cpu);
    let bn = BatchNorm2d::new(&mut store.scope("bn"), 8, 1e-5, 0.1, true);
    let _ = bn.forward(
        &Tensor::randn([1, 8, 1, 1], (Kind::Float, Device::Cpu)),
        true,
    );
}

#[test]
fn group_norm_has_a_weight_and_a_bias_per_channel() {
    // nn.GroupNorm(32, 64): 2 * 64 = 128.
    let gn = NormCfg {
        num_groups: Some(32),
        ..NormCfg::BN_DEFAULT
    };
    let mut store = ParamStore::new(Device::Cpu);
    let norm = ConvNorm::new(&mut store.scope("gn"), 64, &gn);
    assert_eq!(store.total(), 128);
    assert!(store.buffers.is_empty());
    let x = Tensor::randn([1, 64, 4, 4], (Kind::Float, Device::Cpu));
    assert_eq!(norm.forward(&x, true).size(), [1, 64, 4, 4]);
}

fn layer_norm_cfg(d: &Dict) -> Result<LayerNormCfg, ModelError> {
    let mut r = ComponentConfig::new(d, "Thing", "x.py");
    LayerNormCfg::from_cfg(&mut r, "norm_cfg", LayerNormCfg::DEFAULT)
}

#[test]
fn an_ln_norm_cfg_is_read_and_other_norms_are_refused_by_key() {
    let d = dict(json!({"norm_cfg": {"type": "LN", "eps": 1e-6, "requires_grad": false}}));
    let ln = layer_norm_cfg(&d).unwrap();
    assert_eq!((ln.eps, ln.requires_grad), (1e-6, false));
    assert_eq!(
        layer_norm_cfg(&dict(json!({}))).unwrap(),
        LayerNormCfg::DEFAULT
    );
    let err = layer_norm_cfg(&dict(json!({"norm_cfg": {"type": "BN"}})))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`norm_cfg`"), "{err}");
    let err = layer_norm_cfg(&dict(
        json!({"norm_cfg": {"type": "LN", "elementwise_affine": false}}),
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("`elementwise_affine`"), "{err}");
}

#[test]
fn normalize_gives_unit_vectors() {
    let x = Tensor::from_slice(&[3.0f32, 4.0, 0.0, 0.0]).view([2, 2]);
    let y = normalize(&x, 2.0, 1);
    // (3, 4) / 5; the zero row stays zero (the norm is clamped to 1e-12).
    let values: Vec<f32> = Vec::try_from(y.flatten(0, -1)).unwrap();
    assert_eq!(values, [0.6, 0.8, 0.0, 0.0]);
}
