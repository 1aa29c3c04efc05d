//! Unit tests of `setr_up_head.rs`: the parameter count of a real config's decode head, one forward's shape, a refused key.
use crate::models::component_config::test_support::{features, head, head_error, shapes, with_key};
use serde_json::json;

/// `model.decode_head` of setr/setr_vit-l_naive_8xb1-80k_cityscapes-768x768.py
/// (resolved; tuples as lists).
fn setr_naive() -> serde_json::Value {
    json!({
        "type": "SETRUPHead",
        "in_channels": 1024,
        "channels": 256,
        "in_index": 3,
        "num_classes": 19,
        "dropout_ratio": 0,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "num_convs": 1,
        "up_scale": 4,
        "kernel_size": 1,
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

#[test]
fn setr_naive_has_mmsegs_parameter_count() {
    // params_all.json, setr/setr_vit-l_naive_8xb1-80k_cityscapes-768x768.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(setr_naive(), "decode_head").0.total(), 269_587);
}

#[test]
fn the_head_classifies_at_the_features_resolution() {
    // ViT-L maps of a 64x64 image (patch 16), batch 2: the naive head's one
    // conv (num_convs 1) is followed by an upsampling by up_scale 4.
    let (_, h) = head(setr_naive(), "decode_head");
    let inputs = features(2, &[(1024, 4, 4), (1024, 4, 4), (1024, 4, 4), (1024, 4, 4)]);
    assert_eq!(shapes(&[h.forward(&inputs, None, true)]), [[2, 19, 16, 16]]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(setr_naive(), "num_convs_typo", json!(1)));
    assert!(err.contains("`num_convs_typo`"), "{err}");
}
