//! `segtune resolve --format py` output, loaded by real mmengine
//! (mmengine-lite 0.10.7 in the venv `scripts/setup-tests` makes), gives the same
//! values and types as mmengine's resolution of the original config.

mod common;

use assert_cmd::Command;
use std::path::PathBuf;

/// The venv python with mmengine-lite, from `SEGTUNE_MMENGINE_PYTHON`.
fn mmengine_python() -> Option<PathBuf> {
    let p = std::env::var_os("SEGTUNE_MMENGINE_PYTHON").map(PathBuf::from)?;
    p.is_file().then_some(p)
}

#[test]
fn dumped_python_configs_load_back_in_mmengine() {
    let name = "dumped_python_configs_load_back_in_mmengine";
    let Some(shared) = common::require_shared(name) else {
        return;
    };
    let Some(python) = mmengine_python() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!(
                "{name}: SEGTUNE_MMENGINE_PYTHON is not set; run the tests through scripts/test"
            );
        }
        eprintln!("SKIPPED {name}: SEGTUNE_MMENGINE_PYTHON not set (scripts/test sets it)");
        return;
    };
    let root = shared.join("mmseg-configs/configs");
    let configs = common::configs_under(&root);
    // Every 14th config (55 of 769), plus the dict-comprehension ones.
    let mut sample: Vec<PathBuf> = configs.iter().step_by(14).cloned().collect();
    sample.extend(
        configs
            .iter()
            .filter(|p| p.to_string_lossy().contains("mask2former_swin-t_8xb2-160k"))
            .cloned(),
    );
    let out_dir = tempfile::tempdir().unwrap();
    let mut rels = Vec::new();
    for path in &sample {
        let rel = path.strip_prefix(&root).unwrap().to_path_buf();
        let out = Command::cargo_bin("segtune")
            .unwrap()
            .arg("resolve")
            .arg(path)
            .args(["--format", "py"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            rel.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let dest = out_dir.path().join(&rel);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(&dest, &out.stdout).unwrap();
        rels.push(rel.to_string_lossy().to_string());
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mmengine_load.py");
    let run = std::process::Command::new(python)
        .arg(script)
        .arg(out_dir.path())
        .arg(shared.join("mmseg-configs/resolved"))
        .args(&rels)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&run.stdout);
    println!(
        "mmengine loaded segtune's dumps of {} configs: {}",
        rels.len(),
        report.lines().last().unwrap_or("")
    );
    assert!(
        run.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(rels.len() >= 50);
}
