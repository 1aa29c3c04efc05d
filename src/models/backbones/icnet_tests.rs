//! Unit tests of `icnet.rs`: the parameter count of a real config's backbone, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of icnet/icnet_r18-d8_4xb2-80k_cityscapes-832x832.py
/// (resolved; tuples as lists).
fn r18_d8() -> serde_json::Value {
    json!({
        "type": "ICNet",
        "backbone_cfg": {
            "type": "ResNetV1c",
            "in_channels": 3,
            "depth": 18,
            "num_stages": 4,
            "out_indices": [0, 1, 2, 3],
            "dilations": [1, 1, 2, 4],
            "strides": [1, 2, 1, 1],
            "norm_cfg": {"type": "SyncBN", "requires_grad": true},
            "norm_eval": false,
            "style": "pytorch",
            "contract_dilation": true
        },
        "in_channels": 3,
        "layer_channels": [128, 512],
        "light_branch_middle_channels": 32,
        "psp_out_channels": 512,
        "out_channels": [64, 256, 256],
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false
    })
}

#[test]
fn icnet_r18_d8_has_mmsegs_parameter_count() {
    // params_all.json, icnet/icnet_r18-d8_4xb2-80k_cityscapes-832x832.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(r18_d8()).0.total(), 24_239_552);
}

#[test]
fn the_outputs_are_the_three_branches_from_the_finest() {
    let (_, net) = backbone(r18_d8());
    let outs = net.forward(&image(2, 64, 64), true);
    // x_sub1 (out_channels[0], 1/8), x_sub2 (out_channels[1], 1/16),
    // x_sub4 (out_channels[2], 1/32). ICNet's ceil-mode max pool makes the
    // half image's 16x16 stem output 9x9 (as in MMSeg), so 1/16 is 5x5 and
    // its half (bilinear, scale 0.5) 2x2.
    assert_eq!(
        shapes(&outs),
        [vec![2, 64, 8, 8], vec![2, 256, 5, 5], vec![2, 256, 2, 2]]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(r18_d8(), "frozen_stages_typo", json!(1)));
    assert!(err.contains("`frozen_stages_typo`"), "{err}");
}
