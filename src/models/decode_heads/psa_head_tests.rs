//! Unit tests of `psa_head.rs`: the parameter count of a real config's decode head, one forward's shape, a refused key.
use crate::models::component_config::test_support::{features, head, head_error, shapes, with_key};
use serde_json::json;

/// `model.decode_head` of psanet/psanet_r101-d8_4xb4-160k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn psanet_r101_d8() -> serde_json::Value {
    json!({
        "type": "PSAHead",
        "in_channels": 2048,
        "in_index": 3,
        "channels": 512,
        "mask_size": [66, 66],
        "psa_type": "bi-direction",
        "compact": false,
        "shrink_factor": 2,
        "normalization_factor": 1.0,
        "psa_softmax": true,
        "dropout_ratio": 0.1,
        "num_classes": 150,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

#[test]
fn psanet_r101_d8_has_mmsegs_parameter_count() {
    // params_all.json, psanet/psanet_r101-d8_4xb4-160k_ade20k-512x512.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(psanet_r101_d8(), "decode_head").0.total(), 28_139_670);
}

#[test]
fn the_head_classifies_at_the_features_resolution() {
    // ResNet-D8 features of a 64x64 image, batch 2 (shrunk to 4x4 for the
    // 66x66 masks: PSAMask reads any window size).
    let (_, h) = head(psanet_r101_d8(), "decode_head");
    let inputs = features(2, &[(256, 8, 8), (512, 8, 8), (1024, 8, 8), (2048, 8, 8)]);
    assert_eq!(shapes(&[h.forward(&inputs, None, true)]), [[2, 150, 8, 8]]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(psanet_r101_d8(), "num_convs_typo", json!(1)));
    assert!(err.contains("`num_convs_typo`"), "{err}");
}
