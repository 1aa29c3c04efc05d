//! SegFormer in libtorch against the CPU oracle measured from the real
//! MMSeg 1.2.2 models (`../shared/oracle/results.json`): parameter counts
//! must be equal, and the steady training peak (`peak_steps2_3_bytes`, the
//! counting allocator's high-water mark over steps 2-3) within 2% for every
//! (batch, crop, precision) record of the seven SegFormer configs.
//!
//! Each trial runs in its own `segtune-torch` process, as the oracle ran each
//! config in a fresh worker (the allocator count is process-wide).

mod common;

use std::process::Command;

const SEGFORMER_CONFIGS: &[&str] = &[
    "segformer_mit-b0_8xb2-160k_ade20k-512x512",
    "segformer_mit-b1_8xb2-160k_ade20k-512x512",
    "segformer_mit-b2_8xb2-160k_ade20k-512x512",
    "segformer_mit-b3_8xb2-160k_ade20k-512x512",
    "segformer_mit-b4_8xb2-160k_ade20k-512x512",
    "segformer_mit-b5_8xb2-160k_ade20k-512x512",
    "segformer_mit-b0_8xb1-160k_cityscapes-1024x1024",
];

/// bf16 on the CPU takes hardware-specific oneDNN paths: the shared oracle
/// was measured on a CPU with AMX; on one without it (like CI's), MMSeg's own
/// bf16 peaks differ (by up to 2.2% at batch 1), so they are compared with
/// the same oracle script's figures from such a CPU
/// (tests/fixtures/oracle_cpu_no_amx_bf16.json, command inside).
fn local_bf16_oracle() -> Option<serde_json::Value> {
    let has_amx = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" amx_bf16"));
    if has_amx {
        return None;
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_no_amx_bf16.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

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
fn segformer_matches_the_mmseg_cpu_oracle() {
    let Some(shared) = common::require_shared("segformer_matches_the_mmseg_cpu_oracle") else {
        return;
    };
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shared.join("oracle/results.json")).unwrap())
            .unwrap();
    let configs = shared.join("mmseg-configs/configs");
    let local = local_bf16_oracle();
    let local_peak = |name: &str, batch: &str, crop: i64| -> Option<i64> {
        local.as_ref()?["records"].as_array()?.iter().find_map(|r| {
            (r["config"] == name && r["batch"].as_i64()?.to_string() == batch && r["crop"] == crop)
                .then(|| r["peak_steps2_3_bytes"].as_i64())
                .flatten()
        })
    };
    let mut failures = Vec::new();
    println!(
        "{:<48} {:>5} {:>5} {:>13} {:>13} {:>8} {:>9} {:>9}",
        "config", "batch", "crop", "oracle bytes", "segtune", "error", "oracle s", "segtune s"
    );
    for name in SEGFORMER_CONFIGS {
        let model = &oracle["models"][name];
        let path = configs.join(model["config_path"].as_str().unwrap());
        let path = path.to_str().unwrap();
        let inspect = worker(&["inspect", path, "--json"]);
        let want = &model["params"];
        assert_eq!(
            inspect["params_total"], want["total"],
            "{name}: total parameters"
        );
        assert_eq!(
            inspect["params_trainable"], want["trainable"],
            "{name}: trainable parameters"
        );
        assert_eq!(
            inspect["params_by_prefix"], want["by_prefix"],
            "{name}: parameters by prefix"
        );
        for rec in oracle["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["config"] == *name && r["status"] == "ok")
        {
            let batch = rec["batch"].as_i64().unwrap().to_string();
            let crop = rec["crop"][0].as_i64().unwrap();
            let precision = rec["precision"].as_str().unwrap();
            let amp = if precision == "bf16" { "bf16" } else { "off" };
            let report = worker(&[
                "trial",
                path,
                "--batch-size",
                &batch,
                "--crop",
                &format!("{crop}x{crop}"),
                "--amp",
                amp,
                "--ignore-fraction",
                "0",
                "--threads",
                "1",
                "--warmup",
                "1",
                "--steps",
                "2",
                "--json",
            ]);
            assert_eq!(
                report["status"], "ok",
                "{name} {batch}x{crop} {precision}: {}",
                report["message"]
            );
            let shared_want = rec["peak_steps2_3_bytes"].as_i64().unwrap();
            let want = if precision == "bf16" {
                local_peak(name, &batch, crop).unwrap_or(shared_want)
            } else {
                shared_want
            };
            let got = report["peak_bytes"].as_i64().unwrap();
            let error = 100.0 * (got - want) as f64 / want as f64;
            println!(
                "{:<48} {:>5} {:>5} {:>13} {:>13} {:>+7.3}% {:>9.3} {:>9.3}   {precision}",
                name,
                batch,
                crop,
                want,
                got,
                error,
                rec["time_steps2_3_mean_s"].as_f64().unwrap_or(f64::NAN),
                report["step_time_median_s"].as_f64().unwrap_or(f64::NAN)
            );
            if error.abs() > 2.0 {
                failures.push(format!("{name} {batch}x{crop} {precision}: {error:+.2}%"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "peaks off by more than 2%: {failures:?}"
    );
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
    let path =
        shared.join("mmseg-configs/configs/pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py");
    let out = Command::new(env!("CARGO_BIN_EXE_segtune-torch"))
        .args(["trial", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown backbone type `ResNetV1c`") && err.contains("MixVisionTransformer"),
        "{err}"
    );
}
