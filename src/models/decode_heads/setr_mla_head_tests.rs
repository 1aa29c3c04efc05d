//! Unit tests of `setr_mla_head.rs`: the parameter count of a real config's decode head, one forward's shape, a refused key.
use crate::models::component_config::test_support::{features, head, head_error, shapes, with_key};
use serde_json::json;

/// `model.decode_head` of setr/setr_vit-l_mla_8xb1-80k_cityscapes-768x768.py
/// (resolved; tuples as lists).
fn setr_mla() -> serde_json::Value {
    json!({
        "type": "SETRMLAHead",
        "in_channels": [256, 256, 256, 256],
        "channels": 512,
        "in_index": [0, 1, 2, 3],
        "dropout_ratio": 0,
        "mla_channels": 128,
        "num_classes": 19,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

#[test]
fn setr_mla_has_mmsegs_parameter_count() {
    // params_all.json, setr/setr_vit-l_mla_8xb1-80k_cityscapes-768x768.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(setr_mla(), "decode_head").0.total(), 1_781_267);
}

#[test]
fn the_head_classifies_at_the_features_resolution() {
    // MLANeck maps of a 64x64 image (patch 16), batch 2: each branch upsamples by up_scale 4.
    let (_, h) = head(setr_mla(), "decode_head");
    let inputs = features(2, &[(256, 4, 4), (256, 4, 4), (256, 4, 4), (256, 4, 4)]);
    assert_eq!(shapes(&[h.forward(&inputs, None, true)]), [[2, 19, 16, 16]]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(setr_mla(), "num_convs_typo", json!(1)));
    assert!(err.contains("`num_convs_typo`"), "{err}");
}
