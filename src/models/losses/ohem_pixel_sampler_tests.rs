//! Unit tests of `ohem_pixel_sampler.rs`: the hard pixels of a tiny input
//! by probability threshold and by loss, the settings, a refused key.
use super::*;
use crate::models::component_config::test_support::to_value;
use crate::models::losses::CrossEntropyCfg;
use serde_json::json;

fn sampler(j: serde_json::Value) -> Result<Option<OhemPixelSampler>, ModelError> {
    OhemPixelSampler::from_cfg(Some(&to_value(&j)))
}

/// Four pixels of class 0 (the last ignored) whose class-0 logits against
/// a zero class 1 are 0, 2, -2, 0: probabilities 0.5, 0.88, 0.12 (and the
/// ignored one), losses 0.69, 0.13, 2.13.
fn logits_and_labels() -> (Tensor, Tensor) {
    let class0 = Tensor::from_slice(&[0.0f32, 2.0, -2.0, 0.0]);
    let logits =
        Tensor::stack(&[class0.shallow_clone(), class0.zeros_like()], 0).view([1, 2, 1, 4]);
    let labels = Tensor::from_slice(&[0i64, 0, 0, 255]).view([1, 1, 1, 4]);
    (logits, labels)
}

fn weights(s: &OhemPixelSampler) -> Vec<f32> {
    let (logits, labels) = logits_and_labels();
    let losses = [DecodeLoss::CrossEntropy(CrossEntropyCfg::default())];
    let w = s.sample(&logits, &labels, &losses, 255);
    assert_eq!(w.size(), [1, 1, 4]);
    Vec::try_from(w.flatten(0, -1)).unwrap()
}

#[test]
fn with_a_threshold_pixels_below_it_are_kept() {
    // min_kept 2 of 3 valid: the threshold is max(0.7, sorted[2] = 0.88);
    // kept: the probabilities below 0.88.
    let s = sampler(json!({"type": "OHEMPixelSampler", "thresh": 0.7, "min_kept": 2}))
        .unwrap()
        .unwrap();
    assert_eq!(weights(&s), [1.0, 0.0, 1.0, 0.0]);
}

#[test]
fn without_a_threshold_the_min_kept_highest_losses_are_kept() {
    let s = sampler(json!({"type": "OHEMPixelSampler", "min_kept": 2}))
        .unwrap()
        .unwrap();
    assert_eq!((s.thresh, s.min_kept), (None, 2));
    assert_eq!(weights(&s), [1.0, 0.0, 1.0, 0.0]);
}

#[test]
fn settings_are_checked_and_unknown_keys_refused() {
    assert_eq!(
        OhemPixelSampler::from_cfg(Some(&Value::None)).unwrap(),
        None
    );
    let s = sampler(json!({"type": "OHEMPixelSampler"}))
        .unwrap()
        .unwrap();
    assert_eq!(s.min_kept, 100_000);
    let err = sampler(json!({"type": "OHEMPixelSampler", "min_kept": 1}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("min_kept"), "{err}");
    let err = sampler(json!({"type": "OHEMPixelSampler", "top_k": 3}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`top_k`"), "{err}");
}
