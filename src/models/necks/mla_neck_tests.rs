//! Unit tests of `mla_neck.rs`: the parameter count of a real config's neck, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{features, neck, neck_error, shapes, with_key};
use serde_json::json;

/// `model.neck` of setr/setr_vit-l-mla_8xb1-160k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn vit_l_mla() -> serde_json::Value {
    json!({
        "type": "MLANeck",
        "in_channels": [1024, 1024, 1024, 1024],
        "out_channels": 256,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "act_cfg": {"type": "ReLU"}
    })
}

#[test]
fn setr_vit_l_mla_has_mmsegs_parameter_count() {
    // params_all.json, setr/setr_vit-l-mla_8xb1-160k_ade20k-512x512.py:
    // params.by_prefix.neck.total
    assert_eq!(neck(vit_l_mla()).0.total(), 3_420_160);
}

#[test]
fn each_vit_map_becomes_out_channels_at_its_resolution() {
    let (_, mla) = neck(vit_l_mla());
    let inputs = features(1, &[(1024, 4, 4), (1024, 4, 4), (1024, 4, 4), (1024, 4, 4)]);
    assert_eq!(
        shapes(&mla.forward(inputs, true)),
        vec![vec![1, 256, 4, 4]; 4]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = neck_error(with_key(vit_l_mla(), "num_outs_typo", json!(1)));
    assert!(err.contains("`num_outs_typo`"), "{err}");
}
