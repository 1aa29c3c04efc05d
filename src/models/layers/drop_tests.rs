//! Unit tests of `drop.rs`: DropPath and dropout as identities where
//! PyTorch's are, the drop path rates of `torch.linspace`.
use super::*;
use tch::{Device, Kind};

#[test]
fn drop_path_and_dropout_pass_through_in_eval_and_at_zero() {
    let x = Tensor::randn([4, 3, 2], (Kind::Float, Device::Cpu));
    let same = |y: Tensor| (y - &x).abs().max().double_value(&[]) == 0.0;
    assert!(same(DropPath { prob: 0.3 }.forward(&x, false)));
    assert!(same(DropPath { prob: 0.0 }.forward(&x, true)));
    assert!(same(dropout(&x, 0.5, false)));
    assert!(same(dropout(&x, 0.0, true)));
}

#[test]
fn drop_path_zeroes_whole_samples_and_rescales_the_rest() {
    let x = Tensor::ones([64, 8], (Kind::Float, Device::Cpu));
    let y = DropPath { prob: 0.5 }.forward(&x, true);
    // Each sample is all 0 or all 1 / keep = 2.
    let row_min = y.amin(&[1i64][..], false);
    let row_max = y.amax(&[1i64][..], false);
    assert_eq!(
        Vec::<f32>::try_from(&row_min).unwrap(),
        Vec::<f32>::try_from(&row_max).unwrap()
    );
    let values: Vec<f32> = Vec::try_from(row_max).unwrap();
    assert!(values.iter().all(|v| *v == 0.0 || *v == 2.0));
}

#[test]
fn drop_path_rates_are_torch_linspace_in_float32() {
    // torch.linspace(0, 0.1, 5): 0, 0.025, 0.05, 0.075, 0.1 (as float32).
    let rates = linspace_drop_path_rates(0.1, 5);
    let expected: Vec<f64> = [0.0f32, 0.025, 0.05, 0.075, 0.1]
        .iter()
        .map(|r| *r as f64)
        .collect();
    assert_eq!(rates, expected);
    assert_eq!(linspace_drop_path_rates(0.3, 1), [0.0]);
}
