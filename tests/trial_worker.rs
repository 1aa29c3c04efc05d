//! The `segtune-torch` worker's trials on their own: repeatable figures, an
//! allocation cap that becomes status `oom`, an unknown model type that
//! names what is supported. (The comparison with the MMSeg oracle is
//! `tests/oracle_cpu.rs`.)

mod common;

use std::process::Command;

fn worker(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_segtune-torch"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn cpu_trial_of_b0_at_2x512_is_stable_across_runs() {
    let Some(shared) = common::require_shared("cpu_trial_of_b0_at_2x512_is_stable_across_runs")
    else {
        return;
    };
    let path =
        shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py");
    let run = || {
        worker(&[
            "trial",
            path.to_str().unwrap(),
            "--batch-size",
            "2",
            "--crop",
            "512x512",
            "--json",
        ])
    };
    let (a, b) = (run(), run());
    assert_eq!(a["status"], "ok", "{}", a["message"]);
    assert_eq!(
        a["peak_bytes"], b["peak_bytes"],
        "the same trial must give the same peak"
    );
    assert!(a["images_per_s"].as_f64().unwrap() > 0.0);
    println!(
        "B0 2x512x512 CPU: peak {} bytes (both runs), {:.2} / {:.2} images/s",
        a["peak_bytes"],
        a["images_per_s"].as_f64().unwrap(),
        b["images_per_s"].as_f64().unwrap()
    );
}

#[test]
fn an_allocation_cap_turns_into_status_oom() {
    let Some(shared) = common::require_shared("an_allocation_cap_turns_into_status_oom") else {
        return;
    };
    let path =
        shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py");
    let report = worker(&[
        "trial",
        path.to_str().unwrap(),
        "--batch-size",
        "2",
        "--crop",
        "256x256",
        "--cpu-cap",
        "100000000",
        "--json",
    ]);
    assert_eq!(report["status"], "oom", "{report}");
    assert!(report["message"]
        .as_str()
        .unwrap()
        .contains("out of memory"));
}

#[test]
fn an_unknown_model_type_lists_what_is_supported() {
    let Some(shared) = common::require_shared("an_unknown_model_type_lists_what_is_supported")
    else {
        return;
    };
    // A head of the user's own (segtune builds every MMSeg head but SAN's).
    let dir = tempfile::tempdir().unwrap();
    let base =
        shared.join("mmseg-configs/configs/pspnet/pspnet_r18-d8_4xb2-80k_cityscapes-512x1024.py");
    let path = common::write(
        &dir,
        "my_head.py",
        &format!(
            "_base_ = '{}'\nmodel = dict(decode_head=dict(type='MyHead'))\n",
            base.display()
        ),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_segtune-torch"))
        .args(["trial", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown decode head type `MyHead`")
            && err.contains("SegformerHead")
            && err.contains("UPerHead"),
        "{err}"
    );
}
