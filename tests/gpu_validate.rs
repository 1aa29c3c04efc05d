//! `scripts/gpu-validate.sh --dry-run`: the device check's whole flow on
//! the CPU (the CUDA stand-in, two small configs and one segtune refuses,
//! predicted searches on the 3050 Ti preset with their winners run under
//! the preset's cap) writes every section with its columns, and a part
//! that fails leaves a row saying so while the rest goes on.

mod common;

use serde_json::Value;
use std::process::Command;

#[test]
fn the_dry_run_writes_every_section_and_goes_on_past_a_failed_row() {
    let Some(shared) = common::require_shared("gpu_validate dry run") else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_segtune"))
        .parent()
        .unwrap()
        .to_path_buf();
    let run = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/gpu_validate.py"
        ))
        .arg("--dry-run")
        .arg("--out")
        .arg(out.path())
        .arg("--bin")
        .arg(&bin)
        .arg("--shared")
        .arg(&shared)
        .arg("--budget")
        .arg("1800")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    eprintln!("{stdout}");
    let md = std::fs::read_to_string(out.path().join("gpu-validate.md")).unwrap();
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("gpu-validate.json")).unwrap(),
    )
    .unwrap();
    let columns: [(&str, &[&str]); 4] = [
        ("device", &["fact", "value", "how"]),
        (
            "predicted_vs_measured",
            &[
                "family",
                "status",
                "pred_least_mib",
                "pred_alloc_mib",
                "pred_low_mib",
                "pred_high_mib",
                "meas_alloc_mib",
                "alloc_error_pct",
            ],
        ),
        ("cudnn_workspace", &["config", "status", "note"]),
        (
            "small_cards",
            &[
                "what",
                "preset",
                "status",
                "winner",
                "winner_peak_mib",
                "budget_mib",
                "fits",
            ],
        ),
    ];
    for (section, cols) in columns {
        assert!(md.contains(&format!("## {section}")), "{md}");
        let rows = report[section].as_array().unwrap();
        assert!(!rows.is_empty(), "{section} has rows");
        for r in rows {
            for c in cols {
                assert!(r.get(*c).is_some(), "{section}: column {c} in {r}");
            }
        }
    }
    let measured = report["predicted_vs_measured"].as_array().unwrap();
    let ok: Vec<&Value> = measured.iter().filter(|r| r["status"] == "ok").collect();
    assert_eq!(ok.len(), 2, "{measured:?}");
    for r in &ok {
        assert!(r["pred_alloc_mib"].as_u64().unwrap() > 0);
        assert!(r["meas_alloc_mib"].as_u64().unwrap() > 0);
    }
    let refused = measured
        .iter()
        .find(|r| r["family"] == "SAN")
        .expect("the refused config has its row");
    assert_eq!(refused["status"], "estimate failed");
    assert!(
        refused["note"]
            .as_str()
            .unwrap()
            .contains("MultimodalEncoderDecoder"),
        "{refused}"
    );
    // The parts after the failure ran.
    assert_eq!(report["cudnn_workspace"][0]["status"], "skipped");
    let cards = report["small_cards"].as_array().unwrap();
    assert_eq!(cards.len(), 2);
    for c in cards {
        assert_eq!(c["status"], "ok", "{c}");
        assert_eq!(
            c["fits"], "yes",
            "the winner runs under the preset's cap: {c}"
        );
    }
    assert!(report["summary"]["text"]
        .as_str()
        .unwrap()
        .contains("rtx3050ti-laptop"));
}
