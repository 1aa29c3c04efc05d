//! Golden outputs: `inspect --json` and `estimate --json` of 20 configs
//! across the families, and `search --json` of 6, byte for byte against
//! `tests/fixtures/golden/` (paths normalised). A change that should not
//! move any figure (a refactoring) keeps them; one that should names what
//! moved when it writes them again:
//! `SEGTUNE_BLESS=1 cargo test --test golden`.

mod common;

use std::path::Path;

/// (name, config under mmseg-configs/configs, estimate arguments).
const CONFIGS: [(&str, &str, &str); 20] = [
    (
        "segformer_b0",
        "segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512",
        "2 256x256 off",
    ),
    (
        "segformer_b2_fp16",
        "segformer/segformer_mit-b2_8xb2-160k_ade20k-512x512",
        "2 256x256 fp16",
    ),
    (
        "pspnet_r50",
        "pspnet/pspnet_r50-d8_4xb4-80k_ade20k-512x512",
        "4 256x256 off",
    ),
    (
        "deeplabv3plus_r50",
        "deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024",
        "2 256x512 off",
    ),
    (
        "fcn_r50_bf16",
        "fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024",
        "2 256x512 bf16",
    ),
    (
        "upernet_r50",
        "upernet/upernet_r50_4xb4-80k_ade20k-512x512",
        "2 256x256 off",
    ),
    (
        "ocrnet_hr18",
        "ocrnet/ocrnet_hr18_4xb2-40k_cityscapes-512x1024",
        "2 256x512 off",
    ),
    (
        "unet_hrf",
        "unet/unet-s5-d16_fcn_4xb4-40k_hrf-256x256",
        "4 256x256 off",
    ),
    (
        "swin_t_upernet",
        "swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512",
        "2 256x256 off",
    ),
    (
        "vit_deit_s_upernet",
        "vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512",
        "2 256x256 off",
    ),
    (
        "segmenter_t",
        "segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512",
        "1 256x256 off",
    ),
    (
        "convnext_t_fp16",
        "convnext/convnext-tiny_upernet_8xb2-amp-160k_ade20k-512x512",
        "2 256x256 fp16",
    ),
    (
        "knet_r50",
        "knet/knet-s3_r50-d8_fcn_8xb2-adamw-80k_ade20k-512x512",
        "2 256x256 off",
    ),
    (
        "mask2former_r50",
        "mask2former/mask2former_r50_8xb2-160k_ade20k-512x512",
        "2 256x256 off",
    ),
    (
        "pointrend_r50",
        "point_rend/pointrend_r50_4xb2-80k_cityscapes-512x1024",
        "2 256x512 off",
    ),
    (
        "icnet_r18",
        "icnet/icnet_r18-d8_4xb2-80k_cityscapes-832x832",
        "2 256x256 off",
    ),
    (
        "bisenetv1_r18",
        "bisenetv1/bisenetv1_r18-d32_4xb4-160k_cityscapes-1024x1024",
        "2 256x256 off",
    ),
    (
        "twins_pcpvt_s",
        "twins/twins_pcpvt-s_fpn_fpnhead_8xb4-80k_ade20k-512x512",
        "2 256x256 off",
    ),
    (
        "poolformer_s12",
        "poolformer/fpn_poolformer_s12_8xb4-40k_ade20k-512x512",
        "2 256x256 off",
    ),
    (
        "mobilenet_v2_fcn",
        "mobilenet_v2/mobilenet-v2-d8_fcn_4xb4-160k_ade20k-512x512",
        "2 256x256 off",
    ),
];

/// The configs whose whole search is compared (small enough for the suite).
const SEARCHED: [&str; 6] = [
    "segformer_b0",
    "pspnet_r50",
    "fcn_r50_bf16",
    "unet_hrf",
    "icnet_r18",
    "mobilenet_v2_fcn",
];

fn golden_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden")
}

/// Paths that differ between machines and runs, replaced by placeholders.
fn normalised(text: &str, shared: &Path, out: &Path) -> String {
    text.replace(&out.display().to_string(), "<out>")
        .replace(
            &shared
                .canonicalize()
                .unwrap_or(shared.to_path_buf())
                .display()
                .to_string(),
            "<shared>",
        )
        .replace(&shared.display().to_string(), "<shared>")
}

fn segtune_json(args: &[&str], config: &Path) -> String {
    let out = assert_cmd::Command::cargo_bin("segtune")
        .unwrap()
        .arg(args[0])
        .arg(config)
        .args(&args[1..])
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?} {}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Compares `text` with the golden file `name`, or writes it under
/// `SEGTUNE_BLESS=1`; returns a difference to report.
fn compare(name: &str, text: &str) -> Option<String> {
    let path = golden_dir().join(name);
    if std::env::var("SEGTUNE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, text).unwrap();
        return None;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (SEGTUNE_BLESS=1 writes it)", path.display()));
    (want != text).then(|| {
        let diff = similar::TextDiff::from_lines(want.as_str(), text);
        let lines: Vec<String> = diff
            .unified_diff()
            .context_radius(1)
            .to_string()
            .lines()
            .take(40)
            .map(str::to_string)
            .collect();
        format!("{name}:\n{}", lines.join("\n"))
    })
}

#[test]
fn inspect_and_estimate_are_unchanged() {
    let Some(shared) = common::require_shared("inspect_and_estimate_are_unchanged") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut differences = Vec::new();
    for (name, config, setting) in CONFIGS {
        let path = shared
            .join("mmseg-configs/configs")
            .join(format!("{config}.py"));
        let inspect = segtune_json(&["inspect"], &path);
        differences.extend(compare(
            &format!("{name}.inspect.json"),
            &normalised(&inspect, &shared, dir.path()),
        ));
        let parts: Vec<&str> = setting.split(' ').collect();
        let estimate = segtune_json(
            &[
                "estimate",
                "--preset",
                "rtx3090",
                "--batch-size",
                parts[0],
                "--crop",
                parts[1],
                "--amp",
                parts[2],
                "--torch",
                "2.11",
            ],
            &path,
        );
        differences.extend(compare(
            &format!("{name}.estimate.json"),
            &normalised(&estimate, &shared, dir.path()),
        ));
    }
    assert!(differences.is_empty(), "{}", differences.join("\n\n"));
}

#[test]
fn searches_are_unchanged() {
    let Some(shared) = common::require_shared("searches_are_unchanged") else {
        return;
    };
    let mut differences = Vec::new();
    for (name, config, _) in CONFIGS.iter().filter(|c| SEARCHED.contains(&c.0)) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let path = shared
            .join("mmseg-configs/configs")
            .join(format!("{config}.py"));
        let run = common::search_command(&path, &out)
            .args(["--json", "--torch", "2.11"])
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        let text = String::from_utf8(run.stdout).unwrap();
        differences.extend(compare(
            &format!("{name}.search.json"),
            &normalised(&text, &shared, &out),
        ));
    }
    assert!(differences.is_empty(), "{}", differences.join("\n\n"));
}
