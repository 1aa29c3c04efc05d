//! Unit tests of `decode_head.rs`: BaseDecodeHead's settings, its input
//! selection, `conv_seg`'s parameters, the loss items, a refused key.
use super::*;
use crate::models::component_config::test_support::{dict, features, labels, shapes};
use crate::models::params::ParamStore;
use serde_json::json;

/// BaseDecodeHead's keys of an FCN auxiliary head
/// (fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024.py, resolved), with `extra`.
fn head_cfg(extra: serde_json::Value) -> crate::config::Dict {
    let mut j = json!({
        "type": "FCNHead",
        "in_channels": 1024,
        "in_index": 2,
        "channels": 256,
        "dropout_ratio": 0.1,
        "num_classes": 19,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 0.4},
    });
    j.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    dict(j)
}

fn read(
    d: &crate::config::Dict,
    fixed: Option<InputTransform>,
) -> Result<DecodeHeadCfg, ModelError> {
    let mut c = ComponentConfig::new(d, "FCNHead", "mmseg/models/decode_heads/fcn_head.py");
    let cfg = DecodeHeadCfg::from_cfg(&mut c, fixed)?;
    c.finish()?;
    Ok(cfg)
}

#[test]
fn the_settings_take_mmsegs_defaults() {
    let cfg = read(&head_cfg(json!({})), None).unwrap();
    assert_eq!(cfg.in_channels, [1024]);
    assert_eq!(cfg.in_index, [2]);
    assert_eq!(cfg.input_transform, InputTransform::Single);
    assert_eq!((cfg.channels, cfg.num_classes), (256, 19));
    // BaseDecodeHead's defaults: ignore_index=255, no sampler.
    assert_eq!(cfg.ignore_index, 255);
    assert!(cfg.sampler.is_none());
    assert_eq!(cfg.losses.len(), 1);
    assert_eq!(cfg.losses[0].loss_name(), "loss_ce");
}

#[test]
fn conv_seg_has_channels_times_classes_weights_and_a_bias() {
    // Conv2d(channels=256, num_classes=19, 1): 256 * 19 + 19 = 4_883.
    let mut store = ParamStore::new(tch::Device::Cpu);
    let cfg = read(&head_cfg(json!({})), None).unwrap();
    let _base = DecodeHeadBase::new(&mut store.scope("auxiliary_head"), cfg);
    assert_eq!(store.total(), 4_883);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "auxiliary_head.conv_seg.weight",
            "auxiliary_head.conv_seg.bias"
        ]
    );
}

#[test]
fn resize_concat_resizes_to_the_first_map_and_concatenates() {
    let d = head_cfg(json!({
        "input_transform": "resize_concat",
        "in_channels": [256, 512, 1024],
        "in_index": [0, 1, -2],
    }));
    let base = DecodeHeadBase::without_conv_seg(read(&d, None).unwrap());
    let inputs = features(2, &[(256, 16, 16), (512, 8, 8), (1024, 4, 4), (2048, 2, 2)]);
    // in_index -2 counts from the end, as Python's does: the 1024 map.
    assert_eq!(base.selected_inputs(&inputs)[2].size(), [2, 1024, 4, 4]);
    assert_eq!(
        shapes(&[base.transform_inputs(&inputs)]),
        [[2, 256 + 512 + 1024, 16, 16]]
    );
}

#[test]
fn the_loss_items_follow_loss_decode_then_accuracy() {
    let d = head_cfg(json!({"loss_decode": [
        {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
        {"type": "DiceLoss", "loss_weight": 3.0},
    ]}));
    let mut store = ParamStore::new(tch::Device::Cpu);
    let base = DecodeHeadBase::new(&mut store.scope("decode_head"), read(&d, None).unwrap());
    let logits = tch::Tensor::randn([2, 19, 8, 8], (tch::Kind::Float, tch::Device::Cpu));
    let items = base.loss_by_feat(&logits, &labels(2, 32, 32));
    let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["loss_ce", "loss_dice", "acc_seg"]);
    assert!(items.iter().all(|(_, v)| v.dim() <= 1));
}

#[test]
fn an_input_transform_the_head_fixes_and_unknown_keys_are_refused() {
    let d = head_cfg(json!({"input_transform": "multiple_select"}));
    let err = read(&d, Some(InputTransform::MultipleSelect))
        .unwrap_err()
        .to_string();
    assert!(err.contains("input_transform"), "{err}");
    let err = read(&head_cfg(json!({"num_classes_typo": 3})), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`num_classes_typo`"), "{err}");
}
