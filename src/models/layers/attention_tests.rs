//! Unit tests of `attention.rs`: `nn.MultiheadAttention`'s parameters as
//! PyTorch registers them and the output shape of each way of calling it.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind, Tensor};

fn attention(bias: bool) -> (ParamStore, MultiheadAttention) {
    let mut store = ParamStore::new(Device::Cpu);
    let attn = MultiheadAttention::new(&mut store.scope("attn"), 256, 8, bias);
    (store, attn)
}

#[test]
fn the_packed_in_projection_and_the_out_projection_are_counted() {
    // nn.MultiheadAttention(256, 8): in_proj_weight 3 * 256 * 256,
    // in_proj_bias 3 * 256, out_proj 256 * 256 + 256:
    // 196_608 + 768 + 65_792 = 263_168.
    let (store, _) = attention(true);
    assert_eq!(store.total(), 263_168);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "attn.in_proj_weight",
            "attn.in_proj_bias",
            "attn.out_proj.weight",
            "attn.out_proj.bias"
        ]
    );
    // bias=False: the weights alone, 196_608 + 65_536.
    assert_eq!(attention(false).0.total(), 262_144);
}

#[test]
fn the_output_has_the_queries_length_and_batch() {
    let (_, attn) = attention(true);
    let x = Tensor::randn([10, 2, 256], (Kind::Float, Device::Cpu));
    assert_eq!(attn.forward_self(&x).size(), [10, 2, 256]);
    let query = Tensor::randn([5, 2, 256], (Kind::Float, Device::Cpu));
    assert_eq!(attn.forward(&query, &x).size(), [5, 2, 256]);
    let value = Tensor::randn([10, 2, 256], (Kind::Float, Device::Cpu));
    // A bool mask per (batch * head, query, key): true where not allowed.
    let mask = Tensor::zeros([2 * 8, 5, 10], (Kind::Bool, Device::Cpu));
    assert_eq!(
        attn.forward_separate(&query, &x, &value, Some(&mask))
            .size(),
        [5, 2, 256]
    );
}
