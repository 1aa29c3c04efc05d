//! A trace extrapolated to batch 5 from traces at batch 2 and 3 replays to
//! the same GPU prediction as a trace taken directly at batch 5 (within 1%).

mod common;

use segtune::predict::estimate::batch_tensors;
use segtune::predict::extrapolate::extrapolate;
use segtune::predict::replay::{replay, ReplayInputs};
use segtune::trial::trace::{from_text, TraceEvent};
use std::process::Command;

fn trace(config: &std::path::Path, batch: i64) -> Vec<TraceEvent> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.trace");
    let out = Command::new(env!("CARGO_BIN_EXE_segtune-torch"))
        .arg("trial")
        .arg(config)
        .args([
            "--batch-size",
            &batch.to_string(),
            "--crop",
            "96x96",
            "--warmup",
            "1",
            "--steps",
            "1",
        ])
        .args([
            "--ignore-fraction",
            "0",
            "--threads",
            "1",
            "--json",
            "--trace-out",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    from_text(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn batch_5_extrapolated_from_2_and_3_matches_a_direct_trace() {
    let Some(shared) =
        common::require_shared("batch_5_extrapolated_from_2_and_3_matches_a_direct_trace")
    else {
        return;
    };
    let config =
        shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py");
    let (two, three, five) = (trace(&config, 2), trace(&config, 3), trace(&config, 5));
    let predicted = extrapolate(&two, &three, 5).unwrap();
    let inputs = ReplayInputs {
        batch_copies: batch_tensors(5, (96, 96), segtune::kinds::RunMode::Train),
        cublas_workspace: 8 << 20,
        capacity: None,
        settings: Default::default(),
    };
    let extrapolated = replay(&predicted, &inputs);
    let direct = replay(&five, &inputs);
    println!("batch 5 at 96x96: extrapolated {extrapolated:?}\n                  direct       {direct:?}");
    let error = (extrapolated.peak_allocated as f64 - direct.peak_allocated as f64)
        / direct.peak_allocated as f64;
    assert!(
        error.abs() < 0.01,
        "extrapolated peak allocated off by {:.2}%",
        100.0 * error
    );
}
