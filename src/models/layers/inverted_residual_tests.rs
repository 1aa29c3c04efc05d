//! Unit tests of `inverted_residual.rs`: MMSeg's rounding, the SE layer's
//! parameters, 'same' padding's shapes and the V3 block's names.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind};

#[test]
fn make_divisible_rounds_as_mmseg() {
    assert_eq!(make_divisible(32.0, 8), 32);
    assert_eq!(make_divisible(16.0 * 0.5, 8), 8);
    assert_eq!(make_divisible(24.0 * 0.75, 8), 24);
    assert_eq!(make_divisible(320.0 * 1.4, 8), 448);
    // SELayer's squeeze: make_divisible(channels // 4, 8).
    assert_eq!(make_divisible((16 / 4) as f64, 8), 8);
    assert_eq!(make_divisible((96 / 4) as f64, 8), 24);
    assert_eq!(make_divisible((120 / 4) as f64, 8), 32);
}

#[test]
fn adaptive_padding_halves_odd_and_even_sizes_as_tensorflow() {
    let mut store = ParamStore::new(Device::Cpu);
    let spec = ConvSpec::new(3, 4, 3).stride(2);
    let conv = ConvAct::adaptive(&mut store.scope("c"), spec, Some(NormCfg::BN_DEFAULT), None);
    for (size, out) in [(16, 8), (15, 8), (7, 4)] {
        let x = Tensor::randn([2, 3, size, size], (Kind::Float, Device::Cpu));
        assert_eq!(conv.forward(&x, true).size(), [2, 4, out, out]);
    }
    // A bias-free conv (norm) and a BN.
    assert_eq!(store.total(), 3 * 4 * 9 + 8);
}

#[test]
fn the_block_registers_mmsegs_names_in_order() {
    let mut store = ParamStore::new(Device::Cpu);
    let spec = InvertedResidualV3Spec {
        in_channels: 16,
        out_channels: 16,
        mid_channels: 64,
        kernel_size: 5,
        stride: 1,
        with_se: true,
        with_expand_conv: true,
        act: Activation::HSwish,
        norm: Some(NormCfg::BN_DEFAULT),
        depthwise: DepthwiseGeometry {
            stride: 1,
            dilation: 2,
            padding: 4,
        },
    };
    let block = InvertedResidualV3::new(&mut store.scope("layer1"), &spec);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "layer1.expand_conv.conv.weight",
            "layer1.expand_conv.bn.weight",
            "layer1.expand_conv.bn.bias",
            "layer1.depthwise_conv.conv.weight",
            "layer1.depthwise_conv.bn.weight",
            "layer1.depthwise_conv.bn.bias",
            "layer1.se.conv1.conv.weight",
            "layer1.se.conv1.conv.bias",
            "layer1.se.conv2.conv.weight",
            "layer1.se.conv2.conv.bias",
            "layer1.linear_conv.conv.weight",
            "layer1.linear_conv.bn.weight",
            "layer1.linear_conv.bn.bias",
        ]
    );
    let x = Tensor::randn([2, 16, 9, 9], (Kind::Float, Device::Cpu));
    assert_eq!(block.forward(&x, true).size(), [2, 16, 9, 9]);
}
