//! Unit tests of `basic_block.rs`: the blocks' parameters and output shapes.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind};

fn args(in_channels: i64, channels: i64, stride: i64) -> BlockArgs {
    BlockArgs {
        in_channels,
        channels,
        stride,
        norm: NormCfg::BN_DEFAULT,
        act_out: true,
    }
}

#[test]
fn a_basic_block_is_two_3x3_conv_modules() {
    let mut store = ParamStore::new(Device::Cpu);
    let block = ResBlock::new(
        &mut store.scope("b"),
        BlockKind::Basic,
        &args(8, 8, 1),
        None,
    );
    // 2 x (8 * 8 * 9 weights + 16 BN)
    assert_eq!(store.total(), 1184);
    let x = Tensor::randn([2, 8, 6, 6], (Kind::Float, Device::Cpu));
    assert_eq!(block.forward(&x, true).size(), [2, 8, 6, 6]);
}

#[test]
fn a_bottleneck_doubles_its_channels_through_its_downsample() {
    let mut store = ParamStore::new(Device::Cpu);
    let down = |p: &mut ParamScope| {
        Downsample::new(p, DownsampleStyle::Module, 8, 16, 2, &NormCfg::BN_DEFAULT)
    };
    let block = ResBlock::new(
        &mut store.scope("b"),
        BlockKind::Bottleneck,
        &args(8, 8, 2),
        Some(&down),
    );
    // conv1 64 + 16, conv2 576 + 16, conv3 128 + 32, downsample 128 + 32.
    assert_eq!(store.total(), 992);
    let x = Tensor::randn([2, 8, 6, 6], (Kind::Float, Device::Cpu));
    assert_eq!(block.forward(&x, true).size(), [2, 16, 3, 3]);
}
