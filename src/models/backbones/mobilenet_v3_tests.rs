//! Unit tests of `mobilenet_v3.rs`: the parameter counts of the real
//! configs' backbones, the output-stride-8 shapes, refused keys.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of mobilenet_v3/mobilenet-v3-d8-s_lraspp_4xb4-320k_cityscapes-512x1024.py
/// (resolved; tuples as lists).
fn small() -> serde_json::Value {
    json!({
        "type": "MobileNetV3", "arch": "small", "out_indices": [0, 1, 12],
        "norm_cfg": {"type": "SyncBN", "eps": 0.001, "requires_grad": true}
    })
}

/// `model.backbone` of mobilenet_v3/mobilenet-v3-d8_lraspp_4xb4-320k_cityscapes-512x1024.py.
fn large() -> serde_json::Value {
    json!({
        "type": "MobileNetV3", "arch": "large", "out_indices": [1, 3, 16],
        "norm_cfg": {"type": "SyncBN", "eps": 0.001, "requires_grad": true}
    })
}

#[test]
fn both_archs_have_mmsegs_parameter_counts() {
    // params_all.json: params.by_prefix.backbone.total of the -s and the
    // large configs.
    assert_eq!(backbone(small()).0.total(), 927_008);
    assert_eq!(backbone(large()).0.total(), 2_971_952);
}

#[test]
fn the_outputs_stop_at_output_stride_8() {
    let (_, net) = backbone(small());
    let outs = net.forward(&image(2, 64, 64), true);
    assert_eq!(
        shapes(&outs),
        [vec![2, 16, 32, 32], vec![2, 16, 16, 16], vec![2, 576, 8, 8]]
    );
    let (_, net) = backbone(large());
    let outs = net.forward(&image(1, 63, 65), true);
    assert_eq!(
        shapes(&outs),
        [vec![1, 16, 32, 33], vec![1, 24, 16, 17], vec![1, 960, 8, 9]]
    );
}

#[test]
fn reduction_factor_divides_the_last_blocks() {
    let (store, _) = backbone(with_key(small(), "reduction_factor", json!(2)));
    assert!(store.total() < 927_008);
}

#[test]
fn bad_settings_are_refused_by_name_or_with_mmsegs_message() {
    let err = backbone_error(with_key(small(), "with_cp", json!(true)));
    assert!(err.contains("`with_cp`"), "{err}");
    let err = backbone_error(with_key(small(), "out_indices", json!([13])));
    assert!(
        err.contains("the item in out_indices must in range(0, 13). But received 13"),
        "{err}"
    );
    let err = backbone_error(with_key(small(), "arch", json!("tiny")));
    assert!(err.contains("arch"), "{err}");
}
