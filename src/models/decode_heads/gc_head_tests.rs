//! Unit tests of `gc_head.rs`: the parameter count of a real config's decode head, one forward's shape, a refused key.
use crate::models::component_config::test_support::{features, head, head_error, shapes, with_key};
use serde_json::json;

/// `model.decode_head` of gcnet/gcnet_r101-d8_4xb2-40k_cityscapes-512x1024.py
/// (resolved; tuples as lists).
fn gcnet_r101_d8() -> serde_json::Value {
    json!({
        "type": "GCHead",
        "in_channels": 2048,
        "in_index": 3,
        "channels": 512,
        "ratio": 0.25,
        "pooling_type": "att",
        "fusion_types": ["channel_add"],
        "dropout_ratio": 0.1,
        "num_classes": 19,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

#[test]
fn gcnet_r101_d8_has_mmsegs_parameter_count() {
    // params_all.json, gcnet/gcnet_r101-d8_4xb2-40k_cityscapes-512x1024.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(gcnet_r101_d8(), "decode_head").0.total(), 23_738_260);
}

#[test]
fn the_head_classifies_at_the_features_resolution() {
    // ResNet-D8 features of a 64x64 image, batch 2.
    let (_, h) = head(gcnet_r101_d8(), "decode_head");
    let inputs = features(2, &[(256, 8, 8), (512, 8, 8), (1024, 8, 8), (2048, 8, 8)]);
    assert_eq!(shapes(&[h.forward(&inputs, None, true)]), [[2, 19, 8, 8]]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(gcnet_r101_d8(), "num_convs_typo", json!(1)));
    assert!(err.contains("`num_convs_typo`"), "{err}");
}
