//! Unit tests of `unet.rs` (parameter counts of real configs, shapes, refused settings).
use super::*;
use crate::models::component_config::test_support::{dict, to_value};
use crate::models::params::ParamStore;
use serde_json::json;
use tch::{Device, Kind};

/// `model.backbone` of unet/unet-s5-d16_fcn_4xb4-40k_drive-64x64.py
/// (resolved; tuples as lists).
fn s5_d16() -> Dict {
    dict(json!({
        "type": "UNet",
        "in_channels": 3,
        "base_channels": 64,
        "num_stages": 5,
        "strides": [1, 1, 1, 1, 1],
        "enc_num_convs": [2, 2, 2, 2, 2],
        "dec_num_convs": [2, 2, 2, 2],
        "downsamples": [true, true, true, true],
        "enc_dilations": [1, 1, 1, 1, 1],
        "dec_dilations": [1, 1, 1, 1],
        "with_cp": false,
        "conv_cfg": null,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "act_cfg": {"type": "ReLU"},
        "upsample_cfg": {"type": "InterpConv"},
        "norm_eval": false,
    }))
}

fn built(cfg: &Dict) -> (ParamStore, Box<dyn Backbone>) {
    let mut store = ParamStore::new(Device::Cpu);
    let backbone = build(&mut store.scope("backbone"), cfg).unwrap();
    (store, backbone)
}

#[test]
fn unet_s5_d16_has_mmsegs_parameter_count_and_names() {
    let (store, _) = built(&s5_d16());
    // params_all.json, unet/unet-s5-d16_fcn_4xb4-40k_drive-64x64.py:
    // params.by_prefix.backbone.total
    assert_eq!(store.total(), 28_949_568);
    assert_eq!(store.trainable(), 28_949_568);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[0], "backbone.encoder.0.0.convs.0.conv.weight");
    assert_eq!(names[1], "backbone.encoder.0.0.convs.0.bn.weight");
    assert!(names.contains(&"backbone.encoder.1.1.convs.1.conv.weight"));
    assert!(names.contains(&"backbone.encoder.4.1.convs.1.bn.bias"));
    assert!(names.contains(&"backbone.decoder.0.conv_block.convs.0.conv.weight"));
    assert!(names.contains(&"backbone.decoder.3.upsample.interp_upsample.1.conv.weight"));
    assert_eq!(
        *names.last().unwrap(),
        "backbone.decoder.3.upsample.interp_upsample.1.bn.bias"
    );
    // The encoder is registered before the decoder.
    let first_decoder = names.iter().position(|n| n.contains(".decoder.")).unwrap();
    assert!(names[first_decoder..]
        .iter()
        .all(|n| n.contains(".decoder.")));
    assert!(store
        .buffers
        .iter()
        .any(|(n, _)| n == "backbone.decoder.0.upsample.interp_upsample.1.bn.running_mean"));
}

#[test]
fn the_outputs_are_the_decoder_maps_from_the_deepest() {
    let (_, backbone) = built(&s5_d16());
    let x = Tensor::zeros([2, 3, 64, 64], (Kind::Float, Device::Cpu));
    let shapes: Vec<Vec<i64>> = backbone
        .forward(&x, true)
        .iter()
        .map(Tensor::size)
        .collect();
    assert_eq!(
        shapes,
        [
            vec![2, 1024, 4, 4],
            vec![2, 512, 8, 8],
            vec![2, 256, 16, 16],
            vec![2, 128, 32, 32],
            vec![2, 64, 64, 64],
        ]
    );
}

#[test]
fn deconv_module_is_named_and_shaped_as_mmsegs() {
    let mut cfg = s5_d16();
    cfg.insert(
        "upsample_cfg".into(),
        to_value(&json!({"type": "DeconvModule", "kernel_size": 4})),
    );
    let (store, backbone) = built(&cfg);
    // Each decoder's 1x1 InterpConv (in*out weights) becomes a 4x4
    // ConvTranspose2d with a bias (16*in*out + out): 15*in*out + out
    // more, over (in, out) = (128, 64), (256, 128), (512, 256), (1024, 512).
    let extra: i64 = [(128, 64), (256, 128), (512, 256), (1024, 512)]
        .iter()
        .map(|(i, o)| 15 * i * o + o)
        .sum();
    assert_eq!(store.total(), 28_949_568 + extra);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert!(names.contains(&"backbone.decoder.0.upsample.deconv_upsamping.0.weight"));
    assert!(names.contains(&"backbone.decoder.0.upsample.deconv_upsamping.0.bias"));
    assert!(names.contains(&"backbone.decoder.0.upsample.deconv_upsamping.1.weight"));
    let x = Tensor::zeros([1, 3, 32, 32], (Kind::Float, Device::Cpu));
    let outs = backbone.forward(&x, true);
    assert_eq!(outs.last().unwrap().size(), [1, 64, 32, 32]);
}

