//! Unit tests of `lraspp_head.rs`: the parameter counts of the real
//! configs' heads and their names, one forward's shape, refused settings.
use crate::models::component_config::test_support::{features, head, head_error, with_key};
use serde_json::json;

/// `model.decode_head` of mobilenet_v3/mobilenet-v3-d8-s_lraspp_4xb4-320k_cityscapes-512x1024.py
/// (resolved; tuples as lists).
fn small_head() -> serde_json::Value {
    json!({
        "type": "LRASPPHead", "in_channels": [16, 16, 576], "in_index": [0, 1, 2],
        "channels": 128, "input_transform": "multiple_select", "dropout_ratio": 0.1,
        "num_classes": 19, "norm_cfg": {"type": "SyncBN", "eps": 0.001, "requires_grad": true},
        "act_cfg": {"type": "ReLU"}, "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

#[test]
fn both_heads_have_mmsegs_parameter_counts_and_names() {
    // params_all.json: params.by_prefix.decode_head.total of the -s and the
    // large configs.
    let (store, _) = head(small_head(), "decode_head");
    assert_eq!(store.total(), 213_779);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[0], "decode_head.conv_seg.weight");
    assert_eq!(names[2], "decode_head.convs.conv0.weight");
    assert_eq!(names[4], "decode_head.conv_ups.conv_up0.conv.weight");
    assert_eq!(names.last(), Some(&"decode_head.image_pool.1.conv.weight"));
    let large = with_key(small_head(), "in_channels", json!([16, 24, 960]));
    assert_eq!(head(large, "decode_head").0.total(), 312_595);
}

#[test]
fn the_head_classifies_at_the_first_maps_resolution() {
    let (_, head) = head(small_head(), "decode_head");
    // The 49x49 pool needs a last map of 49 or more.
    let feats = features(2, &[(16, 100, 104), (16, 50, 52), (576, 50, 52)]);
    assert_eq!(head.forward(&feats, None, true).size(), [2, 19, 100, 104]);
}

#[test]
fn other_input_transforms_and_branch_counts_are_refused() {
    let err = head_error(with_key(
        small_head(),
        "input_transform",
        json!("resize_concat"),
    ));
    assert!(err.contains("must be 'multiple_select'"), "{err}");
    let err = head_error(with_key(small_head(), "branch_channels", json!([32])));
    assert!(err.contains("len(in_channels) - 1"), "{err}");
    let err = head_error(with_key(small_head(), "act_cfg", json!({"type": "GELU"})));
    assert!(err.contains("`act_cfg`"), "{err}");
}
