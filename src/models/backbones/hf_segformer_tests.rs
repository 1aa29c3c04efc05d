//! Unit tests of `hf_segformer.rs`: transformers' mit-b0 encoder against
//! MMSeg's MiT-B0 count, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// The encoder keys of nvidia/mit-b0's `config.json`, as `config::hf`
/// picks them (`SegformerConfig`'s defaults are mit-b0's too).
fn mit_b0() -> serde_json::Value {
    json!({
        "type": "SegformerModel",
        "num_channels": 3,
        "num_encoder_blocks": 4,
        "depths": [2, 2, 2, 2],
        "sr_ratios": [8, 4, 2, 1],
        "hidden_sizes": [32, 64, 160, 256],
        "patch_sizes": [7, 3, 3, 3],
        "strides": [4, 2, 2, 2],
        "num_attention_heads": [1, 2, 5, 8],
        "mlp_ratios": [4, 4, 4, 4],
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "drop_path_rate": 0.1,
        "layer_norm_eps": 1e-6,
        "initializer_range": 0.02,
        "with_cp": false,
    })
}

#[test]
fn mit_b0_has_the_parameter_count_of_mmsegs_mit_b0() {
    // The same layers as MMSeg's MiT, written differently (q/k/v linears
    // for nn.MultiheadAttention's in_proj, linears for 1x1 convs): the same
    // count. params_all.json,
    // segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(mit_b0()).0.total(), 3_319_392);
}

#[test]
fn the_outputs_are_the_four_stages_at_strides_4_to_32() {
    let (_, encoder) = backbone(mit_b0());
    assert_eq!(
        shapes(&encoder.forward(&image(1, 64, 64), true)),
        [
            vec![1, 32, 16, 16],
            vec![1, 64, 8, 8],
            vec![1, 160, 4, 4],
            vec![1, 256, 2, 2]
        ]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(mit_b0(), "use_mask_token", json!(true)));
    assert!(err.contains("`use_mask_token`"), "{err}");
}
