//! Unit tests of `resnet.rs`.

use super::*;
use crate::models::component_config::test_support::dict;
use crate::models::params::ParamStore;
use serde_json::json;
use tch::{Device, Kind};

fn backbone(extra: serde_json::Value) -> Dict {
    let mut d = json!({
        "type": "ResNetV1c", "depth": 50, "num_stages": 4, "out_indices": [0, 1, 2, 3],
        "dilations": [1, 1, 2, 4], "strides": [1, 2, 1, 1],
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "norm_eval": false, "style": "pytorch", "contract_dilation": true,
    });
    d.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    dict(d)
}

fn count(variant: Variant, d: &Dict) -> (ParamStore, ResNet) {
    let mut store = ParamStore::new(Device::Cpu);
    let cfg = ResNetCfg::from_cfg(d, variant).unwrap();
    let net = ResNet::new(&mut store.scope("backbone"), &cfg);
    (store, net)
}

#[test]
fn the_backbones_have_mmsegs_parameter_counts() {
    // params_all.json, by_prefix.backbone.total of
    // fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024.py (ResNetV1c-50),
    // deeplabv3plus/deeplabv3plus_r101-d8_4xb2-40k_cityscapes-512x1024.py
    // (ResNetV1c-101) and deeplabv3plus_r18-d8_4xb2-80k_cityscapes-512x1024.py
    // (ResNetV1c-18).
    for (depth, want) in [(50, 23_527_264), (101, 42_519_392), (18, 11_195_744)] {
        let (store, _) = count(Variant::V1c, &backbone(json!({"depth": depth})));
        assert_eq!(store.total(), want, "ResNetV1c-{depth}");
    }
}

#[test]
fn a_d8_resnet50_keeps_an_eighth_of_the_resolution() {
    let (_, net) = count(Variant::V1c, &backbone(json!({})));
    let x = Tensor::zeros([2, 3, 64, 64], (Kind::Float, Device::Cpu));
    let shapes: Vec<Vec<i64>> = net.forward(&x, true).iter().map(|t| t.size()).collect();
    assert_eq!(
        shapes,
        [
            vec![2, 256, 16, 16],
            vec![2, 512, 8, 8],
            vec![2, 1024, 8, 8],
            vec![2, 2048, 8, 8]
        ]
    );
}

#[test]
fn frozen_stages_freeze_the_stem_and_the_first_stages() {
    let (store, _) = count(
        Variant::ResNet,
        &backbone(json!({"type": "ResNet", "frozen_stages": 1})),
    );
    let frozen: Vec<&str> = store
        .params
        .iter()
        .filter(|p| !p.trainable())
        .map(|p| p.name.as_str())
        .collect();
    assert!(frozen.contains(&"backbone.conv1.weight"));
    assert!(frozen.contains(&"backbone.layer1.2.bn3.bias"));
    assert!(!frozen.iter().any(|n| n.starts_with("backbone.layer2")));
}

#[test]
fn v1c_refuses_a_deep_stem_setting_and_unknown_keys() {
    let err = ResNetCfg::from_cfg(&backbone(json!({"deep_stem": false})), Variant::V1c)
        .unwrap_err()
        .to_string();
    assert!(err.contains("ResNetV1c: sets `deep_stem` itself"), "{err}");
    let err = ResNetCfg::from_cfg(&backbone(json!({"dcn": {"type": "DCN"}})), Variant::V1c)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`dcn`"), "{err}");
    let err = ResNetCfg::from_cfg(&backbone(json!({"depth": 42})), Variant::V1c)
        .unwrap_err()
        .to_string();
    assert!(err.contains("invalid depth 42"), "{err}");
}
