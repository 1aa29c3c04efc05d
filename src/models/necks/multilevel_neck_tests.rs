//! Unit tests of `multilevel_neck.rs`: the parameter count of a real config's neck, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{features, neck, neck_error, shapes, with_key};
use serde_json::json;

/// `model.neck` of vit/vit_deit-s16-ln_mln_upernet_8xb2-160k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn deit_s16_mln() -> serde_json::Value {
    json!({
        "type": "MultiLevelNeck",
        "in_channels": [384, 384, 384, 384],
        "out_channels": 384,
        "scales": [4, 2, 1, 0.5]
    })
}

#[test]
fn deit_s16_mln_has_mmsegs_parameter_count() {
    // params_all.json, vit/vit_deit-s16-ln_mln_upernet_8xb2-160k_ade20k-512x512.py:
    // params.by_prefix.neck.total
    assert_eq!(neck(deit_s16_mln()).0.total(), 5_901_312);
}

#[test]
fn each_map_is_rescaled_by_its_scale() {
    // scales [4, 2, 1, 0.5] of four 4x4 ViT maps.
    let (_, mln) = neck(deit_s16_mln());
    let inputs = features(1, &[(384, 4, 4), (384, 4, 4), (384, 4, 4), (384, 4, 4)]);
    assert_eq!(
        shapes(&mln.forward(inputs, true)),
        [
            vec![1, 384, 16, 16],
            vec![1, 384, 8, 8],
            vec![1, 384, 4, 4],
            vec![1, 384, 2, 2]
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = neck_error(with_key(deit_s16_mln(), "num_outs_typo", json!(1)));
    assert!(err.contains("`num_outs_typo`"), "{err}");
}
