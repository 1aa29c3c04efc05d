//! `segtune explain`: the predicted peak split into parts that add up to
//! the predicted device total, with activations by model part; `search
//! --why`; and `estimate --alloc-conf`, the README example's step
//! (SegFormer-B0 2x512x512) replayed with PyTorch's allocator settings
//! beside the defaults (the settings' own rules are unit tests in
//! `predict::allocator` and `predict::expandable`).

mod common;

use assert_cmd::Command;

fn explain(args: &[&str]) -> std::process::Output {
    Command::cargo_bin("segtune")
        .unwrap()
        .arg("explain")
        .arg(common::readme_example())
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
        .arg(common::readme_example())
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

fn estimate_with(alloc_conf: &str) -> serde_json::Value {
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("estimate")
        .arg(common::readme_example())
        .args([
            "--preset",
            "rtx3050ti",
            "--batch-size",
            "2",
            "--crop",
            "512x512",
        ])
        .args(["--alloc-conf", alloc_conf, "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_b0_step_replayed_with_the_allocator_settings() {
    let default = estimate_with("");
    assert_eq!(default["alloc_conf"], "");
    assert!(default["default_peak_reserved_bytes"].is_null());
    let base = default["predicted_peak_reserved_bytes"].as_u64().unwrap();
    for conf in ["expandable_segments:True", "max_split_size_mb:128"] {
        let e = estimate_with(conf);
        assert_eq!(e["alloc_conf"], conf);
        assert_eq!(e["default_peak_reserved_bytes"].as_u64(), Some(base));
        let reserved = e["predicted_peak_reserved_bytes"].as_u64().unwrap();
        let allocated = e["predicted_peak_allocated_bytes"].as_u64().unwrap();
        assert!(reserved >= allocated);
        println!(
            "B0 2x512x512 fp32 peak reserved: {conf}: {:.1} MiB, defaults: {:.1} MiB ({:+.2}%)",
            reserved as f64 / 1048576.0,
            base as f64 / 1048576.0,
            100.0 * (reserved as f64 / base as f64 - 1.0)
        );
        if conf.starts_with("expandable") {
            // Within the 20 MiB page granularity of expandable segments.
            assert!(reserved <= base + (20 << 20), "{reserved} vs {base}");
        }
    }
    let bad = Command::cargo_bin("segtune")
        .unwrap()
        .args([
            "estimate",
            "x.py",
            "--vram",
            "4G",
            "--alloc-conf",
            "max_split_size_mb:8",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("more than 20"));
}
