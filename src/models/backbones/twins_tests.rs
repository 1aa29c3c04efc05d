//! Unit tests of `twins.rs`: the parameter counts of real configs' PCPVT and SVT, one forward's shapes each, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of twins/twins_pcpvt-s_fpn_fpnhead_8xb4-80k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn pcpvt_s() -> serde_json::Value {
    json!({
        "type": "PCPVT",
        "init_cfg": {
            "type": "Pretrained",
            "checkpoint": "https://download.openmmlab.com/mmsegmentation/v0.5/pretrain/twins/pcpvt_small_20220308-e638c41c.pth"
        },
        "in_channels": 3,
        "embed_dims": [64, 128, 320, 512],
        "num_heads": [1, 2, 5, 8],
        "patch_sizes": [4, 2, 2, 2],
        "strides": [4, 2, 2, 2],
        "mlp_ratios": [8, 8, 4, 4],
        "out_indices": [0, 1, 2, 3],
        "qkv_bias": true,
        "norm_cfg": {"type": "LN"},
        "depths": [3, 4, 6, 3],
        "sr_ratios": [8, 4, 2, 1],
        "norm_after_stage": false,
        "drop_rate": 0.0,
        "attn_drop_rate": 0.0,
        "drop_path_rate": 0.2
    })
}

/// `model.backbone` of twins/twins_svt-s_fpn_fpnhead_8xb4-80k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn svt_s() -> serde_json::Value {
    json!({
        "type": "SVT",
        "init_cfg": {
            "type": "Pretrained",
            "checkpoint": "https://download.openmmlab.com/mmsegmentation/v0.5/pretrain/twins/alt_gvt_small_20220308-7e1c3695.pth"
        },
        "in_channels": 3,
        "embed_dims": [64, 128, 256, 512],
        "num_heads": [2, 4, 8, 16],
        "patch_sizes": [4, 2, 2, 2],
        "strides": [4, 2, 2, 2],
        "mlp_ratios": [4, 4, 4, 4],
        "out_indices": [0, 1, 2, 3],
        "qkv_bias": true,
        "norm_cfg": {"type": "LN"},
        "depths": [2, 2, 10, 4],
        "sr_ratios": [8, 4, 2, 1],
        "norm_after_stage": true,
        "drop_rate": 0.0,
        "attn_drop_rate": 0.0,
        "drop_path_rate": 0.2,
        "windiow_sizes": [7, 7, 7, 7]
    })
}

#[test]
fn pcpvt_s_and_svt_s_have_mmsegs_parameter_counts() {
    // params_all.json, twins/twins_pcpvt-s_fpn_fpnhead_8xb4-80k_ade20k-512x512.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(pcpvt_s()).0.total(), 23_592_192);
    // params_all.json, twins/twins_svt-s_fpn_fpnhead_8xb4-80k_ade20k-512x512.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(svt_s()).0.total(), 23_548_672);
}

#[test]
fn the_outputs_are_the_four_stages_at_strides_4_to_32() {
    let (_, pcpvt) = backbone(pcpvt_s());
    assert_eq!(
        shapes(&pcpvt.forward(&image(1, 64, 64), true)),
        [
            vec![1, 64, 16, 16],
            vec![1, 128, 8, 8],
            vec![1, 320, 4, 4],
            vec![1, 512, 2, 2]
        ]
    );
    // SVT's local windows (7x7) pad the 16x16 and 8x8 maps.
    let (_, svt) = backbone(svt_s());
    assert_eq!(
        shapes(&svt.forward(&image(1, 64, 64), true)),
        [
            vec![1, 64, 16, 16],
            vec![1, 128, 8, 8],
            vec![1, 256, 4, 4],
            vec![1, 512, 2, 2]
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(svt_s(), "frozen_stages_typo", json!(1)));
    assert!(err.contains("`frozen_stages_typo`"), "{err}");
}
