//! Unit tests of `fpn.rs`: the parameter count of a real config's neck, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{features, neck, neck_error, shapes, with_key};
use serde_json::json;

/// `model.neck` of twins/twins_svt-s_fpn_fpnhead_8xb4-80k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn svt_s_fpn() -> serde_json::Value {
    json!({
        "type": "FPN",
        "in_channels": [64, 128, 256, 512],
        "out_channels": 256,
        "num_outs": 4
    })
}

#[test]
fn svt_s_fpn_has_mmsegs_parameter_count() {
    // params_all.json, twins/twins_svt-s_fpn_fpnhead_8xb4-80k_ade20k-512x512.py:
    // params.by_prefix.neck.total
    assert_eq!(neck(svt_s_fpn()).0.total(), 2_607_104);
}

#[test]
fn each_level_keeps_its_resolution_at_out_channels() {
    let (_, fpn) = neck(svt_s_fpn());
    let inputs = features(1, &[(64, 16, 16), (128, 8, 8), (256, 4, 4), (512, 2, 2)]);
    assert_eq!(
        shapes(&fpn.forward(inputs, true)),
        [
            vec![1, 256, 16, 16],
            vec![1, 256, 8, 8],
            vec![1, 256, 4, 4],
            vec![1, 256, 2, 2]
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = neck_error(with_key(svt_s_fpn(), "num_outs_typo", json!(1)));
    assert!(err.contains("`num_outs_typo`"), "{err}");
}
