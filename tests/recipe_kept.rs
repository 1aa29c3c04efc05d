//! The user's recipe, made to fit (issue 45): configs written as users
//! write them (a stock file name kept while the batch, the GPUs, the crop's
//! padding, the class count or the precision changed; `--cfg-options`; an
//! MMSeg 0.x config), searched in predicted mode, and every written config
//! loaded by real mmengine: it keeps the user's effective batch, crop,
//! precision and optimizer updates unless the `changes` list says
//! otherwise, and why.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};

/// What mmengine reads of a config (the original with the search's
/// `--cfg-options` merged, as tools/train.py does, or a written one).
const FACTS: &str = r#"
import argparse, json
from mmengine.config import Config, DictAction
parser = argparse.ArgumentParser()
parser.add_argument('config')
parser.add_argument('--cfg-options', nargs='+', action=DictAction)
args = parser.parse_args()
cfg = Config.fromfile(args.config, import_custom_modules=False)
if args.cfg_options:
    cfg.merge_from_dict(args.cfg_options)
ds = cfg.train_dataloader.dataset
while 'pipeline' not in ds and 'dataset' in ds:
    ds = ds.dataset
ow = cfg.optim_wrapper
size = cfg.model.data_preprocessor.get('size')
print(json.dumps(dict(
    batch=cfg.train_dataloader.batch_size,
    accumulation=ow.get('accumulative_counts', 1),
    ow=ow.type, dtype=ow.get('dtype'),
    max_iters=cfg.train_cfg.get('max_iters'),
    ends=[s.get('end') for s in cfg.param_scheduler],
    crops=[list(t['crop_size']) for t in ds.pipeline if t['type'] == 'RandomCrop'],
    size=list(size) if size else None,
    num_classes=cfg.model.decode_head.num_classes,
    auto_scale_lr=cfg.get('auto_scale_lr'))))
"#;

fn mmengine_python() -> Option<PathBuf> {
    let python = std::env::var_os("SEGTUNE_MMENGINE_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    if python.is_none() {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "SEGTUNE_MMENGINE_PYTHON is not set; run the tests through scripts/test"
        );
        eprintln!("SKIPPED the mmengine part: SEGTUNE_MMENGINE_PYTHON not set");
    }
    python
}

