//! Unit tests of `ddr_head.rs`: the parameter count of a real config's decode head, the logits' shapes, the loss items, refused configs.
use crate::models::component_config::test_support::{
    features, head, head_error, labels, shapes, with_key,
};
use serde_json::json;

fn ohem(weight: f64) -> serde_json::Value {
    json!({"type": "OhemCrossEntropy", "thres": 0.9, "min_kept": 131072,
           "class_weight": [0.8373, 0.918, 0.866, 1.0345, 1.0166, 0.9969, 0.9754, 1.0489,
                            0.8786, 1.0023, 0.9539, 0.9843, 1.1116, 0.9037, 1.0865, 1.0955,
                            1.0865, 1.1529, 1.0507],
           "loss_weight": weight})
}

/// `model.decode_head` of
/// ddrnet/ddrnet_23-slim_in1k-pre_2xb6-120k_cityscapes-1024x1024.py
/// (resolved; tuples as lists).
fn slim() -> serde_json::Value {
    json!({
        "type": "DDRHead",
        "in_channels": 128,
        "channels": 64,
        "dropout_ratio": 0.0,
        "num_classes": 19,
        "align_corners": false,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "loss_decode": [ohem(1.0), ohem(0.4)]
    })
}

#[test]
fn ddrnet_23_slim_has_mmsegs_parameter_count() {
    // params_all.json, ddrnet/ddrnet_23-slim_in1k-pre_2xb6-120k_cityscapes-1024x1024.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(slim(), "decode_head").0.total(), 113_702);
}

#[test]
fn the_head_classifies_at_the_features_resolution_and_names_its_losses() {
    let (_, h) = head(slim(), "decode_head");
    let inputs = features(2, &[(64, 8, 8), (128, 8, 8)]);
    assert_eq!(shapes(&[h.forward(&inputs, None, true)]), [[2, 19, 8, 8]]);
    assert_eq!(
        shapes(&[h.forward(&inputs[1..], None, false)]),
        [[2, 19, 8, 8]]
    );
    let items = h.loss(&inputs, None, &labels(2, 64, 64));
    let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["loss_context", "loss_spatial", "acc_seg"]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(slim(), "num_convs", json!(1)));
    assert!(err.contains("`num_convs`"), "{err}");
}

#[test]
fn one_loss_is_refused() {
    let err = head_error(with_key(slim(), "loss_decode", ohem(1.0)));
    assert!(err.contains("two losses"), "{err}");
}
