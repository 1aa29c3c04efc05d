//! Unit tests of `hrnet.rs` (parameter counts of real configs, shapes, refused settings).
use super::*;
use crate::models::component_config::test_support::dict;
use crate::models::params::ParamStore;
use serde_json::json;
use tch::{Device, Kind};

/// `model.backbone` of the resolved `hrnet/fcn_hr<width>*` configs:
/// W18-small (`small`), W18 or W48.
fn backbone(width: i64, small: bool, extra: serde_json::Value) -> Dict {
    let (m3, m4, nb) = if small { (3, 2, 2) } else { (4, 3, 4) };
    let c = |k: i64| width * k;
    let mut d = json!({
        "type": "HRNet",
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "norm_eval": false,
        "extra": {
            "stage1": {"num_modules": 1, "num_branches": 1, "block": "BOTTLENECK",
                       "num_blocks": [if small { 2 } else { 4 }], "num_channels": [64]},
            "stage2": {"num_modules": 1, "num_branches": 2, "block": "BASIC",
                       "num_blocks": [nb, nb], "num_channels": [c(1), c(2)]},
            "stage3": {"num_modules": m3, "num_branches": 3, "block": "BASIC",
                       "num_blocks": [nb, nb, nb], "num_channels": [c(1), c(2), c(4)]},
            "stage4": {"num_modules": m4, "num_branches": 4, "block": "BASIC",
                       "num_blocks": [nb, nb, nb, nb],
                       "num_channels": [c(1), c(2), c(4), c(8)]},
        },
    });
    d.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    dict(d)
}

fn build_net(d: &Dict) -> (ParamStore, HRNet) {
    let mut store = ParamStore::new(Device::Cpu);
    let cfg = HRNetCfg::from_cfg(d).unwrap();
    let net = HRNet::new(&mut store.scope("backbone"), &cfg);
    (store, net)
}

fn error(d: &Dict) -> String {
    HRNetCfg::from_cfg(d).unwrap_err().to_string()
}

#[test]
fn the_backbones_have_mmsegs_parameter_counts() {
    // /work/shared/oracle/params_all.json, params.by_prefix.backbone.total
    // of hrnet/fcn_hr18s_4xb2-40k_cityscapes-512x1024.py (W18-small),
    // hrnet/fcn_hr18_4xb2-40k_cityscapes-512x1024.py (W18) and
    // hrnet/fcn_hr48_4xb2-40k_cityscapes-512x1024.py (W48).
    for (width, small, want) in [
        (18, true, 3_860_720),
        (18, false, 9_562_260),
        (48, false, 65_325_120),
    ] {
        let (store, _) = build_net(&backbone(width, small, json!({})));
        assert_eq!(store.total(), want, "W{width} small={small}");
        assert_eq!(store.trainable(), want, "W{width} small={small}");
    }
}

#[test]
fn parameters_have_mmsegs_names() {
    let (store, _) = build_net(&backbone(18, true, json!({})));
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    for name in [
        "backbone.conv1.weight",
        "backbone.bn2.bias",
        "backbone.layer1.0.downsample.0.weight",
        "backbone.layer1.1.bn3.weight",
        "backbone.transition1.0.0.weight",
        "backbone.transition1.1.0.0.weight",
        "backbone.transition2.2.0.1.bias",
        "backbone.stage2.0.branches.1.1.conv2.weight",
        "backbone.stage2.0.fuse_layers.0.1.0.weight",
        "backbone.stage2.0.fuse_layers.1.0.0.0.weight",
        "backbone.stage4.1.fuse_layers.3.0.2.1.weight",
        "backbone.stage4.1.fuse_layers.3.0.0.0.weight",
    ] {
        assert!(names.contains(&name), "{name} missing");
    }
    let first: Vec<&str> = names[..4].to_vec();
    assert_eq!(
        first,
        [
            "backbone.conv1.weight",
            "backbone.bn1.weight",
            "backbone.bn1.bias",
            "backbone.conv2.weight"
        ]
    );
}

#[test]
fn a_64x64_input_gives_four_maps_at_a_quarter_to_a_32nd() {
    let (_, net) = build_net(&backbone(18, true, json!({})));
    let x = Tensor::zeros([2, 3, 64, 64], (Kind::Float, Device::Cpu));
    let shapes: Vec<Vec<i64>> = net.forward(&x, true).iter().map(|t| t.size()).collect();
    assert_eq!(
        shapes,
        [
            vec![2, 18, 16, 16],
            vec![2, 36, 8, 8],
            vec![2, 72, 4, 4],
            vec![2, 144, 2, 2]
        ]
    );
}

