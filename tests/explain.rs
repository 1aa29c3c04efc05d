//! `segtune explain`: the predicted peak split into parts that add up to
//! the predicted device total, with activations by model part.

use assert_cmd::Command;

fn explain(args: &[&str]) -> std::process::Output {
    Command::cargo_bin("segtune")
        .unwrap()
        .arg("explain")
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("docs/examples/segformer_mit-b0_8xb2-160k_ade20k-512x512.rhai"),
        )
        .args(["--preset", "rtx3050ti", "--crop", "512x512"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_parts_of_the_peak_add_up_to_the_predicted_device_total() {
    let out = explain(&["--batch-size", "2", "--amp", "fp16", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let parts = e["breakdown"]["parts"].as_array().unwrap();
    let bytes = |name: &str| {
        parts
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["bytes"].as_u64())
    };
    let total: u64 = parts.iter().map(|p| p["bytes"].as_u64().unwrap()).sum();
    assert_eq!(total, e["predicted_device_bytes"].as_u64().unwrap());
    let allocated: u64 = parts
        .iter()
        .filter(|p| p["in_allocated"] == true)
        .map(|p| p["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(
        allocated,
        e["predicted_peak_allocated_bytes"].as_u64().unwrap()
    );
    // MiT-B0 has 3.7 M parameters (fp32: 14-15 MiB); the optimizer (AdamW)
    // keeps two moments of each.
    let params = bytes("parameters and buffers").unwrap();
    assert!((14 << 20..16 << 20).contains(&params), "{params}");
    let state = bytes("optimizer state").unwrap();
    assert!(state >= 2 * (14 << 20) - (1 << 20), "{state}");
    for stage in 1..=4 {
        assert!(bytes(&format!("activations: backbone.stage{stage}")).unwrap() > 0);
    }
    assert!(bytes("activations: decode_head").unwrap() > 0);
    assert!(bytes("activations: decode_head.loss").unwrap() > 0);
    assert!(bytes("CUDA context").unwrap() > 0);
    assert!(bytes("input batch (device copies)").unwrap() > 0);
}

#[test]
fn a_setting_that_does_not_fit_says_by_how_much() {
    let out = explain(&["--batch-size", "16"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("does not fit (predicted):"), "{text}");
    assert!(text.contains("GiB over"), "{text}");
    assert!(text.contains("activations: backbone.stage1"), "{text}");
}

#[test]
fn search_why_sets_the_winner_beside_the_next_batch_that_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("search")
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("docs/examples/segformer_mit-b0_8xb2-160k_ade20k-512x512.rhai"),
        )
        .arg("--out")
        .arg(dir.path())
        .arg("--why")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not a terminal: no progress line on stderr.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("at most"), "{stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    let why = &text[text
        .find("why (predicted, against the usable")
        .expect("a why table")..];
    assert!(why.contains("winner: batch"), "{why}");
    assert!(why.contains("(does not fit)"), "{why}");
    let total = why
        .lines()
        .find(|l| l.trim_start().starts_with("total"))
        .unwrap();
    let figures: Vec<f64> = total
        .split('|')
        .skip(1)
        .map(|f| f.trim().parse().unwrap())
        .collect();
    let usable: f64 = why
        .split("usable ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        figures[0] <= usable && figures[1] > usable,
        "{total} vs {usable}"
    );
}
