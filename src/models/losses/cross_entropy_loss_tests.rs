//! Unit tests of `cross_entropy_loss.rs`: the loss of a tiny input against
//! `F.cross_entropy` and mmseg's `weight_reduce_loss`, the settings, a
//! refused key.
use super::*;
use crate::models::component_config::test_support::dict;
use serde_json::json;
use tch::Device;

fn loss(j: serde_json::Value) -> CrossEntropyCfg {
    CrossEntropyCfg::from_cfg(&dict(j)).unwrap()
}

/// Two pixels of two classes with equal logits: each non-ignored pixel
/// costs ln 2.
fn even_logits() -> Tensor {
    Tensor::zeros([1, 2, 1, 2], (Kind::Float, Device::Cpu))
}

#[test]
fn the_mean_is_over_all_pixels_unless_avg_non_ignore() {
    let ln2 = std::f64::consts::LN_2;
    let eps = f32::EPSILON as f64;
    let label = Tensor::from_slice(&[0i64, 255]).view([1, 1, 2]);
    // MMSeg's default: the ignored pixel counts in the mean: ln 2 / 2.
    let ce = loss(json!({"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 0.4}));
    let got = ce
        .forward(&even_logits(), &label, None, 255)
        .double_value(&[]);
    assert!((got - 0.4 * ln2 / (2.0 + eps)).abs() < 1e-6, "{got}");
    // avg_non_ignore=True: over the one counted pixel.
    let ce = loss(json!({"type": "CrossEntropyLoss", "avg_non_ignore": true}));
    let got = ce
        .forward(&even_logits(), &label, None, 255)
        .double_value(&[]);
    assert!((got - ln2 / (1.0 + eps)).abs() < 1e-6, "{got}");
    // Per pixel (a sampler's call): 0 where ignored.
    let per_pixel = ce.per_pixel(&even_logits(), &label, 255);
    assert_eq!(per_pixel.size(), [1, 1, 2]);
    assert_eq!(per_pixel.double_value(&[0, 0, 1]), 0.0);
}

#[test]
fn class_weights_weigh_each_pixel_and_the_mean() {
    // Labels 1 and 0, class_weight [1, 3]: (3 ln 2 + ln 2) / (3 + 1) = ln 2.
    let ce = loss(json!({"type": "CrossEntropyLoss", "class_weight": [1.0, 3.0]}));
    let label = Tensor::from_slice(&[1i64, 0]).view([1, 1, 2]);
    let got = ce
        .forward(&even_logits(), &label, None, 255)
        .double_value(&[]);
    assert!((got - std::f64::consts::LN_2).abs() < 1e-5, "{got}");
}

#[test]
fn settings_are_read_with_mmsegs_defaults_and_unknown_keys_refused() {
    let ce = loss(json!({"type": "CrossEntropyLoss", "loss_name": "loss_aux"}));
    assert_eq!(
        ce,
        CrossEntropyCfg {
            loss_name: "loss_aux".into(),
            ..CrossEntropyCfg::default()
        }
    );
    let err = CrossEntropyCfg::from_cfg(&dict(
        json!({"type": "CrossEntropyLoss", "reduction": "sum"}),
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("`reduction`"), "{err}");
    let err = CrossEntropyCfg::from_cfg(&dict(
        json!({"type": "CrossEntropyLoss", "label_smoothing": 0.1}),
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("`label_smoothing`"), "{err}");
}

#[test]
fn the_sigmoid_loss_averages_over_classes_and_valid_pixels() {
    let ce = loss(json!({"type": "CrossEntropyLoss", "use_sigmoid": true, "loss_weight": 1}));
    // Zero logits: every class and pixel costs ln 2; the ignored pixel
    // counts in the mean with weight 0 (MMSeg's mean over all elements).
    let pred = Tensor::zeros([1, 3, 1, 2], (tch::Kind::Float, tch::Device::Cpu));
    let label = Tensor::from_slice(&[1i64, 255]).reshape([1, 1, 2]);
    let got = ce.forward(&pred, &label, None, 255).double_value(&[]);
    assert!((got - std::f64::consts::LN_2 / 2.0).abs() < 1e-5, "{got}");
}
