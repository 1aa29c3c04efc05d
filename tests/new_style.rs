//! `segtune estimate` and `inspect` on MMEngine new-style configs (`with
//! read_base():`, classes imported for `type=`): the same model and the
//! same prediction as the old-style MMSeg 1.2.2 config it was written
//! after. (Their resolution against mmengine itself is in
//! `config_semantics.rs`.)

mod common;

use std::path::{Path, PathBuf};

fn new_style(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/new_style")
        .join(rel)
}

fn inspect_json(config: &Path) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_segtune"))
        .arg("inspect")
        .arg(config)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each new-style config and its old-style original predict the same
/// step to the byte, and build models with the same parameters.
#[test]
fn new_style_configs_estimate_as_their_old_style_originals() {
    let Some(shared) = common::require_shared("new_style") else {
        return;
    };
    let configs = shared.join("mmseg-configs/configs");
    let pairs = [
        (
            "pspnet/pspnet_r18_d8_4xb2_80k_cityscapes_512x1024.py",
            "pspnet/pspnet_r18-d8_4xb2-80k_cityscapes-512x1024.py",
        ),
        (
            "segformer/segformer_mit_b0_8xb2_160k_ade20k_512x512.py",
            "segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py",
        ),
        (
            "mask2former/mask2former_r50_8xb2_90k_cityscapes_512x1024.py",
            "mask2former/mask2former_r50_8xb2-90k_cityscapes-512x1024.py",
        ),
    ];
    for (new, old) in pairs {
        let (new, old) = (new_style(new), configs.join(old));
        let got = inspect_json(&new);
        let want = inspect_json(&old);
        for key in ["params_total", "params_trainable", "params_by_prefix"] {
            assert!(!got[key].is_null(), "{key} missing: {got}");
            assert_eq!(got[key], want[key], "{}: {key}", new.display());
        }
        let args = [
            "--preset",
            "rtx3050ti",
            "--batch-size",
            "2",
            "--crop",
            "256x256",
        ];
        let got = common::estimate_json(&new, &args);
        let want = common::estimate_json(&old, &args);
        for key in [
            "predicted_peak_allocated_bytes",
            "predicted_peak_reserved_bytes",
            "cpu_trace_peak_bytes",
        ] {
            assert!(got[key].is_number(), "{key} missing: {got}");
            assert_eq!(got[key], want[key], "{}: {key}", new.display());
        }
    }
}

/// `search` on a new-style config writes the winner fully resolved (an
/// old-style child of a new-style config is refused by MMEngine), with
/// `default_scope='mmseg'` so that the registered names it holds mean the
/// classes the original imported; it builds the same model.
#[test]
fn search_writes_a_standalone_config_for_a_new_style_recipe() {
    let config = new_style("pspnet/pspnet_r18_d8_4xb2_80k_cityscapes_512x1024.py");
    let out = tempfile::tempdir().unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_segtune"))
        .arg("search")
        .arg(&config)
        .args(["--preset", "rtx3050ti", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let emitted = out
        .path()
        .join("pspnet_r18_d8_4xb2_80k_cityscapes_512x1024_segtune.py");
    let text = std::fs::read_to_string(&emitted).unwrap();
    assert!(!text.contains("_base_ ="), "{text}");
    assert!(!segtune::config::is_new_style(&emitted));
    let cfg = segtune::config::resolve(&emitted, &[]).unwrap();
    assert_eq!(
        cfg["default_scope"],
        segtune::config::Value::Str("mmseg".into())
    );
    let (got, want) = (inspect_json(&emitted), inspect_json(&config));
    assert_eq!(got["params_total"], want["params_total"]);
    assert_eq!(got["model_type"], want["model_type"]);
}
