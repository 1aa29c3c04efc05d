//! Unit tests of `feature2pyramid.rs`: the parameter count of a real
//! config's neck, one forward's shapes, refused settings.
use crate::models::component_config::test_support::{features, neck, neck_error, shapes, with_key};
use serde_json::json;

/// `model.neck` of beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py.
fn beit_base() -> serde_json::Value {
    json!({"type": "Feature2Pyramid", "embed_dim": 768, "rescales": [4, 2, 1, 0.5]})
}

#[test]
fn beit_base_has_mmsegs_parameter_count() {
    // params_all.json, beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py:
    // params.by_prefix.neck.total; the BN's three buffers.
    let (store, _) = neck(beit_base());
    assert_eq!(store.total(), 7_081_728);
    assert_eq!(store.buffers.len(), 3);
}

#[test]
fn the_maps_are_rescaled_in_forwards_fixed_order() {
    let (_, f2p) = neck(json!({"type": "Feature2Pyramid", "embed_dim": 8}));
    let inputs = features(2, &[(8, 4, 4), (8, 4, 4), (8, 4, 4), (8, 4, 4)]);
    assert_eq!(
        shapes(&f2p.forward(inputs, true)),
        [
            vec![2, 8, 16, 16],
            vec![2, 8, 8, 8],
            vec![2, 8, 4, 4],
            vec![2, 8, 2, 2]
        ]
    );
    let (_, f2p) = neck(json!({
        "type": "Feature2Pyramid", "embed_dim": 8, "rescales": [0.25, 0.5, 1, 2]
    }));
    let inputs = features(1, &[(8, 8, 8), (8, 8, 8), (8, 8, 8), (8, 8, 8)]);
    assert_eq!(
        shapes(&f2p.forward(inputs, true)),
        [
            vec![1, 8, 16, 16],
            vec![1, 8, 8, 8],
            vec![1, 8, 4, 4],
            vec![1, 8, 2, 2]
        ]
    );
}

#[test]
fn rescales_forward_cannot_run_are_refused() {
    let err = neck_error(with_key(beit_base(), "rescales", json!([4, 2, 1, 3])));
    assert!(err.contains("invalid 3 for feature2pyramid"), "{err}");
    let err = neck_error(with_key(beit_base(), "rescales", json!([4, 2, 1, 0.25])));
    assert!(err.contains("rescales"), "{err}");
    let err = neck_error(with_key(beit_base(), "out_channels", json!(256)));
    assert!(err.contains("`out_channels`"), "{err}");
}
