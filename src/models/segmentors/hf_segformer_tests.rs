//! Unit tests of `hf_segformer.rs`: transformers' mit-b0
//! `SegformerForSemanticSegmentation` built as the EncoderDecoder it
//! amounts to (parameters under `segformer` and `decode_head`), its
//! registry row.
use super::*;
use crate::models::component_config::test_support::dict;
use crate::models::segmentors::encoder_decoder::EncoderDecoder;
use serde_json::json;

/// The `model` `config::hf` makes of nvidia/mit-b0's `config.json` with 150
/// labels.
fn mit_b0_ade() -> serde_json::Value {
    json!({
        "type": TYPE,
        "data_preprocessor": {"type": "PixelValues"},
        "backbone": {
            "type": "SegformerModel",
            "num_encoder_blocks": 4,
            "depths": [2, 2, 2, 2],
            "sr_ratios": [8, 4, 2, 1],
            "hidden_sizes": [32, 64, 160, 256],
            "num_attention_heads": [1, 2, 5, 8],
            "with_cp": false,
        },
        "decode_head": {
            "type": "SegformerDecodeHead",
            "hidden_sizes": [32, 64, 160, 256],
            "decoder_hidden_size": 256,
            "num_labels": 150,
        },
    })
}

#[test]
fn mit_b0_has_the_encoders_and_the_heads_parameters_under_transformers_names() {
    let model =
        EncoderDecoder::build(&dict(json!({"model": mit_b0_ade()})), tch::Device::Cpu).unwrap();
    // The encoder: MMSeg's MiT-B0 count (params_all.json,
    // segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py:
    // by_prefix.backbone.total); the head: MMSeg's 434_326 less its
    // projections' 4 BNs (4 * 512) plus their Linear biases (4 * 256).
    let by_prefix: Vec<(String, i64)> = model
        .params
        .by_prefix()
        .into_iter()
        .map(|(prefix, total, _)| (prefix, total))
        .collect();
    assert_eq!(
        by_prefix,
        [
            ("segformer".to_string(), 3_319_392),
            ("decode_head".to_string(), 433_302)
        ]
    );
}

#[test]
fn the_type_is_registered_with_the_encoder_decoders_check() {
    assert_eq!(TYPE, "SegformerForSemanticSegmentation");
    let check =
        crate::models::registry::lookup(super::super::SEGMENTORS, "segmentor", TYPE).unwrap();
    check(&dict(mit_b0_ade())).unwrap();
}
