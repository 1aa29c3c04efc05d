//! Unit tests of `ppm.rs`: DAPPM's and PAPPM's parameters and output shapes.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind};

#[test]
fn dappm_and_pappm_keep_the_input_size() {
    for parallel in [false, true] {
        let mut store = ParamStore::new(Device::Cpu);
        let ppm = Pappm::new(&mut store.scope("spp"), 16, 4, 8, 5, parallel);
        // scales 5 x (32 + 64), processes 4 x (8 + 144) or 32 + 576,
        // compression 40 + 160, shortcut 32 + 128.
        assert_eq!(store.total(), 1448);
        let x = Tensor::randn([2, 16, 8, 8], (Kind::Float, Device::Cpu));
        assert_eq!(ppm.forward(&x, true).size(), [2, 8, 8, 8]);
    }
}
