//! Unit tests of `bisenetv2.rs`: the parameter count of a real config's backbone, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of bisenetv2/bisenetv2_fcn_4xb4-160k_cityscapes-1024x1024.py
/// (resolved; tuples as lists).
fn cityscapes() -> serde_json::Value {
    json!({
        "type": "BiSeNetV2",
        "detail_channels": [64, 64, 128],
        "semantic_channels": [16, 32, 64, 128],
        "semantic_expansion_ratio": 6,
        "bga_channels": 128,
        "out_indices": [0, 1, 2, 3, 4],
        "init_cfg": null,
        "align_corners": false
    })
}

#[test]
fn bisenetv2_cityscapes_has_mmsegs_parameter_count() {
    // params_all.json, bisenetv2/bisenetv2_fcn_4xb4-160k_cityscapes-1024x1024.py:
    // params.by_prefix.backbone.total
    let (store, _) = backbone(cityscapes());
    assert_eq!(store.total(), 2_157_712);
    // MMSeg's BiSeNetV2(...): len(list(parameters())), len(list(buffers())).
    assert_eq!((store.params.len(), store.buffers.len()), (162, 159));
}

#[test]
fn the_outputs_are_the_bga_map_and_the_semantic_stages() {
    // Batch 2: the CE block's global pooling has one value per channel,
    // which BatchNorm in training refuses at batch 1.
    let (_, net) = backbone(cityscapes());
    let outs = net.forward(&image(2, 64, 64), true);
    // x_head (bga_channels, 1/8), then the stem (1/4) and stages 2-3 (1/8, 1/16).
    assert_eq!(
        shapes(&outs),
        [
            vec![2, 128, 8, 8],
            vec![2, 16, 16, 16],
            vec![2, 32, 8, 8],
            vec![2, 64, 4, 4],
            vec![2, 128, 2, 2]
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(cityscapes(), "frozen_stages_typo", json!(1)));
    assert!(err.contains("`frozen_stages_typo`"), "{err}");
}
