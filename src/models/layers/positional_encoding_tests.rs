//! Unit tests of `positional_encoding.rs`: the sine encoding's shape and
//! values against mmdet's formula, the grid of cell centres.
use super::*;

#[test]
fn the_sine_encoding_has_two_codes_per_pixel_from_the_formula() {
    // Mask2Former's SinePositionalEncoding(num_feats=128, normalize=True).
    let enc = SinePositionalEncoding::new(128, true);
    let mask = Tensor::zeros([2, 3, 4], (Kind::Bool, Device::Cpu));
    let pos = enc.forward(&mask);
    assert_eq!(pos.size(), [2, 256, 3, 4]);
    // Channel 0 is sin(y_embed / 10000^0) with y_embed = (row + 1) / (H +
    // eps) * 2 pi; channel 128 (the x half) is sin((col + 1) / (W + eps) * 2 pi).
    let y_arg = 1.0 / (3.0 + 1e-6) * 2.0 * std::f64::consts::PI;
    let x1 = (2.0 / (4.0 + 1e-6) * 2.0 * std::f64::consts::PI).sin();
    assert!((pos.double_value(&[0, 0, 0, 0]) - y_arg.sin()).abs() < 1e-5);
    assert!((pos.double_value(&[1, 128, 2, 1]) - x1).abs() < 1e-5);
    // Channel 1 is the cosine of the same argument (10000^(2 * (1 div 2) / 128) = 1).
    assert!((pos.double_value(&[0, 1, 0, 0]) - y_arg.cos()).abs() < 1e-5);
}

#[test]
fn grid_priors_are_cell_centres_row_major() {
    let grid = grid_priors(2, 3, 8, Device::Cpu);
    assert_eq!(grid.size(), [6, 2]);
    let values: Vec<f64> = Vec::try_from(grid.to_kind(Kind::Double).flatten(0, -1)).unwrap();
    assert_eq!(
        values,
        [4.0, 4.0, 12.0, 4.0, 20.0, 4.0, 4.0, 12.0, 12.0, 12.0, 20.0, 12.0]
    );
}
