//! Unit tests of `erfnet.rs`: the parameter count of a real config's backbone, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of erfnet/erfnet_fcn_4xb4-160k_cityscapes-512x1024.py
/// (resolved; tuples as lists).
fn cityscapes() -> serde_json::Value {
    json!({
        "type": "ERFNet",
        "in_channels": 3,
        "enc_downsample_channels": [16, 64, 128],
        "enc_stage_non_bottlenecks": [5, 8],
        "enc_non_bottleneck_dilations": [2, 4, 8, 16],
        "enc_non_bottleneck_channels": [64, 128],
        "dec_upsample_channels": [64, 16],
        "dec_stages_non_bottleneck": [2, 2],
        "dec_non_bottleneck_channels": [64, 16],
        "dropout_ratio": 0.1,
        "init_cfg": null
    })
}

#[test]
fn erfnet_cityscapes_has_mmsegs_parameter_count() {
    // params_all.json, erfnet/erfnet_fcn_4xb4-160k_cityscapes-512x1024.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(cityscapes()).0.total(), 2_062_956);
}

#[test]
fn the_one_output_is_the_decoders_half_resolution_map() {
    let (_, net) = backbone(cityscapes());
    let outs = net.forward(&image(1, 64, 96), true);
    // Three downsamplers (1/8), two upsamplers: 1/2, dec_non_bottleneck_channels[-1].
    assert_eq!(shapes(&outs), [vec![1, 16, 32, 48]]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(cityscapes(), "with_cp", json!(true)));
    assert!(err.contains("`with_cp`"), "{err}");
}

#[test]
fn mismatched_stage_lists_are_refused_with_mmsegs_message() {
    let err = backbone_error(with_key(
        cityscapes(),
        "dec_stages_non_bottleneck",
        json!([2]),
    ));
    assert!(
        err.contains("Number of upsample block of decoder does not match"),
        "{err}"
    );
}
