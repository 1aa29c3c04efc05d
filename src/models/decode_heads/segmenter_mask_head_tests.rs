//! Unit tests of `segmenter_mask_head.rs`: the parameter count of a real config's decode head, one forward's shape, a refused key.
use crate::models::component_config::test_support::{features, head, head_error, shapes, with_key};
use serde_json::json;

/// `model.decode_head` of segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn segmenter_vit_t() -> serde_json::Value {
    json!({
        "type": "SegmenterMaskTransformerHead",
        "in_channels": 192,
        "channels": 192,
        "num_classes": 150,
        "num_layers": 2,
        "num_heads": 3,
        "embed_dims": 192,
        "dropout_ratio": 0.0,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

#[test]
fn segmenter_vit_t_has_mmsegs_parameter_count() {
    // params_all.json, segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(segmenter_vit_t(), "decode_head").0.total(), 1_029_996);
}

#[test]
fn the_head_classifies_at_the_features_resolution() {
    // A ViT-T map of a 64x64 image (patch 16), batch 2.
    let (_, h) = head(segmenter_vit_t(), "decode_head");
    let inputs = features(2, &[(192, 4, 4)]);
    assert_eq!(shapes(&[h.forward(&inputs, None, true)]), [[2, 150, 4, 4]]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(segmenter_vit_t(), "num_convs_typo", json!(1)));
    assert!(err.contains("`num_convs_typo`"), "{err}");
}
