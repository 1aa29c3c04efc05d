//! Unit tests of `ic_neck.rs`: the parameter count of a real config's neck, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{features, neck, neck_error, shapes, with_key};
use serde_json::json;

/// `model.neck` of icnet/icnet_r18-d8_4xb2-80k_cityscapes-832x832.py
/// (resolved; tuples as lists).
fn icnet_r18_d8() -> serde_json::Value {
    json!({
        "type": "ICNeck",
        "in_channels": [64, 256, 256],
        "out_channels": 128,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false
    })
}

#[test]
fn icneck_of_icnet_r18_d8_has_mmsegs_parameter_count() {
    // params_all.json, icnet/icnet_r18-d8_4xb2-80k_cityscapes-832x832.py:
    // params.by_prefix.neck.total
    assert_eq!(neck(icnet_r18_d8()).0.total(), 484_352);
}

#[test]
fn the_outputs_are_x_24_x_12_and_the_fused_map_at_the_finest() {
    // ICNet's branches of a 64x64 image: 1/8, 1/16, 1/32. x_24 is the
    // coarsest map at 1/16, x_12 and x_cff_12 (the fused map) at 1/8.
    let (_, icneck) = neck(icnet_r18_d8());
    let inputs = features(2, &[(64, 8, 8), (256, 4, 4), (256, 2, 2)]);
    assert_eq!(
        shapes(&icneck.forward(inputs, true)),
        [vec![2, 128, 4, 4], vec![2, 128, 8, 8], vec![2, 128, 8, 8]]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = neck_error(with_key(icnet_r18_d8(), "num_outs_typo", json!(1)));
    assert!(err.contains("`num_outs_typo`"), "{err}");
}
