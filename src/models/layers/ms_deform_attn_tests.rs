//! Unit tests of `ms_deform_attn.rs`: mmcv's MultiScaleDeformableAttention
//! parameters as Mask2Former's pixel decoder builds it, one forward's
//! shape, the sampling of a constant value map.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind};

fn spatial_shapes(hw: &[(i64, i64)]) -> SpatialShapes {
    let flat: Vec<i64> = hw.iter().flat_map(|(h, w)| [*h, *w]).collect();
    SpatialShapes {
        hw: hw.to_vec(),
        tensor: Tensor::from_slice(&flat).view([-1, 2]),
    }
}

#[test]
fn mask2formers_encoder_attention_has_mmcvs_parameter_count() {
    // MultiScaleDeformableAttention(256, num_heads=8, num_levels=3,
    // num_points=4): sampling_offsets Linear(256, 8*3*4*2 = 192),
    // attention_weights Linear(256, 96), value_proj and output_proj
    // Linear(256, 256), with biases:
    // 49_344 + 24_672 + 65_792 + 65_792 = 205_600.
    let mut store = ParamStore::new(Device::Cpu);
    let attn = MultiScaleDeformableAttention::new(&mut store.scope("attn"), 256, 8, 3, 4, 0.0);
    assert_eq!(store.total(), 205_600);
    let shapes = spatial_shapes(&[(4, 4), (2, 2), (1, 1)]);
    let n = 16 + 4 + 1;
    let query = Tensor::randn([2, n, 256], (Kind::Float, Device::Cpu));
    let pos = Tensor::randn([2, n, 256], (Kind::Float, Device::Cpu));
    let reference = Tensor::rand([2, n, 3, 2], (Kind::Float, Device::Cpu));
    let out = attn.forward(&query, &pos, None, &reference, &shapes, true);
    assert_eq!(out.size(), [2, n, 256]);
}

#[test]
fn sampling_a_constant_map_inside_it_gives_the_constant() {
    // grid_sample of a constant inside the map is that constant; weights
    // summing to 1 over levels and points keep it.
    let shapes = [(4, 4), (2, 2)];
    let value = Tensor::full([1, 20, 2, 8], 3.0, (Kind::Float, Device::Cpu));
    let locations = Tensor::full([1, 5, 2, 2, 3, 2], 0.5, (Kind::Float, Device::Cpu));
    let weights = Tensor::full([1, 5, 2, 2, 3], 1.0 / 6.0, (Kind::Float, Device::Cpu));
    let out = multi_scale_deformable_attn_pytorch(&value, &shapes, &locations, &weights);
    assert_eq!(out.size(), [1, 5, 16]);
    assert!((out - 3.0).abs().max().double_value(&[]) < 1e-5);
}
