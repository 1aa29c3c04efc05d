//! Inference trials against MMSeg's real `test_step` on the CPU
//! (`tests/fixtures/oracle_cpu_infer.json`, from `scripts/oracle-infer.py`):
//! the peak CPU tensor bytes of each step, whole and slide inference, fp32
//! and bf16, within 2%. bf16 figures depend on the CPU's oneDNN kernels: they
//! are compared on AMX CPUs (where the fixture was measured) only.

mod common;

use std::path::Path;

fn fixture() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oracle_cpu_infer.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn amx() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains("amx_bf16"))
}

/// Runs segtune's inference trial for the record; returns its peak.
fn segtune_peak(shared: &Path, record: &serde_json::Value) -> i64 {
    let config = shared
        .join("mmseg-configs/configs/segformer")
        .join(format!("{}.py", record["config"].as_str().unwrap()));
    let image = &record["image"];
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_segtune-torch"));
    cmd.arg("trial")
        .arg(&config)
        .args([
            "--mode",
            "infer",
            "--threads",
            "1",
            "--warmup",
            "1",
            "--steps",
            "2",
        ])
        .args(["--batch-size", &record["batch"].to_string()])
        .args(["--crop", &format!("{}x{}", image[0], image[1])])
        .args([
            "--amp",
            if record["precision"] == "bf16" {
                "bf16"
            } else {
                "off"
            },
        ])
        .arg("--json");
    if record["mode"] == "whole" {
        cmd.args(["--cfg-options", "model.test_cfg.mode=whole"]);
    }
    let out = cmd.output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["status"], "ok", "{report}");
    report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["measured"] == true)
        .map(|s| s["peak_bytes"].as_i64().unwrap())
        .max()
        .unwrap()
}

fn compare(large: bool) {
    let Some(shared) = common::require_shared("oracle_infer") else {
        return;
    };
    let mut compared = 0;
    let mut exact = 0;
    for record in fixture()["records"].as_array().unwrap() {
        let is_large = record["image"][0].as_i64().unwrap() > 512;
        if is_large != large {
            continue;
        }
        if record["precision"] == "bf16" && !amx() {
            println!("not compared (bf16 measured on AMX, this CPU has none): {record}");
            continue;
        }
        let want = record["peak_steps2_3_bytes"].as_i64().unwrap();
        let got = segtune_peak(&shared, record);
        let error = got as f64 / want as f64 - 1.0;
        println!(
            "{} {} {}x{}x{} {}: MMSeg {want}, segtune {got} ({:+.3}%)",
            record["config"],
            record["precision"],
            record["batch"],
            record["image"][0],
            record["image"][1],
            record["mode"],
            100.0 * error
        );
        assert!(error.abs() <= 0.02, "more than 2% off: {record}");
        compared += 1;
        exact += usize::from(got == want);
    }
    println!("{compared} inference records compared, {exact} equal to the byte");
    assert!(compared > 0 || !amx());
}

#[test]
fn inference_peaks_match_mmseg_test_step_on_the_cpu() {
    compare(false);
}

/// The 1024x2048 records (~15 s a step on the CPU).
#[test]
#[ignore]
fn full_cityscapes_inference_peaks_match_mmseg_test_step() {
    compare(true);
}
