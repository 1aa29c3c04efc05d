//! Unit tests of `hf_segformer_head.rs`: transformers' mit-b0 decode head
//! against MMSeg's SegformerHead count, one forward's shape, the loss
//! items, a refused key.
use crate::models::component_config::test_support::{features, head, head_error, shapes, with_key};
use serde_json::json;

/// The head keys of nvidia/mit-b0's `config.json` as `config::hf` picks
/// them, with 150 labels (ADE20K).
fn mit_b0_ade() -> serde_json::Value {
    json!({
        "type": "SegformerDecodeHead",
        "hidden_sizes": [32, 64, 160, 256],
        "decoder_hidden_size": 256,
        "classifier_dropout_prob": 0.1,
        "semantic_loss_ignore_index": 255,
        "num_labels": 150,
    })
}

#[test]
fn mit_b0_head_has_mmsegs_count_less_the_projections_norms_plus_their_biases() {
    // params_all.json, segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py:
    // params.by_prefix.decode_head.total = 434_326, MMSeg's SegformerHead,
    // whose 4 projections are 1x1 ConvModules (conv without bias + BN of
    // 256: 2 * 256 each); transformers' are Linear layers with a bias (256
    // each): 434_326 - 4 * 512 + 4 * 256 = 433_302.
    assert_eq!(head(mit_b0_ade(), "decode_head").0.total(), 433_302);
}

#[test]
fn the_head_classifies_at_a_quarter_of_the_image() {
    // mit-b0's hidden states of a 64x64 image, batch 2.
    let (_, h) = head(mit_b0_ade(), "decode_head");
    let inputs = features(2, &[(32, 16, 16), (64, 8, 8), (160, 4, 4), (256, 2, 2)]);
    assert_eq!(
        shapes(&[h.forward(&inputs, None, true)]),
        [[2, 150, 16, 16]]
    );
    // The batch's `labels`: one [B, H, W] tensor (the Trainer's `labels`).
    let batch_labels = [tch::Tensor::zeros(
        [2, 64, 64],
        (tch::Kind::Int64, tch::Device::Cpu),
    )];
    let items = h.loss(&inputs, None, &batch_labels);
    // transformers returns one `loss`, the cross-entropy of the upsampled logits.
    let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["loss"]);
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(mit_b0_ade(), "decoder_layers", json!(2)));
    assert!(err.contains("`decoder_layers`"), "{err}");
}
