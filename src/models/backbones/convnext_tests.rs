//! Unit tests of `convnext.rs`: the parameter count of a real config's backbone, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of convnext/convnext-tiny_upernet_8xb2-amp-160k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn tiny() -> serde_json::Value {
    json!({
        "type": "mmpretrain.ConvNeXt",
        "arch": "tiny",
        "out_indices": [0, 1, 2, 3],
        "drop_path_rate": 0.4,
        "layer_scale_init_value": 1.0,
        "gap_before_final_norm": false,
        "init_cfg": {
            "type": "Pretrained",
            "checkpoint": "https://download.openmmlab.com/mmclassification/v0/convnext/downstream/convnext-tiny_3rdparty_32xb128-noema_in1k_20220301-795e9634.pth",
            "prefix": "backbone."
        }
    })
}

#[test]
fn convnext_tiny_has_mmsegs_parameter_count() {
    // params_all.json, convnext/convnext-tiny_upernet_8xb2-amp-160k_ade20k-512x512.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(tiny()).0.total(), 27_821_472);
}

#[test]
fn the_outputs_are_the_four_stages_at_strides_4_to_32() {
    let (_, net) = backbone(tiny());
    let outs = net.forward(&image(1, 64, 64), true);
    assert_eq!(
        shapes(&outs),
        [
            vec![1, 96, 16, 16],
            vec![1, 192, 8, 8],
            vec![1, 384, 4, 4],
            vec![1, 768, 2, 2]
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(tiny(), "frozen_stages_typo", json!(1)));
    assert!(err.contains("`frozen_stages_typo`"), "{err}");
}