/// mmengine's facts of `config` with `options` merged.
fn facts(python: &Path, config: &Path, options: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("facts.py");
    std::fs::write(&script, FACTS).unwrap();
    let mut cmd = std::process::Command::new(python);
    cmd.arg(&script).arg(config);
    if !options.is_empty() {
        cmd.arg("--cfg-options").args(options);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "mmengine cannot load {}:\n{}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A user's config in `dir`, `_base_` one of MMSeg's own by absolute path.
fn user_config(dir: &Path, name: &str, base: &Path, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("_base_ = {:?}\n{body}", base.display().to_string()),
    )
    .unwrap();
    path
}

/// `segtune search --json` of `config` (predicted): the result.
fn search_json(config: &Path, out: &Path, args: &[&str]) -> Value {
    let output = common::search_command_on(config, out, &[])
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "search {} {args:?} failed:\n{}",
        config.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn changed(result: &Value, key: &str) -> bool {
    result["changes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["key"] == key)
}

/// The written config against the recipe: effective batch, optimizer
/// updates, crop and precision kept unless `changes` says otherwise (each
/// change with a reason); the class count and the rest of `options` kept.
fn check_written(python: &Path, config: &Path, options: &[&str], result: &Value, effective: i64) {
    let written = PathBuf::from(result["emitted"][0].as_str().unwrap());
    let recipe = facts(python, config, options);
    let got = facts(python, &written, &[]);
    println!("recipe {recipe}\nwritten {got}");
    for c in result["changes"].as_array().unwrap() {
        assert!(!c["why"].as_str().unwrap().is_empty(), "{c}");
    }
    let gpus = result["gpus"].as_i64().unwrap();
    if !changed(result, "auto_scale_lr.enable") {
        assert_eq!(
            got["batch"].as_i64().unwrap() * got["accumulation"].as_i64().unwrap() * gpus,
            effective,
            "{got}"
        );
    }
    if let (Some(recipe_iters), Some(iters)) =
        (recipe["max_iters"].as_i64(), got["max_iters"].as_i64())
    {
        let updates = |iters: i64, facts: &Value| iters / facts["accumulation"].as_i64().unwrap();
        assert_eq!(
            updates(iters, &got),
            updates(recipe_iters, &recipe),
            "optimizer updates kept"
        );
    }
    if !changed(result, "model.data_preprocessor.size") {
        assert_eq!(got["size"], recipe["size"]);
        assert_eq!(got["crops"], recipe["crops"]);
    }
    for (i, (old, new)) in recipe["crops"]
        .as_array()
        .unwrap()
        .iter()
        .zip(got["crops"].as_array().unwrap())
        .enumerate()
    {
        for side in 0..2 {
            assert!(
                new[side].as_i64() <= old[side].as_i64(),
                "RandomCrop {i} enlarged: {old} -> {new}"
            );
        }
    }
    if !changed(result, "optim_wrapper.type") && !changed(result, "optim_wrapper.dtype") {
        assert_eq!(got["ow"], recipe["ow"]);
        assert_eq!(got["dtype"], recipe["dtype"]);
    }
    assert_eq!(got["num_classes"], recipe["num_classes"]);
    // The printed line pasted after the original reads as the written file.
    if let Some(line) = result["cfg_options"].as_str() {
        let items: Vec<String> =
            shlex::split(line.strip_prefix("--cfg-options ").unwrap()).unwrap();
        let items: Vec<&str> = items.iter().map(String::as_str).collect();
        let pasted = facts(python, config, &items);
        assert_eq!(pasted, got, "{line}");
    }
}

/// A stock DeepLabV3+ file name (4xb8) kept by a user who trains at batch
/// 4 on one GPU with 5 classes: the effective batch is the config's 4, the
/// name's 32 is only a note; `--effective-batch 32` trains as the name says.
#[test]
fn a_stale_file_name_does_not_set_the_effective_batch() {
    let Some(shared) = common::require_shared("a_stale_file_name_does_not_set_the_effective_batch")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base = shared.join(
        "mmseg-configs/configs/deeplabv3plus/deeplabv3plus_r50-d8_4xb4-160k_ade20k-512x512.py",
    );
    let config = user_config(
        dir.path(),
        "deeplabv3plus_r50-d8_4xb8-160k_mydata-512x512.py",
        &base,
        "train_dataloader = dict(batch_size=4)\nmodel = dict(decode_head=dict(num_classes=5), auxiliary_head=dict(num_classes=5))\n",
    );
    let result = search_json(&config, &dir.path().join("out"), &["--preset", "rtx3090"]);
    assert_eq!(
        result["recipe"]["effective_batch"], 4,
        "{}",
        result["recipe"]
    );
    let note = result["recipe"]["name_note"].as_str().unwrap();
    assert!(note.contains("--effective-batch 32"), "{note}");
    let winner = &result["winner"]["candidate"];
    assert_eq!(
        winner["batch_size"].as_i64().unwrap() * winner["accumulation"].as_i64().unwrap(),
        4
    );
    // On a 3090 the recipe fits as it is: fp32 kept, nothing changed.
    assert_eq!(winner["amp"], "off", "{winner}");
    assert_eq!(result["recipe_outcome"]["record"]["status"], "fits");
    assert_eq!(
        result["changes"],
        serde_json::json!([]),
        "{}",
        result["changes"]
    );
    if let Some(python) = mmengine_python() {
        check_written(&python, &config, &[], &result, 4);
    }
    let named = search_json(
        &config,
        &dir.path().join("out32"),
        &["--preset", "rtx3050ti", "--effective-batch", "32"],
    );
    assert_eq!(named["recipe"]["effective_batch"], 32);
    assert!(named["recipe"]["effective_batch_source"]
        .as_str()
        .unwrap()
        .contains("--effective-batch"));
    assert!(
        changed(&named, "train_cfg.max_iters"),
        "{}",
        named["changes"]
    );
    if let Some(python) = mmengine_python() {
        check_written(&python, &config, &[], &named, 32);
    }
}

/// A one-GPU recipe without NxbB in its name, searched for two GPUs: the
/// effective batch is batch x GPUs x accumulation; `--cfg-options` set the
/// classes and are in the written config and the printed line.
#[test]
fn gpus_and_cfg_options_are_kept() {
    let Some(shared) = common::require_shared("gpus_and_cfg_options_are_kept") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base =
        shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py");
    let config = user_config(
        dir.path(),
        "my_segformer.py",
        &base,
        "train_dataloader = dict(batch_size=8)\n",
    );
    let options = ["model.decode_head.num_classes=19"];
    let result = search_json(
        &config,
        &dir.path().join("out"),
        &[
            "--preset",
            "rtx3050ti",
            "--gpus",
            "2",
            "--cfg-options",
            options[0],
        ],
    );
    assert_eq!(result["recipe"]["effective_batch"], 16);
    let line = result["cfg_options"].as_str().unwrap();
    assert!(line.contains("model.decode_head.num_classes=19"), "{line}");
    if let Some(python) = mmengine_python() {
        check_written(&python, &config, &options, &result, 16);
        let written = PathBuf::from(result["emitted"][0].as_str().unwrap());
        assert_eq!(facts(&python, &written, &[])["num_classes"], 19);
    }
}

/// DRIVE's 64x64 crop padded to 256x256 by the preprocessor: the network's
/// input is 256x256, and the written config never enlarges the crop.
#[test]
fn a_crop_padded_by_the_preprocessor_is_not_rewritten() {
    let Some(shared) = common::require_shared("a_crop_padded_by_the_preprocessor_is_not_rewritten")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base = shared.join("mmseg-configs/configs/unet/unet-s5-d16_fcn_4xb4-40k_drive-64x64.py");
    let config = user_config(
        dir.path(),
        "unet_drive_padded.py",
        &base,
        "data_preprocessor = dict(size=(256, 256))\nmodel = dict(data_preprocessor=data_preprocessor)\n\
         train_dataloader = dict(batch_size=16)\n",
    );
    // Room at 256x256 on the 3050 Ti; a 1000 MiB budget needs a smaller
    // input (224x224, predicted): the padding shrinks, the 64x64 crop stays.
    let budgets: [(&[&str], &str); 2] = [
        (&["--preset", "rtx3050ti"], "out"),
        (&["--vram", "1000M"], "out1000"),
    ];
    for (budget, out) in budgets {
        let result = search_json(&config, &dir.path().join(out), budget);
        assert_eq!(result["recipe"]["crop"], serde_json::json!([256, 256]));
        let input = result["winner"]["candidate"]["crop"].clone();
        assert_eq!(
            changed(&result, "model.data_preprocessor.size"),
            input != serde_json::json!([256, 256]),
            "{}",
            result["changes"]
        );
        if let Some(python) = mmengine_python() {
            // Its own name has no NxbB: batch 16 x 1 GPU.
            check_written(&python, &config, &[], &result, 16);
            let written = PathBuf::from(result["emitted"][0].as_str().unwrap());
            let got = facts(&python, &written, &[]);
            assert_eq!(got["crops"], serde_json::json!([[64, 64]]));
            assert_eq!(got["size"], input);
        }
    }
}

/// Precision is the recipe's wherever it fits: an fp32 recipe with room
/// stays fp32, an fp16 recipe stays fp16 (no switch to bf16 on a tie);
/// `--objective throughput` may take half precision for speed.
#[test]
fn the_recipes_precision_is_kept_where_it_fits() {
    let Some(shared) = common::require_shared("the_recipes_precision_is_kept_where_it_fits") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base =
        shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py");
    let fp32 = search_json(&base, &dir.path().join("fp32"), &["--preset", "rtx3090"]);
    assert_eq!(
        fp32["winner"]["candidate"]["amp"], "off",
        "{}",
        fp32["winner"]
    );
    assert!(!changed(&fp32, "optim_wrapper.type"));
    let fp16 = user_config(
        dir.path(),
        "segformer_fp16.py",
        &base,
        "optim_wrapper = dict(type='AmpOptimWrapper', loss_scale='dynamic')\n",
    );
    let result = search_json(&fp16, &dir.path().join("fp16"), &["--preset", "rtx3050ti"]);
    assert_eq!(result["recipe"]["amp"], "fp16");
    assert_eq!(
        result["winner"]["candidate"]["amp"], "fp16",
        "{}",
        result["winner"]
    );
    if let Some(python) = mmengine_python() {
        check_written(&python, &fp16, &[], &result, 2);
    }
    let fast = search_json(
        &base,
        &dir.path().join("fast"),
        &["--preset", "rtx3090", "--objective", "throughput"],
    );
    let amp = fast["winner"]["candidate"]["amp"].as_str().unwrap();
    if amp != "off" {
        let why = fast["changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["key"] == "optim_wrapper.type")
            .expect("the precision change is listed")["why"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(why.contains("faster"), "{why}");
    }
}

/// `--schedule keep-iters` leaves the iteration counts and says what the
/// schedule then trains; the text shows the changes block.
#[test]
fn keep_iters_says_the_updates_it_loses() {
    let Some(shared) = common::require_shared("keep_iters_says_the_updates_it_loses") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base =
        shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py");
    let out = common::search_command(&base, &dir.path().join("out"))
        .args(["--schedule", "keep-iters"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    println!("{text}");
    assert!(text.contains("Changes from your recipe:"), "{text}");
    assert!(!text.contains("train_cfg.max_iters"), "{text}");
    assert!(text.contains("schedule: 160k iterations = "), "{text}");
    assert!(
        text.contains("(--schedule keep-updates keeps its updates)"),
        "{text}"
    );
}

/// An MMSeg 0.x config is named as such, with what to change, exit 2.
#[test]
fn an_mmseg_0x_config_is_named_with_what_to_change() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fcn_0x.py");
    std::fs::write(
        &config,
        "crop_size = (512, 1024)\n\
         model = dict(type='EncoderDecoder', backbone=dict(type='ResNetV1c', depth=50),\n\
         \x20   decode_head=dict(type='FCNHead', in_channels=2048, channels=512, num_classes=19))\n\
         data = dict(samples_per_gpu=2, workers_per_gpu=2, train=dict(type='CityscapesDataset'))\n\
         optimizer = dict(type='SGD', lr=0.01, momentum=0.9)\n\
         optimizer_config = dict()\n\
         runner = dict(type='IterBasedRunner', max_iters=40000)\n",
    )
    .unwrap();
    let out = common::search_command(&config, &dir.path().join("out"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MMSeg 0.x config"), "{err}");
    assert!(
        err.contains("data.samples_per_gpu -> train_dataloader = dict(batch_size=...)"),
        "{err}"
    );
    assert!(!dir.path().join("out/fcn_0x_segtune.py").exists());
}

/// `--vram 8` is 8 bytes: asked back as 8G.
#[test]
fn a_vram_without_a_unit_below_a_mebibyte_asks_for_gigabytes() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::search_command_on(
        &common::readme_example(),
        &dir.path().join("o"),
        &["--vram", "8"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean 8G?"), "{err}");
}
