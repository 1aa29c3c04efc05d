//! `--vram` as a real limit on a trial: on CUDA the caching allocator is
//! capped at the budget less the CUDA context (the arithmetic is a unit
//! test of `trial::memory::memory_fraction`; the cap itself is checked on a
//! GPU by scripts/gpu-validate.sh); the CUDA stand-in (`--as-cuda` on the
//! CPU) caps its counted tensors at the budget, and a step over it is an
//! `oom`, never a crash.

mod common;

use serde_json::Value;
use std::process::Command;

fn trial(args: &[&str]) -> (Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_segtune"))
        .arg("trial")
        .arg(common::readme_example())
        .args([
            "--batch-size",
            "2",
            "--crop",
            "128x128",
            "--steps",
            "1",
            "--json",
        ])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (report, stderr)
}

#[test]
fn the_cuda_stand_in_runs_out_of_memory_under_a_vram_cap_and_fits_without() {
    let (free, _) = trial(&["--as-cuda"]);
    assert_eq!(free["status"], "ok", "{free}");
    let peak = free["peak_bytes"].as_u64().unwrap();
    // A budget below what the step holds at its peak.
    let (capped, stderr) = trial(&["--as-cuda", "--vram", &(peak / 2).to_string()]);
    assert_eq!(capped["status"], "oom", "{capped} {stderr}");
    let (roomy, _) = trial(&["--as-cuda", "--vram", &(peak * 2).to_string()]);
    assert_eq!(roomy["status"], "ok", "{roomy}");
}

#[test]
fn vram_on_a_plain_cpu_trial_is_refused_not_ignored() {
    let (report, stderr) = trial(&["--vram", "4G"]);
    let text = format!("{report} {stderr}");
    assert!(text.contains("--vram caps a CUDA device"), "{text}");
    assert_ne!(report["status"], "ok");
}
