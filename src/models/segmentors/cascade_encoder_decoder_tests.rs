//! Unit tests of `cascade_encoder_decoder.rs`: OCRNet's cascade of a real
//! config (parameter count, the loss items of each stage), refused
//! `num_stages` and keys.
use super::*;
use crate::models::component_config::test_support::{dict, with_key};
use crate::models::segmentors::encoder_decoder::EncoderDecoder;
use serde_json::json;
use tch::{Device, Kind};

/// `model` of ocrnet/ocrnet_hr18s_4xb2-40k_cityscapes-512x1024.py
/// (resolved; tuples as lists), its preprocessor's `size` cut to 64x64
/// and `pretrained` (weights only) dropped.
fn ocrnet_hr18s() -> serde_json::Value {
    json!({
        "type": "CascadeEncoderDecoder",
        "data_preprocessor": {
            "type": "SegDataPreProcessor",
            "mean": [123.675, 116.28, 103.53],
            "std": [58.395, 57.12, 57.375],
            "bgr_to_rgb": true,
            "pad_val": 0,
            "seg_pad_val": 255,
            "size": [64, 64]
        },
        "num_stages": 2,
        "backbone": {
            "type": "HRNet",
            "norm_cfg": {"type": "SyncBN", "requires_grad": true},
            "norm_eval": false,
            "extra": {
                "stage1": {
                    "num_modules": 1,
                    "num_branches": 1,
                    "block": "BOTTLENECK",
                    "num_blocks": [2],
                    "num_channels": [64]
                },
                "stage2": {
                    "num_modules": 1,
                    "num_branches": 2,
                    "block": "BASIC",
                    "num_blocks": [2, 2],
                    "num_channels": [18, 36]
                },
                "stage3": {
                    "num_modules": 3,
                    "num_branches": 3,
                    "block": "BASIC",
                    "num_blocks": [2, 2, 2],
                    "num_channels": [18, 36, 72]
                },
                "stage4": {
                    "num_modules": 2,
                    "num_branches": 4,
                    "block": "BASIC",
                    "num_blocks": [2, 2, 2, 2],
                    "num_channels": [18, 36, 72, 144]
                }
            }
        },
        "decode_head": [
            {
                "type": "FCNHead",
                "in_channels": [18, 36, 72, 144],
                "channels": 270,
                "in_index": [0, 1, 2, 3],
                "input_transform": "resize_concat",
                "kernel_size": 1,
                "num_convs": 1,
                "concat_input": false,
                "dropout_ratio": -1,
                "num_classes": 19,
                "norm_cfg": {"type": "SyncBN", "requires_grad": true},
                "align_corners": false,
                "loss_decode": {
                    "type": "CrossEntropyLoss",
                    "use_sigmoid": false,
                    "loss_weight": 0.4
                }
            },
            {
                "type": "OCRHead",
                "in_channels": [18, 36, 72, 144],
                "in_index": [0, 1, 2, 3],
                "input_transform": "resize_concat",
                "channels": 512,
                "ocr_channels": 256,
                "dropout_ratio": -1,
                "num_classes": 19,
                "norm_cfg": {"type": "SyncBN", "requires_grad": true},
                "align_corners": false,
                "loss_decode": {
                    "type": "CrossEntropyLoss",
                    "use_sigmoid": false,
                    "loss_weight": 1.0
                }
            }
        ],
        "train_cfg": {},
        "test_cfg": {"mode": "whole"}
    })
}

fn config(model: serde_json::Value) -> Dict {
    dict(json!({"model": model}))
}

#[test]
fn ocrnet_hr18s_has_mmsegs_parameter_count_and_stage_items() {
    let model = EncoderDecoder::build(&config(ocrnet_hr18s()), Device::Cpu).unwrap();
    // params_all.json, ocrnet/ocrnet_hr18s_4xb2-40k_cityscapes-512x1024.py:
    // params.total, by_prefix.backbone and by_prefix.decode_head
    assert_eq!(model.params.total(), 6_378_496);
    assert_eq!(
        model.params.by_prefix(),
        [
            ("backbone".to_string(), 3_860_720, 3_860_720),
            ("decode_head".to_string(), 2_517_776, 2_517_776),
        ]
    );
    let images: Vec<Tensor> = (0..2)
        .map(|_| Tensor::zeros([3, 64, 64], (Kind::Uint8, Device::Cpu)))
        .collect();
    let labels: Vec<Tensor> = (0..2)
        .map(|_| Tensor::zeros([1, 64, 64], (Kind::Int64, Device::Cpu)))
        .collect();
    let (inputs, padded) = model.preprocess(&images, &labels);
    let names: Vec<String> = model
        .loss(&inputs, &padded)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "decode_0.loss_ce",
            "decode_0.acc_seg",
            "decode_1.loss_ce",
            "decode_1.acc_seg"
        ]
    );
}

#[test]
fn num_stages_must_match_the_heads_and_unknown_keys_are_refused() {
    let model = dict(with_key(ocrnet_hr18s(), "num_stages", json!(3)));
    let err = read_cfg(&model).err().unwrap().to_string();
    assert!(err.contains("num_stages"), "{err}");
    let mut j = ocrnet_hr18s();
    j.as_object_mut().unwrap().remove("num_stages");
    let model = dict(j);
    let err = read_cfg(&model).err().unwrap().to_string();
    assert!(err.contains("num_stages"), "{err}");
    let model = dict(with_key(ocrnet_hr18s(), "auxiliary_heads", json!([])));
    let err = read_cfg(&model).err().unwrap().to_string();
    assert!(err.contains("`auxiliary_heads`"), "{err}");
}
