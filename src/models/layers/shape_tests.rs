//! Unit tests of `shape.rs`: the layout round trip, resizing, the
//! LayerNorm over channels.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind};

#[test]
fn nchw_and_nlc_round_trip() {
    let x = Tensor::randn([2, 8, 3, 5], (Kind::Float, Device::Cpu));
    let tokens = nchw_to_nlc(&x);
    assert_eq!(tokens.size(), [2, 15, 8]);
    let back = nlc_to_nchw(&tokens, (3, 5));
    assert_eq!((back - &x).abs().max().double_value(&[]), 0.0);
}

#[test]
fn resize_and_channel_norm_keep_what_they_should() {
    let x = Tensor::randn([2, 8, 3, 5], (Kind::Float, Device::Cpu));
    assert_eq!(resize_bilinear(&x, (6, 10), false).size(), [2, 8, 6, 10]);
    let mut store = ParamStore::new(Device::Cpu);
    let norm = LayerNorm::new(&mut store.scope("norm"), 8, 1e-6);
    let y = channel_layer_norm(&norm, &x);
    assert_eq!(y.size(), [2, 8, 3, 5]);
    // Normalised over the channels of each pixel.
    let mean = y.mean_dim(1, false, Kind::Float).abs().max();
    assert!(mean.double_value(&[]) < 1e-4);
}
