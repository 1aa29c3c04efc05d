//! Unit tests of `embed.rs`: `PatchEmbed`'s parameters, its tokens' shape
//! with and without `AdaptivePadding`, `corner_padding`.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind, Tensor};

#[test]
fn swin_t_patch_embedding_has_a_conv_and_a_layer_norm() {
    // Swin-T's PatchEmbed(3, 96, 4, 4, 'corner', norm LN): Conv2d(3, 96, 4)
    // 96 * 3 * 16 + 96 = 4_704, LN 2 * 96 = 192: 4_896.
    let mut store = ParamStore::new(Device::Cpu);
    let embed = PatchEmbed::new(
        &mut store.scope("patch_embed"),
        3,
        96,
        4,
        4,
        PatchPadding::Corner,
        true,
        Some(LayerNormCfg::DEFAULT),
    );
    assert_eq!(store.total(), 4_896);
    // 30x30 is padded to 32x32 at the bottom right: an 8x8 grid of tokens.
    let x = Tensor::randn([2, 3, 30, 30], (Kind::Float, Device::Cpu));
    let (tokens, hw) = embed.forward(&x);
    assert_eq!((tokens.size(), hw), (vec![2, 64, 96], (8, 8)));
}

#[test]
fn an_overlapping_embedding_pads_by_its_own_conv() {
    // MiT's first embedding: Conv2d(3, 32, 7, stride 4, padding 3), no norm:
    // 32 * 3 * 49 + 32 = 4_736.
    let mut store = ParamStore::new(Device::Cpu);
    let embed = PatchEmbed::new(
        &mut store.scope("e"),
        3,
        32,
        7,
        4,
        PatchPadding::Fixed(3),
        true,
        None,
    );
    assert_eq!(store.total(), 4_736);
    let (tokens, hw) = embed.forward(&Tensor::randn([1, 3, 64, 64], (Kind::Float, Device::Cpu)));
    assert_eq!((tokens.size(), hw), (vec![1, 256, 32], (16, 16)));
}

#[test]
fn corner_padding_completes_the_last_window() {
    assert_eq!(corner_padding((30, 32), 4, 4), Some((2, 0)));
    assert_eq!(corner_padding((32, 32), 4, 4), None);
    // A 7-wide window, stride 4, over 9: ceil(9/4) = 3 windows need 15.
    assert_eq!(corner_padding((9, 9), 7, 4), Some((6, 6)));
}
