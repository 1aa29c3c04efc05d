//! Unit tests of `maskformer_head.rs`: the parameter counts of real
//! configs' heads, one forward's shape, the loss items of every decoder
//! layer, refused keys.
use crate::models::component_config::test_support::{
    features, head, head_error, labels, shapes, with_key,
};
use serde_json::json;

/// mmcv's `MultiheadAttention` config of both DETR attentions.
fn attention() -> serde_json::Value {
    json!({
        "embed_dims": 256,
        "num_heads": 8,
        "attn_drop": 0.1,
        "proj_drop": 0.1,
        "dropout_layer": null,
        "batch_first": true
    })
}

/// `model.decode_head` of maskformer/maskformer_r50-d32_8xb2-160k_ade20k-512x512.py
/// (resolved; tuples as lists), but `loss_cls.class_weight`, too long for
/// `json!`.
fn r50_ade_without_class_weight() -> serde_json::Value {
    json!({
        "type": "MaskFormerHead",
        "in_channels": [256, 512, 1024, 2048],
        "feat_channels": 256,
        "in_index": [0, 1, 2, 3],
        "num_classes": 150,
        "out_channels": 256,
        "num_queries": 100,
        "pixel_decoder": {
            "type": "mmdet.PixelDecoder",
            "norm_cfg": {"type": "GN", "num_groups": 32},
            "act_cfg": {"type": "ReLU"}
        },
        "enforce_decoder_input_project": false,
        "positional_encoding": {"num_feats": 128, "normalize": true},
        "transformer_decoder": {
            "return_intermediate": true,
            "num_layers": 6,
            "layer_cfg": {
                "self_attn_cfg": attention(),
                "cross_attn_cfg": attention(),
                "ffn_cfg": {
                    "embed_dims": 256,
                    "feedforward_channels": 2048,
                    "num_fcs": 2,
                    "act_cfg": {"type": "ReLU", "inplace": true},
                    "ffn_drop": 0.1,
                    "dropout_layer": null,
                    "add_identity": true
                }
            },
            "init_cfg": null
        },
        "loss_cls": {
            "type": "mmdet.CrossEntropyLoss",
            "use_sigmoid": false,
            "loss_weight": 1.0,
            "reduction": "mean"
        },
        "loss_mask": {
            "type": "mmdet.FocalLoss",
            "use_sigmoid": true,
            "gamma": 2.0,
            "alpha": 0.25,
            "reduction": "mean",
            "loss_weight": 20.0
        },
        "loss_dice": {
            "type": "mmdet.DiceLoss",
            "use_sigmoid": true,
            "activate": true,
            "reduction": "mean",
            "naive_dice": true,
            "eps": 1.0,
            "loss_weight": 1.0
        },
        "train_cfg": {
            "assigner": {
                "type": "mmdet.HungarianAssigner",
                "match_costs": [
                    {"type": "mmdet.ClassificationCost", "weight": 1.0},
                    {"type": "mmdet.FocalLossCost", "weight": 20.0, "binary_input": true},
                    {"type": "mmdet.DiceCost", "weight": 1.0, "pred_act": true, "eps": 1.0}
                ]
            },
            "sampler": {"type": "mmdet.MaskPseudoSampler"}
        }
    })
}

/// The whole `model.decode_head`: `loss_cls.class_weight` is 1.0 for each
/// of the 150 classes, 0.1 for no-object.
fn r50_ade() -> serde_json::Value {
    let mut j = r50_ade_without_class_weight();
    let mut class_weight = vec![1.0; 150];
    class_weight.push(0.1);
    j["loss_cls"]["class_weight"] = json!(class_weight);
    j
}

/// ResNet-50's maps of a 64x64 image (strides 4 to 32).
const R50_64X64: [(i64, i64, i64); 4] = [(256, 16, 16), (512, 8, 8), (1024, 4, 4), (2048, 2, 2)];

#[test]
fn maskformer_r50_head_has_mmsegs_parameter_count() {
    // params_all.json, maskformer/maskformer_r50-d32_8xb2-160k_ade20k-512x512.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(r50_ade(), "decode_head").0.total(), 17_799_831);
}

#[test]
fn maskformer_swin_t_head_has_mmsegs_parameter_count() {
    // maskformer_swin-t_upernet_8xb2-160k_ade20k-512x512.py: Swin-T's channels.
    let j = with_key(r50_ade(), "in_channels", json!([96, 192, 384, 768]));
    assert_eq!(head(j, "decode_head").0.total(), 14_236_311);
}

#[test]
fn the_scores_are_at_the_mask_features_resolution() {
    let (_, h) = head(r50_ade(), "decode_head");
    let inputs = features(1, &R50_64X64);
    assert_eq!(
        shapes(&[h.forward(&inputs, None, true)]),
        [[1, 150, 16, 16]]
    );
}

#[test]
fn the_loss_has_three_items_per_decoder_layer_last_first() {
    let (_, h) = head(r50_ade(), "decode_head");
    let inputs = features(2, &R50_64X64);
    let items = h.loss(&inputs, None, &labels(2, 64, 64));
    let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 3 * 6);
    assert_eq!(
        &names[..4],
        ["loss_cls", "loss_mask", "loss_dice", "d0.loss_cls"]
    );
    assert_eq!(names[17], "d4.loss_dice");
    assert!(items.iter().all(|(_, v)| v.numel() == 1));
    assert!(items.iter().all(|(_, v)| v.double_value(&[]).is_finite()));
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(r50_ade(), "num_decoder_layers", json!(6)));
    assert!(err.contains("`num_decoder_layers`"), "{err}");
}

#[test]
fn the_transformer_encoder_pixel_decoder_is_refused_by_name() {
    let j = with_key(
        r50_ade(),
        "pixel_decoder",
        json!({"type": "mmdet.TransformerEncoderPixelDecoder"}),
    );
    let err = head_error(j);
    assert!(err.contains("TransformerEncoderPixelDecoder"), "{err}");
}
