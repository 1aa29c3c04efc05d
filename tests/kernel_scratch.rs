//! The two figures of a prediction on a CNN, end to end through
//! `segtune estimate`: the least the step needs (every tensor, the kernels'
//! scratch, the smallest workspace each convolution runs with) and what the
//! user's log will show on the card (cuDNN's workspaces bounded by the
//! memory free there). The recipe is the one of most public MMSeg 1.x
//! homework logs: PSPNet R-50-D8, batch 8, 256x256, fp32, cudnn_benchmark
//! on (MMSeg 1.x's default runtime).

mod common;

use serde_json::Value;
use std::process::Command;

fn estimate(config: &std::path::Path, args: &[&str]) -> Value {
    let mut all = vec!["--batch-size", "8", "--crop", "256x256"];
    all.extend_from_slice(args);
    common::estimate_json(config, &all)
}

fn bytes(report: &Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} in {report}"))
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

#[test]
fn the_least_figure_is_the_cards_own_and_the_log_figure_grows_with_free_memory() {
    let Some(shared) = common::require_shared("kernel_scratch") else {
        return;
    };
    let config =
        shared.join("mmseg-configs/configs/pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py");
    let laptop = estimate(&config, &["--preset", "rtx3050ti-laptop"]);
    let desktop = estimate(&config, &["--preset", "rtx3090"]);
    for (name, r) in [("3050 Ti", &laptop), ("3090", &desktop)] {
        let least = bytes(r, "predicted_min_peak_allocated_bytes");
        let (low, likely, high) = (
            bytes(r, "predicted_peak_allocated_low_bytes"),
            bytes(r, "predicted_peak_allocated_bytes"),
            bytes(r, "predicted_peak_allocated_high_bytes"),
        );
        let first = bytes(r, "predicted_first_interval_peak_allocated_bytes");
        eprintln!(
            "{name}: least {:.3} GiB, log {:.3} GiB ({:.3} to {:.3}), first interval {:.3} GiB",
            gib(least),
            gib(likely),
            gib(low),
            gib(high),
            gib(first)
        );
        assert!(least <= low && low <= likely && likely <= high, "{name}");
        assert!(
            high as f64 <= 1.35 * low as f64,
            "{name}: the range's high end is at most 35% over its low end"
        );
        assert!(
            first >= likely,
            "{name}: the first interval holds the search"
        );
        assert_eq!(
            r["cudnn_benchmark"], true,
            "MMSeg 1.x's runtime turns it on"
        );
    }
    assert_eq!(
        bytes(&laptop, "predicted_min_peak_allocated_bytes"),
        bytes(&desktop, "predicted_min_peak_allocated_bytes"),
        "the least the step needs does not depend on the card"
    );
    assert!(
        bytes(&laptop, "predicted_peak_allocated_bytes")
            <= bytes(&desktop, "predicted_peak_allocated_bytes"),
        "free memory bounds the workspaces: the 4 GB card's log shows no more than the 24 GB card's"
    );
    assert!(
        bytes(&desktop, "predicted_peak_allocated_bytes")
            > bytes(&desktop, "predicted_min_peak_allocated_bytes"),
        "on a 24 GB card cuDNN takes workspace for faster convolutions"
    );
    // Benchmark off: heuristic choices, no search in the first interval.
    let off = estimate(
        &config,
        &["--preset", "rtx3090", "--cudnn-benchmark", "off"],
    );
    assert_eq!(off["cudnn_benchmark"], false);
    assert_eq!(
        bytes(&off, "predicted_min_peak_allocated_bytes"),
        bytes(&desktop, "predicted_min_peak_allocated_bytes")
    );
    assert!(
        bytes(&off, "predicted_first_interval_peak_allocated_bytes")
            <= bytes(&desktop, "predicted_first_interval_peak_allocated_bytes")
    );
}

#[test]
fn estimate_and_explain_say_both_figures_in_words_and_name_the_workspace() {
    let Some(shared) = common::require_shared("kernel_scratch words") else {
        return;
    };
    let config =
        shared.join("mmseg-configs/configs/pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py");
    for command in ["estimate", "explain"] {
        let out = Command::new(env!("CARGO_BIN_EXE_segtune"))
            .arg(command)
            .arg(&config)
            .args([
                "--batch-size",
                "8",
                "--crop",
                "256x256",
                "--preset",
                "rtx3090",
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("{text}");
        assert!(
            text.contains("needs ")
                && text.contains("on the rtx3090 (24 GB) your log will show about"),
            "{command}: {text}"
        );
        assert!(
            text.contains("cuDNN takes free memory for faster convolutions"),
            "{command}: {text}"
        );
        if command == "explain" {
            assert!(text.contains("cuDNN workspace"), "{text}");
        }
    }
}
