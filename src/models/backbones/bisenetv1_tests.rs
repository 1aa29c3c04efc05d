//! Unit tests of `bisenetv1.rs`: the parameter count of a real config's backbone, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of bisenetv1/bisenetv1_r18-d32_4xb4-160k_cityscapes-1024x1024.py
/// (resolved; tuples as lists).
fn r18_d32() -> serde_json::Value {
    json!({
        "type": "BiSeNetV1",
        "in_channels": 3,
        "context_channels": [128, 256, 512],
        "spatial_channels": [64, 64, 64, 128],
        "out_indices": [0, 1, 2],
        "out_channels": 256,
        "backbone_cfg": {
            "type": "ResNet",
            "in_channels": 3,
            "depth": 18,
            "num_stages": 4,
            "out_indices": [0, 1, 2, 3],
            "dilations": [1, 1, 1, 1],
            "strides": [1, 2, 2, 2],
            "norm_cfg": {"type": "SyncBN", "requires_grad": true},
            "norm_eval": false,
            "style": "pytorch",
            "contract_dilation": true
        },
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false,
        "init_cfg": null
    })
}

#[test]
fn bisenetv1_r18_d32_has_mmsegs_parameter_count() {
    // params_all.json, bisenetv1/bisenetv1_r18-d32_4xb4-160k_cityscapes-1024x1024.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(r18_d32()).0.total(), 12_680_320);
}

#[test]
fn the_outputs_are_the_fused_map_and_the_two_context_maps() {
    // Batch 2: the context path's global pooling has one value per channel,
    // which BatchNorm in training refuses at batch 1.
    let (_, net) = backbone(r18_d32());
    let outs = net.forward(&image(2, 64, 64), true);
    // x_fuse (out_channels, 1/8), x_context8 (context_channels[0], 1/8),
    // x_context16 (context_channels[0], 1/16).
    assert_eq!(
        shapes(&outs),
        [vec![2, 256, 8, 8], vec![2, 128, 8, 8], vec![2, 128, 4, 4]]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(r18_d32(), "frozen_stages_typo", json!(1)));
    assert!(err.contains("`frozen_stages_typo`"), "{err}");
}
