//! Unit tests of `dpt_head.rs`: the parameter count of a real config's
//! decode head, one forward's shape on ViT pairs, refused settings.
use crate::models::component_config::test_support::{head, head_error, shapes, with_key};
use serde_json::json;
use tch::{Device, Kind, Tensor};

/// `model.decode_head` of dpt/dpt_vit-b16_8xb2-160k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn dpt_vit_b16() -> serde_json::Value {
    json!({
        "type": "DPTHead", "in_channels": [768, 768, 768, 768], "channels": 256,
        "embed_dims": 768, "post_process_channels": [96, 192, 384, 768],
        "num_classes": 150, "readout_type": "project",
        "input_transform": "multiple_select", "in_index": [0, 1, 2, 3],
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0}
    })
}

/// Four `[map, cls_token]` pairs of a ViT-B on a `16 * hw` square crop, flat.
fn vit_pairs(batch: i64, hw: i64) -> Vec<Tensor> {
    (0..4)
        .flat_map(|_| {
            [
                Tensor::randn([batch, 768, hw, hw], (Kind::Float, Device::Cpu)),
                Tensor::randn([batch, 768], (Kind::Float, Device::Cpu)),
            ]
        })
        .collect()
}

#[test]
fn dpt_vit_b16_has_mmsegs_parameter_count() {
    // params_all.json, dpt/dpt_vit-b16_8xb2-160k_ade20k-512x512.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(dpt_vit_b16(), "decode_head").0.total(), 23_907_926);
}

#[test]
fn the_head_classifies_at_half_the_input_resolution() {
    // A 64x64 crop: 4x4 patch maps; the finest level is 16x16, fused and
    // upsampled once more to 32x32.
    for readout in ["project", "add", "ignore"] {
        let cfg = with_key(dpt_vit_b16(), "readout_type", json!(readout));
        let (_, h) = head(cfg, "decode_head");
        let logits = h.forward(&vit_pairs(2, 4), None, true);
        assert_eq!(shapes(&[logits]), [[2, 150, 32, 32]], "{readout}");
    }
}

#[test]
#[should_panic(expected = "output_cls_token=True")]
fn maps_without_class_tokens_are_refused() {
    let (_, h) = head(dpt_vit_b16(), "decode_head");
    let maps: Vec<Tensor> = vit_pairs(1, 4).into_iter().step_by(2).collect();
    let _ = h.forward(&maps, None, true);
}

#[test]
fn settings_segtune_does_not_build_are_refused_by_name() {
    let err = head_error(with_key(dpt_vit_b16(), "expand_channels", json!(true)));
    assert!(err.contains("`expand_channels`"), "{err}");
    let err = head_error(with_key(dpt_vit_b16(), "readout_type", json!("concat")));
    assert!(err.contains("readout_type"), "{err}");
    let err = head_error(with_key(
        dpt_vit_b16(),
        "post_process_channels",
        json!([96, 192, 384]),
    ));
    assert!(err.contains("four post_process_channels"), "{err}");
}
