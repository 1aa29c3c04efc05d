//! `segtune search --mode infer` end to end (predicted): SegFormer-B0's
//! Cityscapes 1024x1024 config on a 4 GiB card, whole against slide
//! inference in one table, the winner emitted as test settings that real
//! MMEngine loads, and the `--cfg-options` line pasted into bash.

mod common;

use assert_cmd::Command;

const CHECK: &str = r#"
import argparse, json
from mmengine.config import Config, DictAction
parser = argparse.ArgumentParser()
parser.add_argument('config')
parser.add_argument('--cfg-options', nargs='+', action=DictAction)
args = parser.parse_args()
cfg = Config.fromfile(args.config, import_custom_modules=False)
if args.cfg_options:
    cfg.merge_from_dict(args.cfg_options)
tc = cfg.model.test_cfg
print(json.dumps(dict(batch=cfg.test_dataloader.batch_size, mode=tc['mode'],
                      crop=list(tc.get('crop_size', [])) if tc['mode'] == 'slide' else None,
                      stride=list(tc.get('stride', [])) if tc['mode'] == 'slide' else None,
                      fp16=bool((cfg.get('test_cfg') or {}).get('fp16', False)))))
"#;

#[test]
fn inference_search_compares_whole_and_slide_and_emits_test_settings_mmengine_reads() {
    let Some(shared) = common::require_shared("search_infer") else {
        return;
    };
    let config = shared
        .join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb1-160k_cityscapes-1024x1024.py");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let run = |format: &str| {
        let o = Command::cargo_bin("segtune")
            .unwrap()
            .arg("search")
            .arg(&config)
            .args(["--mode", "infer", "--vram", "4G", "--out"])
            .arg(&out)
            .arg(format)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let table = run("--all");
    println!("{table}");
    assert!(table.contains("test images 1024x2048"), "{table}");
    assert!(
        table.contains("| whole") && table.contains("| slide 1024x1024/768x768"),
        "{table}"
    );
    let result: serde_json::Value = serde_json::from_str(&run("--json")).unwrap();
    assert_eq!(result["run_mode"], "infer");
    assert_eq!(
        result["trials_run"], 0,
        "the second run resumes from the journal"
    );
    let winner = &result["winner"]["candidate"];
    assert!(result["winner"]["record"]["status"] == "fits", "{result}");
    let emitted = std::path::PathBuf::from(result["emitted"][0].as_str().unwrap());
    let Some(python) = std::env::var_os("SEGTUNE_MMENGINE_PYTHON") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "SEGTUNE_MMENGINE_PYTHON is not set; run the tests through scripts/test"
        );
        eprintln!("SKIPPED the mmengine part: SEGTUNE_MMENGINE_PYTHON not set");
        return;
    };
    let python = std::path::PathBuf::from(python);
    let line = result["cfg_options"].as_str().unwrap();
    let read = common::mmengine_reads_emitted_and_pasted(&python, CHECK, &emitted, &config, line);
    assert_eq!(read["batch"], winner["batch_size"]);
    assert_eq!(read["fp16"], winner["amp"] == "fp16");
    match winner["test_mode"].as_object().and_then(|m| m.get("slide")) {
        Some(slide) => {
            assert_eq!(read["mode"], "slide");
            assert_eq!(read["crop"], slide["crop"]);
            assert_eq!(read["stride"], slide["stride"]);
        }
        None => assert_eq!(read["mode"], "whole"),
    }
}
