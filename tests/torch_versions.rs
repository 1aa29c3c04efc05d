//! Predicting for the PyTorch release the user runs: each memory-relevant
//! switch of `segtune::kinds::torch_version` moves the prediction where
//! (and only where) its release range says, `--stack zoo-2021` is 1.10, and
//! without `--torch` the release comes from the user's Python; the same for
//! the mmcv release (`--mmcv`, `segtune::kinds::mmcv_version`).

mod common;

use serde_json::Value;
use std::process::Command;

/// `segtune estimate` of the README example at 2x128x128 with `args`.
fn estimate(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_segtune"))
        .arg("estimate")
        .arg(common::readme_example())
        .args(["--vram", "8G", "--batch-size", "2", "--crop", "128x128"])
        .args(["--json"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn estimate_json(args: &[&str]) -> Value {
    let out = estimate(args, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn peak(report: &Value) -> i64 {
    report["predicted_peak_allocated_bytes"].as_i64().unwrap()
}

fn torch_note(report: &Value) -> String {
    report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|n| n.starts_with("predicted for PyTorch"))
        .expect("every estimate says the release it predicted for")
        .to_string()
}

#[test]
fn each_release_predicts_with_its_own_switches() {
    let at = |v: &str| estimate_json(&["--torch", v]);
    let (v1_10, v1_11, v1_13, v2_0, v2_11) =
        (at("1.10"), at("1.11"), at("1.13"), at("2.0"), at("2.11"));
    let params = 3_752_694.0; // SegFormer-B0, 150 classes (tests/model_params.rs)
    for (v, r) in [
        ("1.10", &v1_10),
        ("1.11", &v1_11),
        ("1.13", &v1_13),
        ("2.0", &v2_0),
        ("2.11", &v2_11),
    ] {
        println!(
            "PyTorch {v}: predicted peak {} bytes; {}",
            peak(r),
            torch_note(r)
        );
    }
    // softmax-keeps-input (<= 1.10): one more activation per softmax.
    assert!(
        peak(&v1_10) > peak(&v1_11),
        "softmax inputs are kept up to 1.10"
    );
    assert!(torch_note(&v1_10).contains("softmax/log_softmax save their input"));
    // cublas-workspace-in-allocator (1.13+): the forward's and autograd's
    // cuBLAS workspaces (8 MiB + 128 KiB each below sm_90) count in the
    // allocated peak; the peak's moment may move by up to a segment.
    let workspaces = (peak(&v1_13) - peak(&v1_11)) as f64;
    let two = 2.0 * 8_519_680.0;
    assert!(
        (two..two + (2 << 20) as f64).contains(&workspaces),
        "1.13 adds two cuBLAS workspaces: {workspaces} bytes"
    );
    // zero-grad-keeps-gradients (< 2.0): the gradients live through the
    // next forward, one float32 copy of the parameters (512-byte rounded).
    let kept = (peak(&v1_13) - peak(&v2_0)) as f64;
    assert!(
        (kept / (4.0 * params) - 1.0).abs() < 0.01,
        "1.13 keeps the gradients: {kept} bytes more than 2.0"
    );
    assert!(torch_note(&v1_13).contains("set_to_none=False"));
    // Nothing modelled moves a training step without CUDA's foreach from 2.0 on.
    assert_eq!(peak(&v2_0), peak(&v2_11));
    assert_eq!(
        torch_note(&v2_11),
        "predicted for PyTorch 2.11 (as given)",
        "the newest release has no switch to list"
    );
    // The named stack of earlier releases is 1.10.
    let zoo = estimate_json(&["--stack", "zoo-2021"]);
    assert_eq!(peak(&zoo), peak(&v1_10));
}

/// `segtune estimate` of an MMSeg zoo config at batch 1 on an 8 GB card:
/// the likeliest peak and the release note.
fn zoo_estimate(
    shared: &std::path::Path,
    config: &str,
    crop: &str,
    args: &[&str],
) -> (i64, String) {
    let config = shared.join("mmseg-configs/configs").join(config);
    let mut all = vec!["--vram", "8G", "--batch-size", "1", "--crop", crop];
    all.extend_from_slice(args);
    let report = common::estimate_json(&config, &all);
    (peak(&report), torch_note(&report))
}

#[test]
fn a_relu6_saves_its_result_up_to_1_9_and_a_copy_of_its_input_from_1_10() {
    let Some(shared) = common::require_shared("a_relu6_saves_its_result_up_to_1_9") else {
        return;
    };
    // MobileNetV2: every expansion and depthwise convolution ends in
    // ReLU6(inplace=True).
    let v2 = "mobilenet_v2/mobilenet-v2-d8_fcn_4xb2-80k_cityscapes-512x1024.py";
    let (v1_9, note) = zoo_estimate(&shared, v2, "128x128", &["--torch", "1.9"]);
    let (v1_10, _) = zoo_estimate(&shared, v2, "128x128", &["--torch", "1.10"]);
    let (v2_11, _) = zoo_estimate(&shared, v2, "128x128", &["--torch", "2.11"]);
    println!("MobileNetV2 1x128x128: 1.9 {v1_9}, 1.10 {v1_10}, 2.11 {v2_11} bytes");
    // 1.10 keeps one more activation per ReLU6: 18.7 MB of 197.8 here.
    let copies = (v1_10 - v1_9) as f64 / v1_10 as f64;
    assert!((0.05..0.15).contains(&copies), "1.10 over 1.9: {copies}");
    assert!(note.contains("in-place hardtanh_ (ReLU6(inplace=True)) saves its result"));
    // A model without ReLU6 does not move (the README example: 1.9 = 1.10).
    assert_eq!(
        peak(&estimate_json(&["--torch", "1.9"])),
        peak(&estimate_json(&["--torch", "1.10"]))
    );
}

#[test]
fn bce_with_logits_takes_four_temporaries_up_to_2_2_and_one_from_2_3() {
    let Some(shared) = common::require_shared("bce_with_logits_takes_four_temporaries") else {
        return;
    };
    // Fast-SCNN's auxiliary heads: CrossEntropyLoss(use_sigmoid=True) on
    // their full-size 19-class logits; the step's peak is in that loss.
    let fast_scnn = "fastscnn/fast_scnn_8xb4-160k_cityscapes-512x1024.py";
    let at = |v: &str| {
        let config = shared.join("mmseg-configs/configs").join(fast_scnn);
        let args = [
            "--vram",
            "8G",
            "--batch-size",
            "2",
            "--crop",
            "256x512",
            "--torch",
            v,
        ];
        peak(&common::estimate_json(&config, &args))
    };
    let (v2_2, v2_3) = (at("2.2"), at("2.3"));
    println!("Fast-SCNN 2x256x512: 2.2 {v2_2}, 2.3 {v2_3} bytes");
    // Three more 2x19x256x512 float32 temporaries (19.9 MB each) at the
    // peak, each rounded to the allocator's blocks.
    let logits = (2 * 19 * 256 * 512 * 4) as f64;
    let more = (v2_2 - v2_3) as f64 / logits;
    assert!((2.9..3.4).contains(&more), "2.2 over 2.3: {more} logits");
}

#[test]
fn mmcv_before_1_4_5_builds_hswish_as_its_own_composite() {
    let Some(shared) = common::require_shared("mmcv_before_1_4_5_builds_hswish") else {
        return;
    };
    let v3 = "mobilenet_v3/mobilenet-v3-d8_lraspp_4xb4-320k_cityscapes-512x1024.py";
    let at = |args: &[&str]| zoo_estimate(&shared, v3, "512x512", args);
    let (hardswish, plain_note) = at(&["--torch", "1.9"]);
    let (composite_1_9, note) = at(&["--torch", "1.9", "--mmcv", "1.2.4"]);
    let (composite_1_10, _) = at(&["--torch", "1.10", "--mmcv", "1.2.4"]);
    let (hardswish_1_4_5, note_1_4_5) = at(&["--torch", "1.9", "--mmcv", "1.4.5"]);
    println!(
        "MobileNetV3 1x512x512: nn.Hardswish {hardswish}, mmcv 1.2.4's HSwish {composite_1_9} (1.9) \
         {composite_1_10} (1.10) bytes"
    );
    assert_eq!(hardswish, hardswish_1_4_5, "1.4.5 has nn.Hardswish");
    assert!(!plain_note.contains("mmcv"), "{plain_note}");
    assert!(
        note_1_4_5.ends_with("; mmcv 1.4.5 (holds what 2.1.0 holds)"),
        "{note_1_4_5}"
    );
    assert!(
        note.contains("; mmcv 1.2.4: HSwish is mmcv's x * ReLU6(x + 3) / 6"),
        "{note}"
    );
    // The composite keeps x and ReLU6(x + 3) where nn.Hardswish keeps one
    // copy of x: one more activation per HSwish (16% here); from 1.10 the
    // in-place ReLU6 adds its copy of x + 3, one more again.
    let more = |a: i64, b: i64| (a - b) as f64 / b as f64;
    assert!(
        (0.10..0.25).contains(&more(composite_1_9, hardswish)),
        "{composite_1_9}"
    );
    let second = composite_1_10 - composite_1_9;
    let first = composite_1_9 - hardswish;
    assert!(
        (second as f64 / first as f64 - 1.0).abs() < 0.1,
        "{first} then {second}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_segtune"))
        .args(["estimate"])
        .arg(common::readme_example())
        .args(["--vram", "8G", "--mmcv", "2.2.0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("from 1.0.0 to 2.1.0"));
}

#[test]
fn foreach_optimizers_come_with_2_0_in_a_cuda_stand_in() {
    let trial = |v: &str| -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_segtune-torch"))
            .arg("trial")
            .arg(common::readme_example())
            .args(["--batch-size", "1", "--crop", "64x64", "--steps", "1"])
            .args(["--as-cuda", "--torch", v, "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["status"], "ok", "{report}");
        assert_eq!(report["torch"], v);
        report
    };
    let optimizer_peak = |r: &Value| -> i64 {
        let steps = r["steps"].as_array().unwrap();
        let last = steps.iter().rev().find(|s| s["measured"] == true).unwrap();
        last["optimizer_peak"].as_i64().unwrap() - last["bytes_before"].as_i64().unwrap()
    };
    let (loop_impl, foreach) = (trial("1.13"), trial("2.0"));
    println!(
        "AdamW step above the step's start: 1.13 (for-loop) {} bytes, 2.0 (foreach) {} bytes",
        optimizer_peak(&loop_impl),
        optimizer_peak(&foreach)
    );
    // foreach's temporaries span the whole param group, the for-loop's one
    // parameter at a time.
    assert!(optimizer_peak(&foreach) > optimizer_peak(&loop_impl));
}

#[test]
fn expandable_segments_are_refused_before_2_1() {
    let out = estimate(
        &["--torch", "2.0", "--alloc-conf", "expandable_segments:True"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PyTorch 2.0 has no such setting") && err.contains("#96995"),
        "{err}"
    );
    let report = estimate_json(&["--torch", "2.1", "--alloc-conf", "expandable_segments:True"]);
    assert!(peak(&report) > 0);
}

#[test]
fn releases_outside_the_table_are_refused_with_the_range() {
    for bad in ["1.7", "2.12", "2.x"] {
        let out = estimate(&["--torch", bad], &[]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("from 1.8 to 2.11"), "{bad}: {err}");
    }
    let out = estimate(&["--torch", "1.13", "--stack", "zoo-2021"], &[]);
    assert_eq!(out.status.code(), Some(2), "--torch and --stack conflict");
}

#[test]
fn without_torch_the_release_is_the_one_in_the_users_python() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("python-with-torch-1.13");
    std::fs::write(&fake, "#!/bin/sh\necho 1.13.1+cu117\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = estimate(&[], &[("SEGTUNE_PYTHON", fake.to_str().unwrap())]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let note = torch_note(&report);
    assert!(
        note.starts_with(&format!(
            "predicted for PyTorch 1.13 (the torch installed for {})",
            fake.display()
        )),
        "{note}"
    );
    assert_eq!(peak(&report), peak(&estimate_json(&["--torch", "1.13"])));
    // A Python without torch: the newest release, and the output says so.
    let out = estimate(&[], &[("SEGTUNE_PYTHON", "/nonexistent/python")]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        torch_note(&report).starts_with("predicted for PyTorch 2.11 (the release segtune links"),
        "{}",
        torch_note(&report)
    );
}

#[test]
fn a_search_reads_the_release_from_the_config_and_predicts_only() {
    let Some(shared) = common::require_shared("a_search_reads_the_release_from_the_config") else {
        return;
    };
    let base =
        shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py");
    let dir = tempfile::tempdir().unwrap();
    let search = |segtune: &str| {
        let config = common::write(
            &dir,
            "cfg.py",
            &format!(
                "_base_ = ['{}']\nsegtune = dict({segtune})\n",
                base.display()
            ),
        );
        let out = Command::new(env!("CARGO_BIN_EXE_segtune"))
            .arg("search")
            .arg(&config)
            .args(["--vram", "4G", "--device", "cuda:0", "--out"])
            .arg(dir.path().join("out"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{segtune}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    // A real trial would run 2.11: asking for a GPU for 1.13 is an error.
    let err = search("torch='1.13'");
    assert!(
        err.contains("measures with the PyTorch segtune links (2.11), not 1.13"),
        "{err}"
    );
    let err = search("torch=1.10");
    assert!(
        err.contains("`segtune.torch` must be a string such as '1.13', not the number 1.1"),
        "{err}"
    );
    let err = search("torch='3.0'");
    assert!(
        err.contains("`segtune.torch`: `3.0` is not a PyTorch release"),
        "{err}"
    );
}

#[test]
fn the_docs_table_lists_every_switch_with_its_releases_and_source() {
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/prediction.md"),
    )
    .unwrap();
    // `| `name` | from-until |` ... with the source.
    let has_row = |name: &str, releases: String, source: &str| {
        let row = format!("| `{name}` | {releases} |");
        let line = docs
            .lines()
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("docs/prediction.md has no row {row}"));
        assert!(line.contains(source), "{name}: the source differs");
    };
    for s in segtune::kinds::torch_version::SWITCHES {
        let until = s.until.unwrap_or(segtune::kinds::TorchVersion::NEWEST);
        has_row(s.name, format!("{}-{until}", s.from), s.source);
    }
    for s in segtune::kinds::mmcv_version::MMCV_SWITCHES {
        let until = s.until.unwrap_or(segtune::kinds::MmcvVersion::NEWEST);
        has_row(s.name, format!("{}-{until}", s.from), s.source);
    }
}
