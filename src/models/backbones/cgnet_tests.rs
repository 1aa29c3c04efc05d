//! Unit tests of `cgnet.rs`: the parameter count of a real config's backbone, one forward's shapes, refused keys.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of cgnet/cgnet_fcn_4xb8-60k_cityscapes-512x1024.py (and
/// of the 680x680 config: the same backbone; resolved, tuples as lists).
fn cityscapes() -> serde_json::Value {
    json!({
        "type": "CGNet",
        "norm_cfg": {"type": "SyncBN", "eps": 0.001, "requires_grad": true},
        "in_channels": 3,
        "num_channels": [32, 64, 128],
        "num_blocks": [3, 21],
        "dilations": [2, 4],
        "reductions": [8, 16]
    })
}

#[test]
fn cgnet_cityscapes_has_mmsegs_parameter_count() {
    // params_all.json, cgnet/cgnet_fcn_4xb8-60k_cityscapes-512x1024.py (and
    // cgnet_fcn_4xb4-60k_cityscapes-680x680.py): params.by_prefix.backbone.total
    assert_eq!(backbone(cityscapes()).0.total(), 491_442);
}

#[test]
fn the_outputs_are_the_three_stages_with_the_injected_input() {
    let (_, net) = backbone(cityscapes());
    let outs = net.forward(&image(2, 64, 64), true);
    // Stage 0: c0 + 3 at 1/2; stage 1: 2 c1 + 3 at 1/4; stage 2: 2 c2 at 1/8.
    assert_eq!(
        shapes(&outs),
        [
            vec![2, 35, 32, 32],
            vec![2, 131, 16, 16],
            vec![2, 256, 8, 8]
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(cityscapes(), "num_block", json!([3, 21])));
    assert!(err.contains("`num_block`"), "{err}");
}

#[test]
fn gradient_checkpointing_is_refused_by_name() {
    let err = backbone_error(with_key(cityscapes(), "with_cp", json!(true)));
    assert!(err.contains("`with_cp`"), "{err}");
}
