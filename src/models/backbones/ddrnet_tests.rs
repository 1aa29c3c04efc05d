//! Unit tests of `ddrnet.rs`: the parameter counts of real configs' backbones, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of
/// ddrnet/ddrnet_23-slim_in1k-pre_2xb6-120k_cityscapes-1024x1024.py
/// (resolved; `channels` 64 gives ddrnet_23).
fn slim(channels: i64) -> serde_json::Value {
    json!({
        "type": "DDRNet",
        "in_channels": 3,
        "channels": channels,
        "ppm_channels": 128,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false,
        "init_cfg": {"type": "Pretrained", "checkpoint": "ddrnet23s.pth"}
    })
}

#[test]
fn ddrnet_23_slim_and_23_have_mmsegs_parameter_counts() {
    // params_all.json, ddrnet/ddrnet_23-slim_in1k-pre_2xb6-120k_cityscapes-1024x1024.py
    // and ddrnet/ddrnet_23_in1k-pre_2xb6-120k_cityscapes-1024x1024.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(slim(32)).0.total(), 5_620_576);
    assert_eq!(backbone(slim(64)).0.total(), 19_850_688);
}

#[test]
fn training_gives_the_spatial_copy_and_the_sum_at_one_eighth() {
    let (_, net) = backbone(slim(32));
    let outs = net.forward(&image(2, 128, 64), true);
    assert_eq!(shapes(&outs), [vec![2, 64, 16, 8], vec![2, 128, 16, 8]]);
    let outs = net.forward(&image(2, 128, 64), false);
    assert_eq!(shapes(&outs), [vec![2, 128, 16, 8]]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(slim(32), "with_cp", json!(true)));
    assert!(err.contains("`with_cp`"), "{err}");
}

#[test]
fn another_activation_is_refused_by_name() {
    let err = backbone_error(with_key(slim(32), "act_cfg", json!({"type": "GELU"})));
    assert!(err.contains("`act_cfg`"), "{err}");
}
