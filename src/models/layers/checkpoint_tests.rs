//! Unit tests of `checkpoint.rs`: a checkpointed block gives the value and
//! the gradient of the block itself, and runs again in the backward.
use super::*;
use std::cell::Cell;
use tch::{Device, Kind};

#[test]
fn a_checkpointed_block_has_the_blocks_value_and_gradient() {
    let runs = Cell::new(0);
    let x = Tensor::randn([4, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let block = |t: &Tensor| {
        runs.set(runs.get() + 1);
        (t * t).sin()
    };
    // SAFETY: `runs` outlives the graph of `y`, which is dropped in this test.
    let y = unsafe { checkpoint(&x, block) };
    let expected = (&x * &x).sin();
    assert!((&y - &expected).abs().max().double_value(&[]) < 1e-6);
    assert_eq!(runs.get(), 1);
    y.sum(Kind::Float).backward();
    // d/dx sin(x^2) = 2x cos(x^2); the block ran again for it.
    let grad = &x * 2.0 * (&x * &x).cos();
    assert!((x.grad() - grad).abs().max().double_value(&[]) < 1e-5);
    assert_eq!(runs.get(), 2);
}

#[test]
fn checkpoint_if_runs_the_block_plainly_without_with_cp_or_grad() {
    let x = Tensor::randn([2, 2], (Kind::Float, Device::Cpu));
    // SAFETY: the block borrows nothing.
    let y = unsafe { checkpoint_if(true, &x, |t| t + 1.0) };
    assert!(!y.requires_grad());
    let xg = x.set_requires_grad(true);
    // SAFETY: the block borrows nothing.
    let y = unsafe { checkpoint_if(false, &xg, |t| t + 1.0) };
    // (x + 1) - x - 1 rounds to a few ulps of 1, not always to zero.
    assert!((y - &xg - 1.0).abs().max().double_value(&[]) < 1e-6);
}
