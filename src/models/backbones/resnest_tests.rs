//! Unit tests of `resnest.rs`: ResNeSt's split-attention bottleneck, through a real config's backbone: its parameter count, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of resnest/resnest_s101-d8_deeplabv3_4xb2-80k_cityscapes-512x1024.py
/// (resolved; tuples as lists).
fn s101_d8() -> serde_json::Value {
    json!({
        "type": "ResNeSt",
        "depth": 101,
        "num_stages": 4,
        "out_indices": [0, 1, 2, 3],
        "dilations": [1, 1, 2, 4],
        "strides": [1, 2, 1, 1],
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "norm_eval": false,
        "style": "pytorch",
        "contract_dilation": true,
        "stem_channels": 128,
        "radix": 2,
        "reduction_factor": 4,
        "avg_down_stride": true
    })
}

#[test]
fn resnest_s101_d8_has_mmsegs_parameter_count() {
    // params_all.json, resnest/resnest_s101-d8_deeplabv3_4xb2-80k_cityscapes-512x1024.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(s101_d8()).0.total(), 46_226_016);
}

#[test]
fn a_d8_resnest_keeps_an_eighth_of_the_resolution() {
    let (_, net) = backbone(s101_d8());
    let outs = net.forward(&image(2, 64, 64), true);
    assert_eq!(
        shapes(&outs),
        [
            vec![2, 256, 16, 16],
            vec![2, 512, 8, 8],
            vec![2, 1024, 8, 8],
            vec![2, 2048, 8, 8]
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(s101_d8(), "radix_typo", json!(1)));
    assert!(err.contains("`radix_typo`"), "{err}");
}
