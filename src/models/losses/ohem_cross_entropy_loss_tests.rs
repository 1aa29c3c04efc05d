//! Unit tests of `ohem_cross_entropy_loss.rs`: the settings read, the hard-pixel mean, refused keys.
use super::OhemCrossEntropyCfg;
use crate::models::component_config::test_support::dict;
use serde_json::json;
use tch::{Device, Kind, Reduction, Tensor};

fn loss(j: serde_json::Value) -> OhemCrossEntropyCfg {
    OhemCrossEntropyCfg::from_cfg(&dict(j)).unwrap()
}

#[test]
fn defaults_are_mmsegs() {
    let l = loss(json!({"type": "OhemCrossEntropy"}));
    assert_eq!((l.ignore_label, l.thresh, l.min_kept), (255, 0.7, 100_000));
    assert_eq!((l.loss_weight, l.loss_name.as_str()), (1.0, "loss_ohem"));
    assert_eq!(
        loss(json!({"type": "OhemCrossEntropy", "min_kept": 0})).min_kept,
        1
    );
}

#[test]
fn with_every_pixel_below_the_threshold_it_is_the_mean_cross_entropy() {
    // Uniform logits: every pixel's probability is 1/4 < 0.9.
    let score = Tensor::zeros([2, 4, 3, 5], (Kind::Float, Device::Cpu));
    let target = Tensor::randint(4, [2, 3, 5], (Kind::Int64, Device::Cpu));
    let l = loss(json!({"type": "OhemCrossEntropy", "thres": 0.9, "loss_weight": 0.5}));
    let expected = score.cross_entropy_loss(&target, None::<&Tensor>, Reduction::Mean, 255, 0.0);
    let got = l.forward(&score, &target).double_value(&[]);
    assert!(
        (got - 0.5 * expected.double_value(&[])).abs() < 1e-6,
        "{got}"
    );
}

#[test]
fn confident_pixels_above_the_threshold_are_left_out() {
    // Pixel 0 is predicted as its label with certainty, pixel 1 is not.
    let score = Tensor::from_slice(&[20.0f32, 0.0, 0.0, 0.0]).view([1, 2, 1, 2]);
    let target = Tensor::from_slice(&[0i64, 0]).view([1, 1, 2]);
    let l = loss(json!({"type": "OhemCrossEntropy", "thres": 0.7, "min_kept": 1}));
    let got = l.forward(&score, &target).double_value(&[]);
    assert!((got - 2f64.ln()).abs() < 1e-5, "{got}");
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err =
        OhemCrossEntropyCfg::from_cfg(&dict(json!({"type": "OhemCrossEntropy", "thresh": 0.9})))
            .unwrap_err()
            .to_string();
    assert!(err.contains("`thresh`"), "{err}");
}
