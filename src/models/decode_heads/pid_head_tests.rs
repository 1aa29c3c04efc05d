//! Unit tests of `pid_head.rs`: the parameter count of a real config's decode head, the logits' shapes, the loss items, refused configs.
use crate::models::component_config::test_support::{
    features, head, head_error, labels, shapes, with_key,
};
use serde_json::json;

fn ohem() -> serde_json::Value {
    json!({"type": "OhemCrossEntropy", "thres": 0.9, "min_kept": 131072, "loss_weight": 1.0})
}

/// `model.decode_head` of pidnet/pidnet-s_2xb6-120k_1024x1024-cityscapes.py
/// (resolved; class weights left out: they change no shape).
fn pidnet_s() -> serde_json::Value {
    json!({
        "type": "PIDHead",
        "in_channels": 128,
        "channels": 128,
        "num_classes": 19,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "act_cfg": {"type": "ReLU", "inplace": true},
        "align_corners": true,
        "loss_decode": [
            {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 0.4},
            ohem(),
            {"type": "BoundaryLoss", "loss_weight": 20.0},
            ohem()
        ]
    })
}

#[test]
fn pidnet_s_has_mmsegs_parameter_count() {
    // params_all.json, pidnet/pidnet-s_2xb6-120k_1024x1024-cityscapes.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(pidnet_s(), "decode_head").0.total(), 245_639);
}

#[test]
fn the_heads_classify_at_the_features_resolution_and_name_their_losses() {
    let (_, h) = head(pidnet_s(), "decode_head");
    let inputs = features(2, &[(64, 8, 8), (128, 8, 8), (64, 8, 8)]);
    assert_eq!(shapes(&[h.forward(&inputs, None, true)]), [[2, 19, 8, 8]]);
    assert_eq!(
        shapes(&[h.forward(&inputs[1..2], None, false)]),
        [[2, 19, 8, 8]]
    );
    let edges = labels(2, 64, 64);
    let items = h.loss_with_edges(&inputs, &labels(2, 64, 64), &edges);
    let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "loss_sem_p",
            "loss_sem_i",
            "loss_bd",
            "loss_sem_bd",
            "acc_seg"
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(pidnet_s(), "num_convs", json!(1)));
    assert!(err.contains("`num_convs`"), "{err}");
}

#[test]
fn an_ohem_loss_first_is_refused() {
    let err = head_error(with_key(
        pidnet_s(),
        "loss_decode",
        json!([ohem(), ohem(), {"type": "BoundaryLoss"}, ohem()]),
    ));
    assert!(err.contains("TypeError"), "{err}");
}

/// A small PIDNet-S model (`channels` 8), with `train_pipeline` if given.
fn small_model(pipeline: Option<serde_json::Value>) -> crate::config::Dict {
    let mut cfg = json!({"model": {
        "type": "EncoderDecoder",
        "data_preprocessor": {"type": "SegDataPreProcessor", "size": [64, 64]},
        "backbone": {"type": "PIDNet", "channels": 8, "ppm_channels": 8},
        "decode_head": with_key(with_key(pidnet_s(), "in_channels", json!(32)), "channels", json!(16)),
    }});
    if let Some(p) = pipeline {
        cfg = with_key(cfg, "train_pipeline", p);
    }
    crate::models::component_config::test_support::dict(cfg)
}

#[test]
fn a_pipeline_without_generate_edge_is_refused_and_with_it_the_model_makes_edges() {
    use crate::models::segmentors::encoder_decoder::EncoderDecoder;
    let err = EncoderDecoder::build(&small_model(None), tch::Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("GenerateEdge"), "{err}");
    let with_edges = small_model(Some(json!([{"type": "GenerateEdge", "edge_width": 4}])));
    let model = EncoderDecoder::build(&with_edges, tch::Device::Cpu).unwrap();
    assert_eq!(model.edge_maps.map(|e| e.edge_width), Some(4));
}
