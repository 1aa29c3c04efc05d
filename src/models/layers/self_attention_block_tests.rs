//! Unit tests of `self_attention_block.rs`: MMSeg's SelfAttentionBlock
//! parameters as DANet's PAM and ANN's APNB build it, its output shape.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind};

/// The block of DANet's PAM (`PAM(in_channels=512, channels=64)`): plain
/// 1x1 convs for key/query and value, no out projection, shared nothing.
fn pam() -> SelfAttentionBlockCfg {
    SelfAttentionBlockCfg::plain(512, 64)
}

#[test]
fn pam_has_key_query_and_value_convs() {
    // key and query Conv2d(512, 64, 1): 512 * 64 + 64 = 32_832 each;
    // value Conv2d(512, 512, 1): 512 * 512 + 512 = 262_656. Total 328_320.
    let mut store = ParamStore::new(Device::Cpu);
    let block = SelfAttentionBlock::new(&mut store.scope("pam"), &pam());
    assert_eq!(store.total(), 328_320);
    let x = Tensor::randn([2, 512, 4, 4], (Kind::Float, Device::Cpu));
    assert_eq!(
        block.forward(&x, &x, None, None, true).size(),
        [2, 512, 4, 4]
    );
}

#[test]
fn conv_modules_and_an_out_projection_add_norms_and_a_layer() {
    // ANN's APNB-like block: ConvModules (conv without bias + BN) with two
    // key/query convs, an out projection: key 512*64 + 128 + 64*64 + 128,
    // query the same, value 512*64 + 128, out 64*512 + 1024:
    // 2 * 37_120 + 32_896 + 33_792 = 140_928.
    let cfg = SelfAttentionBlockCfg {
        key_query_num_convs: 2,
        key_query_norm: true,
        value_out_norm: true,
        with_out: true,
        matmul_norm: true,
        norm: Some(NormCfg::BN_DEFAULT),
        relu: true,
        ..pam()
    };
    let mut store = ParamStore::new(Device::Cpu);
    let block = SelfAttentionBlock::new(&mut store.scope("b"), &cfg);
    assert_eq!(store.total(), 140_928);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[0], "b.key_project.0.conv.weight");
    assert!(names.contains(&"b.out_project.conv.weight"));
    let query = Tensor::randn([2, 512, 4, 4], (Kind::Float, Device::Cpu));
    let key = Tensor::randn([2, 512, 2, 2], (Kind::Float, Device::Cpu));
    // At the queries' resolution, whatever the keys'.
    assert_eq!(
        block.forward(&query, &key, None, None, true).size(),
        [2, 512, 4, 4]
    );
}
