//! Unit tests of `mask2former_loss.rs`: instance targets of a label map,
//! the loss items of every layer on a tiny prediction, a refused key.
use super::*;
use crate::models::component_config::test_support::{dict, with_key};
use serde_json::json;
use tch::Device;

/// The loss keys of `model.decode_head` of
/// mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py
/// (resolved; tuples as lists), `loss_cls.class_weight` (too long for
/// `json!`) set apart: 1.0 for each of the 150 classes, 0.1 for no-object.
fn r50_ade_losses() -> serde_json::Value {
    let mut j = json!({
        "num_classes": 150,
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
    });
    let mut class_weight = vec![1.0; 150];
    class_weight.push(0.1);
    j["loss_cls"]["class_weight"] = json!(class_weight);
    j
}

fn loss_cfg(j: serde_json::Value) -> Result<Mask2FormerLossCfg, ModelError> {
    let d = dict(j);
    let mut c = ComponentConfig::new(
        &d,
        "Mask2FormerHead",
        "mmseg/models/decode_heads/mask2former_head.py",
    );
    let cfg = Mask2FormerLossCfg::from_head(&mut c, 150)?;
    c.inert(&["num_classes"]);
    c.finish()?;
    Ok(cfg)
}

fn loss() -> Mask2FormerLoss {
    Mask2FormerLoss::new(loss_cfg(r50_ade_losses()).unwrap(), 150, 255)
}

#[test]
fn the_settings_are_mmdets() {
    let cfg = loss_cfg(r50_ade_losses()).unwrap();
    // class_weight: 1.0 for each of 150 classes, 0.1 for no-object.
    assert_eq!(cfg.cls.class_weight.len(), 151);
    assert_eq!(cfg.cls.class_weight[150], 0.1);
    assert_eq!(
        (cfg.cls.weight, cfg.mask_weight, cfg.dice.weight),
        (2.0, 5.0, 5.0)
    );
    assert_eq!(cfg.num_points, 12_544);
}

#[test]
fn each_class_present_but_the_ignored_one_is_an_instance() {
    // Classes 3 (left half) and 7 (right half), a row ignored.
    let map = Tensor::full([1, 4, 4], 3i64, (Kind::Int64, Device::Cpu));
    let _ = map.narrow(2, 2, 2).fill_(7);
    let _ = map.narrow(1, 0, 1).fill_(255);
    let gts = loss().instance_targets(&[map]);
    assert_eq!(gts.len(), 1);
    assert_eq!(Vec::<i64>::try_from(&gts[0].labels).unwrap(), [3, 7]);
    assert_eq!(gts[0].masks.size(), [2, 4, 4]);
    // Class 3's mask: the left half below the ignored row, 3 * 2 pixels.
    assert_eq!(gts[0].masks.get(0).sum(Kind::Int64).int64_value(&[]), 6);
}

#[test]
fn every_layer_has_its_three_losses_the_last_unprefixed() {
    let map = Tensor::full([1, 8, 8], 5i64, (Kind::Int64, Device::Cpu));
    let gts = loss().instance_targets(&[map]);
    // Two layers' predictions of 10 queries: classes [1, 10, 151], masks
    // [1, 10, 4, 4] (a quarter of the labels' size).
    let cls: Vec<Tensor> = (0..2)
        .map(|_| Tensor::randn([1, 10, 151], (Kind::Float, Device::Cpu)))
        .collect();
    let masks: Vec<Tensor> = (0..2)
        .map(|_| Tensor::randn([1, 10, 4, 4], (Kind::Float, Device::Cpu)))
        .collect();
    let items = loss().loss_by_feat(&cls, &masks, &gts);
    let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "loss_cls",
            "loss_mask",
            "loss_dice",
            "d0.loss_cls",
            "d0.loss_mask",
            "d0.loss_dice"
        ]
    );
    for (name, value) in &items {
        let v = value.double_value(&[]);
        assert!(v.is_finite() && v >= 0.0, "{name} = {v}");
    }
}

#[test]
fn an_unknown_loss_key_is_refused_by_name() {
    let mut j = r50_ade_losses();
    j["loss_dice"] = with_key(j["loss_dice"].clone(), "smooth", json!(1.0));
    let err = loss_cfg(j).unwrap_err().to_string();
    assert!(err.contains("`smooth`"), "{err}");
}
