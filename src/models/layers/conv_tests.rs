//! Unit tests of `conv.rs`: parameter counts of `nn.Conv2d`, mmcv's
//! `ConvModule` and `DepthwiseSeparableConvModule` as PyTorch counts them,
//! their state-dict names and output shapes.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind, Tensor};

fn names(store: &ParamStore) -> Vec<&str> {
    store.params.iter().map(|p| p.name.as_str()).collect()
}

#[test]
fn a_strided_conv2d_has_kernel_weights_and_a_bias() {
    // Conv2d(64, 128, 3, stride=2, padding=1): 128 * 64 * 3 * 3 + 128 = 73_856.
    let mut store = ParamStore::new(Device::Cpu);
    let conv = Conv2d::new(
        &mut store.scope("conv"),
        ConvSpec::new(64, 128, 3).stride(2).padding(1),
    );
    assert_eq!(store.total(), 73_856);
    assert_eq!(names(&store), ["conv.weight", "conv.bias"]);
    let x = Tensor::randn([1, 64, 16, 16], (Kind::Float, Device::Cpu));
    assert_eq!(conv.forward(&x).size(), [1, 128, 8, 8]);
}

#[test]
fn a_conv_module_with_bn_drops_the_conv_bias() {
    // ConvModule(64, 128, 3, padding=1, norm_cfg=BN): bias='auto' gives no
    // conv bias; 128 * 64 * 9 + BN's weight and bias (2 * 128) = 73_984.
    let mut store = ParamStore::new(Device::Cpu);
    let module = ConvModule::new(
        &mut store.scope("m"),
        ConvSpec::new(64, 128, 3).padding(1),
        Some(NormCfg::BN_DEFAULT),
        true,
    );
    assert_eq!(store.total(), 73_984);
    assert_eq!(names(&store), ["m.conv.weight", "m.bn.weight", "m.bn.bias"]);
    let x = Tensor::randn([2, 64, 8, 8], (Kind::Float, Device::Cpu));
    let y = module.forward(&x, true);
    assert_eq!(y.size(), [2, 128, 8, 8]);
    // The ReLU: nothing negative.
    assert!(y.min().double_value(&[]) >= 0.0);
}

#[test]
fn a_conv_module_without_norm_keeps_the_conv_bias() {
    // ConvModule(64, 128, 1, norm_cfg=None): 64 * 128 + 128 = 8_320.
    let mut store = ParamStore::new(Device::Cpu);
    let _ = ConvModule::new(&mut store.scope("m"), ConvSpec::new(64, 128, 1), None, true);
    assert_eq!(store.total(), 8_320);
    assert_eq!(names(&store), ["m.conv.weight", "m.conv.bias"]);
}

#[test]
fn a_depthwise_separable_module_is_a_grouped_and_a_pointwise_conv() {
    // depthwise Conv2d(64, 64, 3, groups=64): 64 * 9 = 576, BN 128;
    // pointwise Conv2d(64, 128, 1): 8_192, BN 256. 576 + 128 + 8_192 + 256 = 9_152.
    let mut store = ParamStore::new(Device::Cpu);
    let module = DepthwiseSeparableConvModule::new(
        &mut store.scope("m"),
        ConvSpec::new(64, 128, 3).padding(2).dilation(2),
        Some(NormCfg::BN_DEFAULT),
        true,
    );
    assert_eq!(store.total(), 9_152);
    assert_eq!(names(&store)[0], "m.depthwise_conv.conv.weight");
    assert_eq!(names(&store)[3], "m.pointwise_conv.conv.weight");
    let x = Tensor::randn([2, 64, 8, 8], (Kind::Float, Device::Cpu));
    assert_eq!(module.forward(&x, true).size(), [2, 128, 8, 8]);
}
