//! Unit tests of `fpn_head.rs`: the parameter count of a real config's decode head, one forward's shape, a refused key.
use crate::models::component_config::test_support::{features, head, head_error, shapes, with_key};
use serde_json::json;

/// `model.decode_head` of sem_fpn/fpn_r101_4xb2-80k_cityscapes-512x1024.py
/// (resolved; tuples as lists).
fn sem_fpn_r101() -> serde_json::Value {
    json!({
        "type": "FPNHead",
        "in_channels": [256, 256, 256, 256],
        "in_index": [0, 1, 2, 3],
        "feature_strides": [4, 8, 16, 32],
        "channels": 128,
        "dropout_ratio": 0.1,
        "num_classes": 19,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

#[test]
fn sem_fpn_r101_has_mmsegs_parameter_count() {
    // params_all.json, sem_fpn/fpn_r101_4xb2-80k_cityscapes-512x1024.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(sem_fpn_r101(), "decode_head").0.total(), 1_626_259);
}

#[test]
fn the_head_classifies_at_the_features_resolution() {
    // FPN maps of a 64x64 image (strides 4 to 32), batch 2: the head works at stride 4.
    let (_, h) = head(sem_fpn_r101(), "decode_head");
    let inputs = features(2, &[(256, 16, 16), (256, 8, 8), (256, 4, 4), (256, 2, 2)]);
    assert_eq!(shapes(&[h.forward(&inputs, None, true)]), [[2, 19, 16, 16]]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(sem_fpn_r101(), "num_convs_typo", json!(1)));
    assert!(err.contains("`num_convs_typo`"), "{err}");
}
