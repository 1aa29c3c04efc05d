//! Unit tests of `pixel_decoder.rs`: mmdet's MSDeformAttnPixelDecoder of
//! a real config (parameter count from its layers' definitions), one
//! forward's shapes, a refused key.
use super::*;
use crate::models::component_config::test_support::{dict, features, shapes, with_key};
use crate::models::params::ParamStore;
use serde_json::json;

/// `model.decode_head.pixel_decoder` of
/// mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn r50_ade() -> serde_json::Value {
    json!({
        "type": "mmdet.MSDeformAttnPixelDecoder",
        "num_outs": 3,
        "norm_cfg": {"type": "GN", "num_groups": 32},
        "act_cfg": {"type": "ReLU"},
        "encoder": {
            "num_layers": 6,
            "layer_cfg": {
                "self_attn_cfg": {
                    "embed_dims": 256,
                    "num_heads": 8,
                    "num_levels": 3,
                    "num_points": 4,
                    "im2col_step": 64,
                    "dropout": 0.0,
                    "batch_first": true,
                    "norm_cfg": null,
                    "init_cfg": null
                },
                "ffn_cfg": {
                    "embed_dims": 256,
                    "feedforward_channels": 1024,
                    "num_fcs": 2,
                    "ffn_drop": 0.0,
                    "act_cfg": {"type": "ReLU", "inplace": true}
                }
            },
            "init_cfg": null
        },
        "positional_encoding": {"num_feats": 128, "normalize": true},
        "init_cfg": null
    })
}

/// The decoder with the head's `in_channels` (ResNet-50's), feat_channels
/// and out_channels 256.
fn build(j: serde_json::Value) -> Result<(ParamStore, MsDeformAttnPixelDecoder), ModelError> {
    let cfg = PixelDecoderCfg::from_cfg(&dict(j), vec![256, 512, 1024, 2048], 256, 256)?;
    let mut store = ParamStore::new(tch::Device::Cpu);
    let decoder = MsDeformAttnPixelDecoder::new(&mut store.scope("decode_head.pixel_decoder"), cfg);
    Ok((store, decoder))
}

#[test]
fn r50_pixel_decoder_has_mmdets_parameter_count() {
    // input_convs (1x1 conv with bias + GN(32)) of 2048, 1024, 512 to 256:
    //   (2048 + 1024 + 512) * 256 + 3 * (256 + 512) = 919_808;
    // 6 encoder layers of MultiScaleDeformableAttention(256, 8 heads,
    //   3 levels, 4 points) 205_600 + FFN(256, 1024) 525_568 + 2 LNs 1_024:
    //   6 * 732_192 = 4_393_152;
    // level_encoding Embedding(3, 256): 768;
    // lateral_convs.0 (1x1, no bias, GN): 256 * 256 + 512 = 66_048;
    // output_convs.0 (3x3, no bias, GN): 256 * 256 * 9 + 512 = 590_336;
    // mask_feature Conv2d(256, 256, 1): 65_792.
    let (store, _) = build(r50_ade()).unwrap();
    assert_eq!(store.total(), 6_035_904);
}

#[test]
fn the_mask_features_are_at_stride_4_and_the_levels_from_the_coarsest() {
    let (_, decoder) = build(r50_ade()).unwrap();
    let inputs = features(1, &[(256, 16, 16), (512, 8, 8), (1024, 4, 4), (2048, 2, 2)]);
    let (mask_features, multi_scale) = decoder.forward(&inputs, true);
    assert_eq!(mask_features.size(), [1, 256, 16, 16]);
    assert_eq!(
        shapes(&multi_scale),
        [vec![1, 256, 2, 2], vec![1, 256, 4, 4], vec![1, 256, 8, 8]]
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = build(with_key(r50_ade(), "num_feature_levels", json!(3)))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("`num_feature_levels`"), "{err}");
}
