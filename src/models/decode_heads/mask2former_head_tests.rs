//! Unit tests of `mask2former_head.rs`: the parameter count of a real
//! config's head, one forward's shape, the loss items of every decoder
//! layer, a refused key.
use crate::models::component_config::test_support::{
    features, head, head_error, labels, shapes, with_key,
};
use serde_json::json;

/// Its `pixel_decoder` (mmdet's MSDeformAttnPixelDecoder).
fn r50_ade_pixel_decoder() -> serde_json::Value {
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

/// `model.decode_head` of mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py
/// (resolved; tuples as lists),
/// but `loss_cls.class_weight`, too long for `json!`.
fn r50_ade_without_class_weight() -> serde_json::Value {
    json!({
        "type": "Mask2FormerHead",
        "in_channels": [256, 512, 1024, 2048],
        "strides": [4, 8, 16, 32],
        "feat_channels": 256,
        "out_channels": 256,
        "num_classes": 150,
        "num_queries": 100,
        "num_transformer_feat_level": 3,
        "align_corners": false,
        "pixel_decoder": r50_ade_pixel_decoder(),
        "enforce_decoder_input_project": false,
        "positional_encoding": {"num_feats": 128, "normalize": true},
        "transformer_decoder": {
            "return_intermediate": true,
            "num_layers": 9,
            "layer_cfg": {
                "self_attn_cfg": {
                    "embed_dims": 256,
                    "num_heads": 8,
                    "attn_drop": 0.0,
                    "proj_drop": 0.0,
                    "dropout_layer": null,
                    "batch_first": true
                },
                "cross_attn_cfg": {
                    "embed_dims": 256,
                    "num_heads": 8,
                    "attn_drop": 0.0,
                    "proj_drop": 0.0,
                    "dropout_layer": null,
                    "batch_first": true
                },
                "ffn_cfg": {
                    "embed_dims": 256,
                    "feedforward_channels": 2048,
                    "num_fcs": 2,
                    "act_cfg": {"type": "ReLU", "inplace": true},
                    "ffn_drop": 0.0,
                    "dropout_layer": null,
                    "add_identity": true
                }
            },
            "init_cfg": null
        },
        "loss_cls": {
            "type": "mmdet.CrossEntropyLoss",
            "use_sigmoid": false,
            "loss_weight": 2.0,
            "reduction": "mean"
        },
        "loss_mask": {
            "type": "mmdet.CrossEntropyLoss",
            "use_sigmoid": true,
            "reduction": "mean",
            "loss_weight": 5.0
        },
        "loss_dice": {
            "type": "mmdet.DiceLoss",
            "use_sigmoid": true,
            "activate": true,
            "reduction": "mean",
            "naive_dice": true,
            "eps": 1.0,
            "loss_weight": 5.0
        },
        "train_cfg": {
            "num_points": 12544,
            "oversample_ratio": 3.0,
            "importance_sample_ratio": 0.75,
            "assigner": {
                "type": "mmdet.HungarianAssigner",
                "match_costs": [
                    {"type": "mmdet.ClassificationCost", "weight": 2.0},
                    {
                        "type": "mmdet.CrossEntropyLossCost",
                        "weight": 5.0,
                        "use_sigmoid": true
                    },
                    {
                        "type": "mmdet.DiceCost",
                        "weight": 5.0,
                        "pred_act": true,
                        "eps": 1.0
                    }
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
fn mask2former_r50_head_has_mmsegs_parameter_count() {
    // params_all.json, mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py:
    // params.by_prefix.decode_head.total
    assert_eq!(head(r50_ade(), "decode_head").0.total(), 20_533_335);
}

#[test]
fn the_scores_are_at_the_mask_features_resolution() {
    let (_, h) = head(r50_ade(), "decode_head");
    let inputs = features(1, &R50_64X64);
    // Mask features at stride 4; one score per class (no-object dropped).
    assert_eq!(
        shapes(&[h.forward(&inputs, None, true)]),
        [[1, 150, 16, 16]]
    );
}

#[test]
fn the_loss_has_three_items_per_decoder_layer_last_first() {
    let (_, h) = head(r50_ade(), "decode_head");
    let inputs = features(1, &R50_64X64);
    let items = h.loss(&inputs, None, &labels(1, 64, 64));
    let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
    // The last layer's, then d0 (the queries' own prediction) to d8.
    assert_eq!(names.len(), 3 * 10);
    assert_eq!(
        &names[..4],
        ["loss_cls", "loss_mask", "loss_dice", "d0.loss_cls"]
    );
    assert_eq!(names[29], "d8.loss_dice");
    assert!(items.iter().all(|(_, v)| v.numel() == 1));
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(r50_ade(), "num_decoder_layers", json!(6)));
    assert!(err.contains("`num_decoder_layers`"), "{err}");
}
