//! Unit tests of `point_head.rs`: PointRend's cascade of a real config
//! (parameter count), the training loss's items, the subdivision's output
//! size, a refused key.
use crate::models::component_config::test_support::{
    features, head, head_error, labels, shapes, with_key,
};
use serde_json::json;

/// `model.decode_head`[0] of point_rend/pointrend_r101_4xb2-80k_cityscapes-512x1024.py
/// (resolved; tuples as lists).
fn fpn_head() -> serde_json::Value {
    json!({
        "type": "FPNHead",
        "in_channels": [256, 256, 256, 256],
        "in_index": [0, 1, 2, 3],
        "feature_strides": [4, 8, 16, 32],
        "channels": 128,
        "dropout_ratio": -1,
        "num_classes": 19,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

/// `model.decode_head`[1] of point_rend/pointrend_r101_4xb2-80k_cityscapes-512x1024.py
/// (resolved; tuples as lists),
/// with the `model.train_cfg` and `model.test_cfg` the segmentor hands it.
fn point_head() -> serde_json::Value {
    json!({
        "type": "PointHead",
        "in_channels": [256],
        "in_index": [0],
        "channels": 256,
        "num_fcs": 3,
        "coarse_pred_each_layer": true,
        "dropout_ratio": -1,
        "num_classes": 19,
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

/// `point_head()` with a small training sample and two subdivision steps.
fn small_point_head() -> serde_json::Value {
    let j = with_key(
        point_head(),
        "train_cfg",
        json!({"num_points": 64, "oversample_ratio": 3, "importance_sample_ratio": 0.75}),
    );
    with_key(
        j,
        "test_cfg",
        json!({"mode": "whole", "subdivision_steps": 2, "subdivision_num_points": 32, "scale_factor": 2}),
    )
}

#[test]
fn pointrend_r101_heads_have_mmsegs_parameter_count() {
    // params_all.json, point_rend/pointrend_r101_4xb2-80k_cityscapes-512x1024.py:
    // params.by_prefix.decode_head.total, the FPNHead and the PointHead.
    // PointHead: 3 fcs Conv1d(256 + 19, 256) and fc_seg Conv1d(256 + 19, 19),
    // with biases: 3 * (275 * 256 + 256) + 275 * 19 + 19 = 217_212.
    let (fpn, _) = head(fpn_head(), "decode_head.0");
    let (point, _) = head(small_point_head(), "decode_head.1");
    assert_eq!(point.total(), 217_212);
    assert_eq!(fpn.total() + point.total(), 1_843_471);
}

#[test]
fn the_loss_is_on_sampled_points_and_inference_subdivides_twice() {
    let (_, h) = head(small_point_head(), "decode_head.1");
    assert!(h.is_cascade());
    let inputs = features(2, &[(256, 16, 16), (256, 8, 8), (256, 4, 4), (256, 2, 2)]);
    let coarse = tch::Tensor::randn([2, 19, 16, 16], (tch::Kind::Float, tch::Device::Cpu));
    let items = h.loss(&inputs, Some(&coarse), &labels(2, 64, 64));
    let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["pointloss_ce", "acc_point"]);
    // forward: two steps of scale_factor 2 from the coarse 16x16.
    assert_eq!(
        shapes(&[h.forward(&inputs, Some(&coarse), false)]),
        [[2, 19, 64, 64]]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(small_point_head(), "num_convs_typo", json!(1)));
    assert!(err.contains("`num_convs_typo`"), "{err}");
}