#[test]
fn without_multiscale_output_only_the_first_branch_comes_out() {
    let d = backbone(18, true, json!({"multiscale_output": false}));
    let (store, net) = build_net(&d);
    let (full, _) = build_net(&backbone(18, true, json!({})));
    // stage4's last module fuses into branch 0 only.
    assert!(store.total() < full.total());
    let x = Tensor::zeros([2, 3, 64, 64], (Kind::Float, Device::Cpu));
    let shapes: Vec<Vec<i64>> = net.forward(&x, true).iter().map(|t| t.size()).collect();
    assert_eq!(shapes, [vec![2, 18, 16, 16]]);
}

#[test]
fn an_odd_input_size_is_resized_to_each_branch() {
    let (_, net) = build_net(&backbone(18, true, json!({})));
    let x = Tensor::zeros([2, 3, 72, 40], (Kind::Float, Device::Cpu));
    let shapes: Vec<Vec<i64>> = net.forward(&x, true).iter().map(|t| t.size()).collect();
    assert_eq!(
        shapes,
        [
            vec![2, 18, 18, 10],
            vec![2, 36, 9, 5],
            vec![2, 72, 5, 3],
            vec![2, 144, 3, 2]
        ]
    );
}

#[test]
fn frozen_stages_freeze_the_stem_layer1_and_transition1() {
    let (store, _) = build_net(&backbone(18, true, json!({"frozen_stages": 1})));
    let frozen: Vec<&str> = store
        .params
        .iter()
        .filter(|p| !p.trainable())
        .map(|p| p.name.as_str())
        .collect();
    assert!(frozen.contains(&"backbone.conv1.weight"));
    assert!(frozen.contains(&"backbone.bn2.bias"));
    assert!(frozen.contains(&"backbone.layer1.1.bn3.bias"));
    assert!(frozen.contains(&"backbone.transition1.1.0.1.weight"));
    assert!(!frozen.iter().any(|n| n.starts_with("backbone.stage2")));
    let (store, _) = build_net(&backbone(18, true, json!({"frozen_stages": 4})));
    assert_eq!(store.trainable(), 0);
}

#[test]
fn malformed_or_unimplemented_settings_are_refused() {
    let err = error(&backbone(18, true, json!({"with_cp": true})));
    assert!(err.contains("HRNet `with_cp`"), "{err}");
    let err = error(&backbone(18, true, json!({"conv_cfg": {"type": "Conv"}})));
    assert!(err.contains("HRNet `conv_cfg`"), "{err}");
    let err = error(&backbone(18, true, json!({"frozen_stages": 5})));
    assert!(err.contains("frozen_stages must be at most 4"), "{err}");

    let mut d = backbone(18, true, json!({}));
    fn stage<'a>(d: &'a mut Dict, n: &str) -> &'a mut Dict {
        d.get_mut("extra")
            .and_then(Value::as_dict_mut)
            .and_then(|e| e.get_mut(n))
            .and_then(Value::as_dict_mut)
            .unwrap()
    }
    stage(&mut d, "stage3").insert("block".into(), Value::Str("BASIC2".into()));
    let err = error(&d);
    assert!(
        err.contains("extra.stage3.block 'BASIC2' is not a block type"),
        "{err}"
    );

    let mut d = backbone(18, true, json!({}));
    stage(&mut d, "stage2").shift_remove("num_blocks");
    let err = error(&d);
    assert!(
        err.contains("HRNet: extra.stage2 lacks `num_blocks`"),
        "{err}"
    );

    let mut d = backbone(18, true, json!({}));
    d.get_mut("extra")
        .and_then(Value::as_dict_mut)
        .unwrap()
        .shift_remove("stage4");
    let err = error(&d);
    assert!(err.contains("`extra` lacks `stage4`"), "{err}");

    let mut d = backbone(18, true, json!({}));
    d.shift_remove("extra");
    assert!(error(&d).contains("HRNet: lacks `extra`"));

    let mut d = backbone(18, true, json!({}));
    stage(&mut d, "stage3").insert("num_branches".into(), Value::Int(2));
    let err = error(&d);
    assert!(
        err.contains("extra.stage3: NUM_BRANCHES(2) <> NUM_BLOCKS(3)"),
        "{err}"
    );

    let mut d = backbone(18, true, json!({}));
    stage(&mut d, "stage4").insert("multiscale_output".into(), Value::Bool(false));
    let err = error(&d);
    assert!(
        err.contains("HRNet `extra.stage4.multiscale_output`"),
        "{err}"
    );
}
