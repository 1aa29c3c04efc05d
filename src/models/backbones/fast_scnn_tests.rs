//! Unit tests of `fast_scnn.rs`: the parameter count of a real config's backbone, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of fastscnn/fast_scnn_8xb4-160k_cityscapes-512x1024.py
/// (resolved; tuples as lists).
fn fast_scnn() -> serde_json::Value {
    json!({
        "type": "FastSCNN",
        "downsample_dw_channels": [32, 48],
        "global_in_channels": 64,
        "global_block_channels": [64, 96, 128],
        "global_block_strides": [2, 2, 1],
        "global_out_channels": 128,
        "higher_in_channels": 64,
        "lower_in_channels": 128,
        "fusion_out_channels": 128,
        "out_indices": [0, 1, 2],
        "norm_cfg": {"type": "SyncBN", "requires_grad": true, "momentum": 0.01},
        "align_corners": false
    })
}

#[test]
fn fast_scnn_has_mmsegs_parameter_count() {
    // params_all.json, fastscnn/fast_scnn_8xb4-160k_cityscapes-512x1024.py:
    // params.by_prefix.backbone.total
    let (store, _) = backbone(fast_scnn());
    assert_eq!(store.total(), 1_361_392);
    assert!(store
        .params
        .iter()
        .any(|p| p.name == "backbone.global_feature_extractor.bottleneck3.2.conv.2.bn.weight"));
}

#[test]
fn the_outputs_are_the_downsampled_the_global_and_the_fused_maps() {
    // Batch 2: the PPM's 1x1 pooled branch has one value per channel,
    // which BatchNorm in training refuses at batch 1.
    let (_, net) = backbone(fast_scnn());
    let outs = net.forward(&image(2, 64, 64), true);
    // higher_res_features (global_in_channels, 1/8), lower_res_features
    // (global_out_channels, 1/32), fusion_output (fusion_out_channels, 1/8).
    assert_eq!(
        shapes(&outs),
        [vec![2, 64, 8, 8], vec![2, 128, 2, 2], vec![2, 128, 8, 8]]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(fast_scnn(), "frozen_stages_typo", json!(1)));
    assert!(err.contains("`frozen_stages_typo`"), "{err}");
}

#[test]
fn gradient_checkpointing_is_refused_by_name() {
    let err = backbone_error(with_key(fast_scnn(), "with_cp", json!(true)));
    assert!(err.contains("`with_cp`"), "{err}");
}
