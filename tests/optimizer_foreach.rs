//! The optimizers' foreach implementation (what `torch.optim` runs on CUDA,
//! and what a CPU trace standing in for CUDA runs): the same arithmetic as
//! the single-tensor one, but a whole param group's temporaries at once.

use segtune::config::evaluate_source;
use segtune::models::params::ParamStore;
use segtune::trial::memory::CpuCounter;
use segtune::trial::optim::{Amp, OptimCfg, OptimWrapper};
use std::path::Path;
use tch::{Device, Kind, Tensor};

const SHAPES: [&[i64]; 3] = [&[64, 32], &[256, 64], &[32]];

/// The seed and the allocation counter are process-wide: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn store() -> ParamStore {
    tch::manual_seed(0);
    let mut store = ParamStore::new(Device::Cpu);
    let mut scope = store.scope("model");
    for (i, shape) in SHAPES.iter().enumerate() {
        let _ = scope.param_normal(&format!("w{i}"), shape, 0.1);
    }
    store
}

fn optimizer(store: &ParamStore, optimizer: &str, foreach: bool) -> OptimWrapper {
    let source = format!("optim_wrapper = dict(type='OptimWrapper', optimizer={optimizer})\n");
    let cfg = evaluate_source(Path::new("optim.py"), &source).unwrap();
    let mut wrapper = OptimWrapper::new(OptimCfg::from_cfg(&cfg).unwrap(), store, Amp::Off);
    if foreach {
        wrapper.use_foreach();
    }
    wrapper
}

fn loss(store: &ParamStore) -> Tensor {
    store
        .params
        .iter()
        .map(|p| (&p.tensor * 3.0).square().sum(Kind::Float))
        .reduce(|a, b| a + b)
        .unwrap()
}

/// Parameters after three steps.
fn trained(optimizer_cfg: &str, foreach: bool) -> Vec<Tensor> {
    let store = store();
    let mut wrapper = optimizer(&store, optimizer_cfg, foreach);
    for _ in 0..3 {
        wrapper.backward(&loss(&store));
        wrapper.step_if_due().unwrap();
    }
    store
        .params
        .iter()
        .map(|p| p.tensor.detach().copy())
        .collect()
}

#[test]
fn foreach_and_single_tensor_steps_agree() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for cfg in [
        "dict(type='AdamW', lr=0.01, weight_decay=0.01)",
        "dict(type='Adam', lr=0.01, weight_decay=0.01, amsgrad=True)",
        "dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0005)",
        "dict(type='SGD', lr=0.01, momentum=0.9, nesterov=True)",
    ] {
        let single = trained(cfg, false);
        let foreach = trained(cfg, true);
        for (a, b) in single.iter().zip(&foreach) {
            let diff = (a - b).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{cfg}: foreach differs by {diff}");
        }
        let moved = (&single[0] - &store().params[0].tensor)
            .abs()
            .max()
            .double_value(&[]);
        assert!(moved > 1e-4, "{cfg}: the step changed nothing");
    }
}

#[test]
fn foreach_adamw_holds_a_whole_group_of_roots_at_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let counter = CpuCounter::install();
    let param_bytes: i64 = SHAPES.iter().map(|s| s.iter().product::<i64>() * 4).sum();
    let largest = 256 * 64 * 4;
    let mut step_peaks = Vec::new();
    for foreach in [false, true] {
        let store = store();
        let mut wrapper = optimizer(&store, "dict(type='AdamW', lr=0.01)", foreach);
        // The first step creates the state; the second is measured.
        wrapper.backward(&loss(&store));
        wrapper.step_if_due().unwrap();
        wrapper.backward(&loss(&store));
        let before = counter.current();
        counter.reset_peak();
        wrapper.step_if_due().unwrap();
        step_peaks.push(counter.peak() - before);
    }
    // Single-tensor: sqrt(v) and its quotient for one parameter at a time,
    // beside the previous parameter's `denom`, which Python's loop frees
    // only when it rebinds the name (here the 64x32 before the 256x64).
    let previous = 64 * 32 * 4;
    assert!(
        step_peaks[0] >= 2 * largest + previous && step_peaks[0] <= 2 * largest + previous + 4096,
        "{step_peaks:?}"
    );
    // Foreach (one group without paramwise_cfg): every root of the group.
    assert!(step_peaks[1] >= param_bytes, "{step_peaks:?}");
}
