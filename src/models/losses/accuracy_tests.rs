//! Unit tests of `accuracy.rs`: the top-1 accuracy of a tiny prediction
//! against mmseg's formula.
use super::*;

#[test]
fn accuracy_is_the_percentage_of_correct_non_ignored_pixels() {
    // 4 pixels, 2 classes; the argmax is 0, 1, 0, 1.
    let pred = Tensor::from_slice(&[2.0f32, -1.0, 3.0, 0.0, 0.0, 1.0, 0.0, 4.0]).view([1, 2, 1, 4]);
    // Targets 0, 1, 1 and one ignored pixel: 2 of 3 correct.
    let target = Tensor::from_slice(&[0i64, 1, 1, 255]).view([1, 1, 4]);
    let acc = accuracy(&pred, &target, 255);
    assert_eq!(acc.size(), [1]);
    // (2 + eps) * 100 / (3 + eps), eps = float32's epsilon.
    let eps = f32::EPSILON as f64;
    let want = (2.0 + eps) * 100.0 / (3.0 + eps);
    assert!((acc.double_value(&[0]) - want).abs() < 1e-4);
}
