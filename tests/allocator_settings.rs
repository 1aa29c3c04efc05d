//! `estimate --alloc-conf`: the README example's step (SegFormer-B0
//! 2x512x512) replayed with PyTorch's allocator settings beside the
//! defaults. Prints the figures; the settings' own rules are unit tests in
//! `predict::allocator` and `predict::expandable`.

use assert_cmd::Command;

fn estimate(alloc_conf: &str) -> serde_json::Value {
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("estimate")
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("docs/examples/segformer_mit-b0_8xb2-160k_ade20k-512x512.rhai"),
        )
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
    let default = estimate("");
    assert_eq!(default["alloc_conf"], "");
    assert!(default["default_peak_reserved_bytes"].is_null());
    let base = default["predicted_peak_reserved_bytes"].as_u64().unwrap();
    for conf in ["expandable_segments:True", "max_split_size_mb:128"] {
        let e = estimate(conf);
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
