//! Unit tests of `sep_fcn_head.rs`: the parameter count of a real config's head, one forward's shape, a refused key.
use crate::models::component_config::test_support::{features, head, head_error, with_key};
use serde_json::json;

/// `model.decode_head` of fastscnn/fast_scnn_8xb4-160k_cityscapes-512x1024.py
/// (resolved).
fn fast_scnn_head() -> serde_json::Value {
    json!({
        "type": "DepthwiseSeparableFCNHead",
        "in_channels": 128,
        "channels": 128,
        "concat_input": false,
        "num_classes": 19,
        "in_index": -1,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true, "momentum": 0.01},
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": true, "loss_weight": 1}
    })
}

#[test]
fn fast_scnn_head_has_mmsegs_parameter_count() {
    // params_all.json, fastscnn/fast_scnn_8xb4-160k_cityscapes-512x1024.py:
    // params.by_prefix.decode_head.total (FCNHead's default num_convs=2).
    let (store, _) = head(fast_scnn_head(), "decode_head");
    assert_eq!(store.total(), 38_547);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[0], "decode_head.conv_seg.weight");
    assert!(names.contains(&"decode_head.convs.1.pointwise_conv.bn.bias"));
}

#[test]
fn the_head_classifies_the_last_map_at_its_resolution() {
    let (_, head) = head(fast_scnn_head(), "decode_head");
    let feats = features(2, &[(64, 8, 8), (128, 2, 2), (128, 8, 8)]);
    assert_eq!(head.forward(&feats, None, true).size(), [2, 19, 8, 8]);
}

#[test]
fn the_concatenating_head_fuses_with_conv_cat() {
    let cfg = with_key(fast_scnn_head(), "concat_input", json!(true));
    let (store, head) = head(cfg, "decode_head");
    assert!(store
        .params
        .iter()
        .any(|p| p.name == "decode_head.conv_cat.depthwise_conv.conv.weight"));
    let feats = features(2, &[(128, 4, 4)]);
    assert_eq!(head.forward(&feats, None, true).size(), [2, 19, 4, 4]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(fast_scnn_head(), "pool_scales", json!([1, 2])));
    assert!(err.contains("`pool_scales`"), "{err}");
}
