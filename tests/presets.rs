//! GPU presets as users name them: `segtune presets [--json]`, `--preset`
//! by slug or by the name nvidia-smi prints, "did you mean" on a miss, and
//! the local card found by nvidia-smi (a fake one on PATH here).

use assert_cmd::Command;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

mod common;

fn segtune() -> Command {
    Command::cargo_bin("segtune").unwrap()
}

/// `segtune presets --json`, parsed.
fn presets_json() -> Vec<serde_json::Value> {
    let out = segtune().args(["presets", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// Every card issue 47 names, as nvidia-smi prints it or by a slug.
const ISSUE_47_CARDS: &[(&str, &str)] = &[
    ("NVIDIA GeForce GTX 1080 Ti", "gtx1080ti"),
    ("GeForce GTX 1080", "gtx1080"),
    ("NVIDIA GeForce GTX 1070", "gtx1070"),
    ("NVIDIA GeForce GTX 1060 6GB", "gtx1060-6gb"),
    ("NVIDIA GeForce GTX 1650", "gtx1650"),
    ("NVIDIA GeForce GTX 1660 Ti", "gtx1660ti"),
    ("NVIDIA GeForce RTX 2060", "rtx2060"),
    ("NVIDIA GeForce RTX 2070", "rtx2070"),
    ("NVIDIA GeForce RTX 2080", "rtx2080"),
    ("NVIDIA GeForce RTX 2080 Ti", "rtx2080ti"),
    ("NVIDIA TITAN RTX", "titan-rtx"),
    ("NVIDIA GeForce RTX 3050 Ti Laptop GPU", "rtx3050ti-laptop"),
    ("NVIDIA GeForce RTX 3060", "rtx3060"),
    ("NVIDIA GeForce RTX 3060 Ti", "rtx3060ti"),
    ("NVIDIA GeForce RTX 3060 Laptop GPU", "rtx3060-laptop"),
    ("NVIDIA GeForce RTX 3070", "rtx3070"),
    ("NVIDIA GeForce RTX 3070 Laptop GPU", "rtx3070-laptop"),
    ("NVIDIA GeForce RTX 3080", "rtx3080"),
    ("NVIDIA GeForce RTX 3080 Ti Laptop GPU", "rtx3080ti-laptop"),
    ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
    ("NVIDIA GeForce RTX 4050 Laptop GPU", "rtx4050-laptop"),
    ("NVIDIA GeForce RTX 4060", "rtx4060"),
    ("NVIDIA GeForce RTX 4060 Laptop GPU", "rtx4060-laptop"),
    ("NVIDIA GeForce RTX 4060 Ti", "rtx4060ti"),
    ("NVIDIA GeForce RTX 4070", "rtx4070"),
    ("NVIDIA GeForce RTX 4070 Laptop GPU", "rtx4070-laptop"),
    ("NVIDIA GeForce RTX 4070 Ti", "rtx4070ti"),
    ("NVIDIA GeForce RTX 4080", "rtx4080"),
    ("GeForce RTX 4090", "rtx4090"),
    ("NVIDIA GeForce RTX 5080", "rtx5080"),
    ("NVIDIA GeForce RTX 5090", "rtx5090"),
    ("Tesla P100-PCIE-16GB", "p100-pcie-16gb"),
    ("Tesla T4", "t4"),
    ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("Tesla V100-PCIE-16GB", "v100-pcie-16gb"),
    ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A40", "a40"),
    ("NVIDIA RTX A6000", "rtx-a6000"),
    ("NVIDIA RTX A4000", "rtx-a4000"),
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"),
];

#[test]
fn presets_json_has_every_card_with_every_field() {
    let cards = presets_json();
    assert!(cards.len() >= 45, "{} cards", cards.len());
    for card in &cards {
        let slug = card["preset"].as_str().unwrap();
        for field in ["name", "architecture", "form", "compute_capability", "link"] {
            assert!(card[field].is_string(), "{slug} {field}");
        }
        for field in [
            "vram_mib",
            "sms",
            "boost_clock_mhz",
            "fp32_tflops",
            "fp16_tflops",
            "bf16_tflops",
            "tf32_tflops",
            "memory_bandwidth_gbs",
            "l2_kib",
            "link_gbs",
        ] {
            assert!(card[field].is_number(), "{slug} {field}");
        }
        assert!(
            card["bf16"].is_boolean() && card["tensor_cores"].is_boolean(),
            "{slug}"
        );
        assert!(
            !card["nvidia_smi_names"].as_array().unwrap().is_empty(),
            "{slug}"
        );
    }
    let slugs: Vec<&str> = cards
        .iter()
        .map(|c| c["preset"].as_str().unwrap())
        .collect();
    for (_, slug) in ISSUE_47_CARDS {
        assert!(slugs.contains(slug), "{slug} missing from presets --json");
    }
    // The table: one line per card, with its rates.
    let out = segtune().arg("presets").output().unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    for slug in slugs {
        assert!(
            table.contains(&format!(" {slug} ")),
            "{slug} not in the table"
        );
    }
    assert!(
        table.contains("TF32") && table.contains("NVLink 3 (600 GB/s)"),
        "{table}"
    );
}

/// `segtune estimate` of the README's example config on `gpu`, as JSON
/// (nothing is traced twice: the trace cache is off, the step is small).
fn estimate(gpu: &[&str], path: Option<&str>) -> (serde_json::Value, String, bool) {
    let mut cmd = segtune();
    cmd.arg("estimate")
        .arg(common::readme_example())
        .args(["--batch-size", "1", "--crop", "64x64", "--json"])
        .args(gpu);
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (json, err, out.status.success())
}

#[test]
fn every_card_of_issue_47_resolves_by_the_name_nvidia_smi_prints() {
    let cards = presets_json();
    for (name, slug) in ISSUE_47_CARDS {
        let card = cards
            .iter()
            .find(|c| c["preset"] == *slug)
            .unwrap_or_else(|| panic!("{slug}"));
        let names: Vec<&str> = card["nvidia_smi_names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        assert!(
            names.iter().any(|n| n.eq_ignore_ascii_case(name)) || card["name"] == *name,
            "{slug}: `{name}` is not among {names:?}"
        );
    }
    // Through the CLI: by nvidia-smi's names, case and spacing aside.
    for name in [
        "NVIDIA GeForce RTX 3060 Laptop GPU",
        "Tesla T4",
        "GeForce RTX 4090",
        "nvidia  geforce rtx 3060 laptop gpu",
        "TESLA T4",
        "rtx3050ti",
        "3050ti",
    ] {
        let (json, err, ok) = estimate(&["--preset", name], None);
        assert!(ok, "{name}: {err}");
        let want = match name.to_lowercase() {
            n if n.contains("3060") => "rtx3060-laptop",
            n if n.contains("t4") => "t4",
            n if n.contains("4090") => "rtx4090",
            _ => "rtx3050ti-laptop",
        };
        assert_eq!(json["gpu"], want, "{name}");
    }
}

#[test]
fn a_misspelt_preset_gets_the_closest_card() {
    let out = segtune()
        .args(["estimate", "x.py", "--preset", "RTX 3060 Laptp"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown GPU preset `RTX 3060 Laptp`"), "{err}");
    assert!(
        err.contains("did you mean `rtx3060-laptop` (NVIDIA GeForce RTX 3060 Laptop GPU)?"),
        "{err}"
    );
    assert!(err.contains("segtune presets"), "{err}");
    assert!(!err.contains("rtx5090"), "a suggestion, not a list: {err}");
    // A config's import of a preset takes names too, and misses the same way.
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write(
        &dir,
        "c.rhai",
        "import \"NVIDIA GeForce RTX 3060 Laptop GPU\" as gpu;\nlet vram = gpu::vram_mib;\n",
    );
    let out = segtune()
        .args(["resolve", "--format", "json"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("6144"));
}

/// A directory holding a fake `nvidia-smi` that prints `line` (or fails).
fn fake_nvidia_smi(dir: &Path, script: &str) -> String {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let smi = bin.join("nvidia-smi");
    std::fs::write(&smi, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn the_local_card_is_found_by_nvidia_smi() {
    let dir = tempfile::tempdir().unwrap();
    // A card of the table: its preset, said on stderr.
    let path = fake_nvidia_smi(
        dir.path(),
        "echo 'NVIDIA GeForce RTX 3060 Laptop GPU, 6144, 8.6'",
    );
    let (json, err, ok) = estimate(&[], Some(&path));
    assert!(ok, "{err}");
    assert_eq!(json["gpu"], "rtx3060-laptop", "{err}");
    assert!(
        err.contains(
            "GPU: NVIDIA GeForce RTX 3060 Laptop GPU (preset rtx3060-laptop, found by nvidia-smi)"
        ),
        "{err}"
    );
    let (by_name, _, _) = estimate(&["--preset", "rtx3060-laptop"], None);
    assert_eq!(
        json["predicted_peak_allocated_bytes"], by_name["predicted_peak_allocated_bytes"],
        "the found card predicts as its preset"
    );
    // --preset or --vram given: nvidia-smi is not asked.
    let (json, err, _) = estimate(&["--vram", "4G"], Some(&path));
    assert_eq!(json["gpu"], "custom");
    assert!(!err.contains("found by nvidia-smi"), "{err}");

    // A card the table lacks: custom, of its memory and compute capability.
    let other = tempfile::tempdir().unwrap();
    let path = fake_nvidia_smi(other.path(), "echo 'NVIDIA RTX A2000 12GB, 12282, 8.6'");
    let (json, err, ok) = estimate(&[], Some(&path));
    assert!(ok, "{err}");
    assert_eq!(json["gpu"], "custom");
    assert_eq!(json["vram_bytes"], 12282u64 << 20);
    assert!(
        err.contains("GPU: NVIDIA RTX A2000 12GB (12282 MiB, compute capability 8.6"),
        "{err}"
    );

    // nvidia-smi failing (no driver): the error as before.
    let broken = tempfile::tempdir().unwrap();
    let path = fake_nvidia_smi(broken.path(), "echo 'NVIDIA-SMI has failed' >&2; exit 9");
    let (_, err, ok) = estimate(&[], Some(&path));
    assert!(!ok);
    assert!(err.contains("give --vram SIZE or --preset NAME"), "{err}");
}