#[test]
fn a_stage_without_downsampling_has_no_pool_and_a_1x1_upsample() {
    let mut cfg = s5_d16();
    cfg.insert(
        "downsamples".into(),
        to_value(&json!([true, true, true, false])),
    );
    let (store, backbone) = built(&cfg);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert!(names.contains(&"backbone.encoder.4.0.convs.0.conv.weight"));
    assert!(names.contains(&"backbone.decoder.3.upsample.conv.weight"));
    let x = Tensor::zeros([1, 3, 16, 16], (Kind::Float, Device::Cpu));
    let shapes: Vec<Vec<i64>> = backbone
        .forward(&x, true)
        .iter()
        .map(Tensor::size)
        .collect();
    assert_eq!(shapes[0], [1, 1024, 2, 2]);
    assert_eq!(shapes[1], [1, 512, 2, 2]);
    assert_eq!(shapes[4], [1, 64, 16, 16]);
}

#[test]
fn norm_eval_keeps_the_running_statistics() {
    let mut cfg = s5_d16();
    cfg.insert("norm_eval".into(), Value::Bool(true));
    cfg.insert("base_channels".into(), Value::Int(4));
    let (store, backbone) = built(&cfg);
    let x = Tensor::ones([1, 3, 16, 16], (Kind::Float, Device::Cpu));
    let _ = backbone.forward(&x, true);
    for (name, buffer) in &store.buffers {
        if name.ends_with("num_batches_tracked") {
            assert_eq!(buffer.int64_value(&[]), 0, "{name}");
        }
    }
}

#[test]
#[should_panic(expected = "should be divisible by the whole downsample rate 16")]
fn an_input_not_divisible_by_the_downsample_rate_fails_with_mmsegs_message() {
    let mut cfg = s5_d16();
    cfg.insert("base_channels".into(), Value::Int(4));
    let (_, backbone) = built(&cfg);
    let x = Tensor::zeros([1, 3, 24, 32], (Kind::Float, Device::Cpu));
    let _ = backbone.forward(&x, true);
}

#[test]
fn settings_segtune_does_not_implement_are_refused_by_name() {
    for (key, value) in [
        ("with_cp", json!(true)),
        ("conv_cfg", json!({"type": "DCNv2"})),
        ("dcn", json!({"type": "DCN"})),
        ("plugins", json!([{"cfg": {"type": "ContextBlock"}}])),
        ("act_cfg", json!({"type": "GELU"})),
        ("act_cfg", json!({"type": "ReLU", "inplace": false})),
        ("upsample_cfg", json!({"type": "pixel_shuffle"})),
        ("frozen_stages", json!(1)),
    ] {
        let mut cfg = s5_d16();
        cfg.insert(key.into(), to_value(&value));
        let err = UNetCfg::from_cfg(&cfg).unwrap_err();
        assert!(
            matches!(&err, ModelError::Unsupported { setting, source, .. } if setting == key && source.as_deref() == Some(SOURCE)),
            "{key}: {err}"
        );
    }
    // Keys of the upsample module are checked by its own name.
    let mut cfg = s5_d16();
    cfg.insert(
        "upsample_cfg".into(),
        to_value(
            &json!({"type": "InterpConv", "upsample_cfg": {"scale_factor": 2, "mode": "nearest"}}),
        ),
    );
    let err = UNetCfg::from_cfg(&cfg).unwrap_err().to_string();
    assert!(err.contains("`mode`"), "{err}");
}

#[test]
fn mismatched_stage_lists_are_config_errors() {
    let mut cfg = s5_d16();
    cfg.insert("strides".into(), to_value(&json!([1, 1, 1, 1])));
    let err = UNetCfg::from_cfg(&cfg).unwrap_err();
    assert!(
        matches!(&err, ModelError::Config { what, .. } if what.contains("strides")),
        "{err}"
    );
}
