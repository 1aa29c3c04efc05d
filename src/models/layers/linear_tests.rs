//! Unit tests of `linear.rs`: `nn.Linear`'s parameters and output.
use super::*;
use crate::models::params::ParamStore;
use tch::{Device, Kind};

#[test]
fn a_linear_has_out_times_in_weights_and_an_optional_bias() {
    // nn.Linear(10, 20): 20 * 10 + 20 = 220; bias=False: 200.
    let mut store = ParamStore::new(Device::Cpu);
    let linear = Linear::new(&mut store.scope("fc"), 10, 20, true);
    assert_eq!(store.total(), 220);
    let _ = Linear::new(&mut store.scope("fc_no_bias"), 10, 20, false);
    assert_eq!(store.total(), 420);
    let x = Tensor::randn([3, 7, 10], (Kind::Float, Device::Cpu));
    assert_eq!(linear.forward(&x).size(), [3, 7, 20]);
}
