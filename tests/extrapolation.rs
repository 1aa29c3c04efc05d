//! A trace extrapolated to batch 4 from traces at batch 1 and 2 replays to
//! the same GPU prediction as a trace taken directly at batch 4.

mod common;

use segtune::predict::estimate::batch_tensors;
use segtune::predict::extrapolate::extrapolate;
use segtune::predict::replay::{replay, ReplayInputs};
use segtune::predict::trace::{from_text, TraceEvent};
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
fn batch_4_extrapolated_from_1_and_2_matches_a_direct_trace() {
    let Some(shared) =
        common::require_shared("batch_4_extrapolated_from_1_and_2_matches_a_direct_trace")
    else {
        return;
    };
    let config =
        shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py");
    let (one, two, four) = (trace(&config, 1), trace(&config, 2), trace(&config, 4));
    let predicted = extrapolate(&one, &two, 4).unwrap();
    let inputs = ReplayInputs {
        batch_copies: batch_tensors(4, (96, 96)),
        cublas_workspace: 8 << 20,
        capacity: None,
    };
    let from_two = replay(&predicted, &inputs);
    let direct = replay(&four, &inputs);
    println!(
        "batch 4 at 96x96: extrapolated {:?}\n                  direct       {:?}",
        from_two, direct
    );
    assert_eq!(from_two.peak_allocated, direct.peak_allocated);
    assert_eq!(from_two.peak_reserved, direct.peak_reserved);
}
