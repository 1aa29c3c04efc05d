//! Unit tests of `poolformer.rs`: the parameter count of a real config's backbone, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of poolformer/fpn_poolformer_s12_8xb4-40k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn s12() -> serde_json::Value {
    json!({
        "type": "mmpretrain.PoolFormer",
        "arch": "s12",
        "init_cfg": {
            "type": "Pretrained",
            "checkpoint": "https://download.openmmlab.com/mmclassification/v0/poolformer/poolformer-s12_3rdparty_32xb128_in1k_20220414-f8d83051.pth",
            "prefix": "backbone."
        },
        "in_patch_size": 7,
        "in_stride": 4,
        "in_pad": 2,
        "down_patch_size": 3,
        "down_stride": 2,
        "down_pad": 1,
        "drop_rate": 0.0,
        "drop_path_rate": 0.0,
        "out_indices": [0, 2, 4, 6],
        "frozen_stages": 0
    })
}

#[test]
fn poolformer_s12_has_mmsegs_parameter_count() {
    // params_all.json, poolformer/fpn_poolformer_s12_8xb4-40k_ade20k-512x512.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(s12()).0.total(), 11_403_200);
}

#[test]
fn the_outputs_are_the_four_stages_at_strides_4_to_32() {
    let (_, net) = backbone(s12());
    let outs = net.forward(&image(1, 64, 64), true);
    assert_eq!(
        shapes(&outs),
        [
            vec![1, 64, 16, 16],
            vec![1, 128, 8, 8],
            vec![1, 320, 4, 4],
            vec![1, 512, 2, 2]
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(s12(), "frozen_stages_typo", json!(1)));
    assert!(err.contains("`frozen_stages_typo`"), "{err}");
}
