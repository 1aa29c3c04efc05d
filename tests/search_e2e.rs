//! `segtune search` end to end on the CPU (predicted mode): the table, the
//! journal, the emitted config (loaded back by real mmengine) and resuming
//! without new trials. Failing trials reported as infeasible are the
//! strategy's unit tests (`search::strategy`, with a fake evaluator).

mod common;

use assert_cmd::Command;
use std::path::{Path, PathBuf};

fn b0(shared: &Path) -> PathBuf {
    shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py")
}

use common::{search_command, search_command_on, RTX3050TI};

/// Runs a command that must succeed; returns its stdout.
fn stdout_of(cmd: &mut Command) -> Vec<u8> {
    let output = cmd.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// Runs the search twice, as a table and as JSON (the second run resumes).
fn search(config: &Path, out: &Path, budget: &[&str]) -> (String, serde_json::Value) {
    let run = |format: &str| stdout_of(search_command_on(config, out, budget).arg(format));
    let table = String::from_utf8(run("--all")).unwrap();
    (table, serde_json::from_slice(&run("--json")).unwrap())
}

/// Searches `config` (under `configs/`) for a 3050 Ti twice (the second run
/// resumes from the journal), then checks that the winner keeps the
/// recipe's `effective_batch` and that real mmengine loads the emitted
/// config with the winner's batch, crop, accumulation and precision.
fn search_emits_a_config_mmengine_reads(
    name: &str,
    config: &str,
    effective_batch: i64,
) -> serde_json::Value {
    search_on_emits_a_config_mmengine_reads(name, config, effective_batch, RTX3050TI)
}

/// [`search_emits_a_config_mmengine_reads`] on another budget.
fn search_on_emits_a_config_mmengine_reads(
    name: &str,
    config: &str,
    effective_batch: i64,
    budget: &[&str],
) -> serde_json::Value {
    let Some(shared) = common::require_shared(name) else {
        return serde_json::Value::Null;
    };
    let config = shared.join("mmseg-configs/configs").join(config);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let started = std::time::Instant::now();
    let (table, result) = search(&config, &out, budget);
    println!("{table}");
    println!(
        "{name}: search on {} (this build) took {:.1} s including a journal re-read",
        budget.join(" "),
        started.elapsed().as_secs_f64()
    );
    assert!(
        table.contains("rank | batch |")
            && table.contains("predicted")
            && table.contains("device GiB: the peak memory PyTorch's caching allocator reserves"),
        "{table}"
    );
    if budget == RTX3050TI {
        assert!(
            table.contains("on rtx3050ti-laptop (GeForce RTX 3050 Ti Laptop GPU, 4.00 GiB,"),
            "{table}"
        );
    }
    assert!(out.join("trials.jsonl").is_file());
    // The second (JSON) invocation resumed everything from the journal.
    assert_eq!(result["trials_run"], 0, "{result}");
    assert!(result["trials_resumed"].as_u64().unwrap() > 0);
    // The winner's candidate, with the allocator setting it needs, if any.
    let mut winner = result["winner"]["candidate"].clone();
    winner["alloc_conf"] = result["winner"]["record"]["alloc_conf"].clone();
    let batch = winner["batch_size"].as_i64().unwrap();
    let accumulation = winner["accumulation"].as_i64().unwrap();
    assert_eq!(batch * accumulation, effective_batch, "{winner}");
    let emitted = PathBuf::from(result["emitted"][0].as_str().unwrap());
    assert!(emitted.is_file());
    if let Some(conf) = winner["alloc_conf"].as_str() {
        let line = format!("PYTORCH_CUDA_ALLOC_CONF={conf}");
        assert!(table.contains(&line), "{table}");
        let header = std::fs::read_to_string(&emitted).unwrap();
        assert!(header.lines().next().unwrap().contains(&line), "{header}");
    }

    let Some(python) = std::env::var_os("SEGTUNE_MMENGINE_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
    else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!(
                "{name}: SEGTUNE_MMENGINE_PYTHON is not set; run the tests through scripts/test"
            );
        }
        eprintln!("SKIPPED the mmengine part of {name}: SEGTUNE_MMENGINE_PYTHON not set");
        return winner.clone();
    };
    // The emitted config, or the original with the printed --cfg-options
    // parsed by MMEngine's own DictAction (as tools/train.py parses them).
    let check = r#"
import argparse, json, sys
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
crops = [t['crop_size'] for t in ds.pipeline if t['type'] == 'RandomCrop']
print(json.dumps(dict(batch=cfg.train_dataloader.batch_size, pipeline_crops=[list(c) for c in crops],
                      preprocessor=list(cfg.model.data_preprocessor.size), ow=cfg.optim_wrapper.type,
                      dtype=cfg.optim_wrapper.get('dtype'), accumulation=cfg.optim_wrapper.get('accumulative_counts', 1),
                      with_cp=bool(cfg.model.backbone.get('with_cp', False)),
                      num_points=(cfg.model.decode_head.get('train_cfg') or {}).get('num_points'))))
"#;
    // The printed line pasted into bash after the original config.
    let line = result["cfg_options"].as_str().unwrap();
    let read = common::mmengine_reads_emitted_and_pasted(&python, check, &emitted, &config, line);
    let crop = serde_json::json!([winner["crop"][0], winner["crop"][1]]);
    assert_eq!(read["batch"], batch);
    assert_eq!(read["pipeline_crops"], serde_json::json!([crop.clone()]));
    assert_eq!(read["preprocessor"], crop);
    assert_eq!(read["accumulation"], accumulation);
    let amp = winner["amp"].as_str().unwrap();
    let want_dtype = match amp {
        "fp16" => serde_json::json!("float16"),
        "bf16" => serde_json::json!("bfloat16"),
        _ => serde_json::Value::Null,
    };
    assert_eq!(read["dtype"], want_dtype);
    assert_eq!(
        read["ow"],
        if amp == "off" {
            "OptimWrapper"
        } else {
            "AmpOptimWrapper"
        }
    );
    assert_eq!(
        read["batch"].as_i64().unwrap() * read["accumulation"].as_i64().unwrap(),
        effective_batch
    );
    assert_eq!(
        read["with_cp"],
        winner["checkpoint"].as_bool().unwrap_or(false),
        "{read}"
    );
    if let Some(k) = winner["num_points"].as_i64() {
        assert_eq!(read["num_points"], k, "{read}");
    }
    winner.clone()
}

#[test]
fn search_b0_on_a_3050ti_emits_a_config_mmengine_reads() {
    search_emits_a_config_mmengine_reads(
        "search_b0_on_a_3050ti_emits_a_config_mmengine_reads",
        "segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py",
        16,
    );
}

/// A full-crop ResNet-50-D8 search: with meta traces (no compute, no host
/// RAM for tensors) it takes about 40 s in a debug build on 2 cores, where
/// CPU-allocator traces took over a minute and 12.7 GB per step.
#[test]
fn search_deeplabv3plus_r50_on_a_3050ti_emits_a_config_mmengine_reads() {
    search_emits_a_config_mmengine_reads(
        "search_deeplabv3plus_r50_on_a_3050ti_emits_a_config_mmengine_reads",
        "deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024.py",
        8,
    );
}

/// Swin-T UPerNet at its 512x512 crop does not fit a 4 GB card at any
/// batch that keeps the effective batch with the allocator's defaults and
/// without gradient checkpointing (predicted): its winner keeps the crop
/// with `expandable_segments:True` (printed as the environment line) or
/// with `with_cp`.
#[test]
fn search_swin_t_on_a_3050ti_keeps_the_crop_with_gradient_checkpointing() {
    let winner = search_emits_a_config_mmengine_reads(
        "search_swin_t_on_a_3050ti_keeps_the_crop_with_gradient_checkpointing",
        "swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py",
        16,
    );
    if winner.is_null() {
        return;
    }
    assert!(
        winner["checkpoint"] == true || winner["alloc_conf"] == "expandable_segments:True",
        "{winner}"
    );
    assert_eq!(winner["crop"], serde_json::json!([512, 512]), "{winner}");
}

#[test]
fn search_unet_hrf_on_a_3050ti_emits_a_config_mmengine_reads() {
    search_emits_a_config_mmengine_reads(
        "search_unet_hrf_on_a_3050ti_emits_a_config_mmengine_reads",
        "unet/unet-s5-d16_fcn_4xb4-40k_hrf-256x256.py",
        16,
    );
}

#[test]
fn an_impossible_budget_is_a_clear_error() {
    let Some(shared) = common::require_shared("an_impossible_budget_is_a_clear_error") else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let run = Command::cargo_bin("segtune")
        .unwrap()
        .arg("search")
        .arg(b0(&shared))
        .args(["--vram", "200M", "--quiet", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert!(run.stdout.is_empty());
    assert!(String::from_utf8_lossy(&run.stderr).contains("leaves nothing after the CUDA context"));
    let bad = Command::cargo_bin("segtune")
        .unwrap()
        .arg("search")
        .arg(b0(&shared))
        .args(["--vram", "4X"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown unit"));
}

#[test]
fn schemas_are_json_schemas() {
    for which in ["search", "result"] {
        let out = Command::cargo_bin("segtune")
            .unwrap()
            .args(["schema", which])
            .output()
            .unwrap();
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(
            v["$schema"].is_string() && v["properties"].is_object(),
            "{v}"
        );
    }
}

#[test]
fn search_on_two_gpus_keeps_the_effective_batch_across_them() {
    let Some(shared) =
        common::require_shared("search_on_two_gpus_keeps_the_effective_batch_across_them")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let stdout = stdout_of(
        search_command(&b0(&shared), &dir.path().join("out")).args(["--gpus", "2", "--json"]),
    );
    let result: serde_json::Value = serde_json::from_slice(&stdout).unwrap();
    assert_eq!(result["gpus"], 2);
    // 8xb2 recipe: 16 images per optimizer step, now from 2 GPUs.
    for outcome in result["feasible"].as_array().unwrap() {
        let c = &outcome["candidate"];
        let batch = c["batch_size"].as_i64().unwrap();
        assert!(batch <= 8, "{c}");
        if 16 % (2 * batch) == 0 {
            assert_eq!(2 * batch * c["accumulation"].as_i64().unwrap(), 16, "{c}");
        }
    }
    let winner = &result["winner"]["candidate"];
    assert_eq!(
        2 * winner["batch_size"].as_i64().unwrap() * winner["accumulation"].as_i64().unwrap(),
        16,
        "{winner}"
    );
    let journal = std::fs::read_to_string(result["journal"].as_str().unwrap()).unwrap();
    assert!(
        journal.contains(":x2"),
        "trials for 2 GPUs are journalled as such"
    );
}

/// Mask2Former R50 with every ADE20K class in every image on a 2.6 GiB
/// card: nothing fits at 512x512 without the knobs (a 448x448 crop would),
/// so the search checkpoints the backbone and lowers the point count until
/// one image fits at the recipe's crop. 90 meta traces: 376 s in a debug
/// build on the 2-core machine, so outside the suite (`cargo test --test
/// search_e2e -- --ignored`).
#[test]
#[ignore = "90 Mask2Former traces, about 6 minutes in a debug build"]
fn search_mask2former_on_a_small_card_lowers_num_points() {
    let winner = search_on_emits_a_config_mmengine_reads(
        "search_mask2former_on_a_small_card_lowers_num_points",
        "mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py",
        16,
        &["--vram", "2700M", "--gt-segments", "all"],
    );
    if winner.is_null() {
        return;
    }
    assert_eq!(winner["crop"], serde_json::json!([512, 512]), "{winner}");
    assert!(winner["num_points"].as_i64().is_some(), "{winner}");
}

/// Mask2Former R-50 on ADE20K where only a smaller crop fits (1.6 GB): the
/// smaller crops' groups and the fallback passes (checkpointing and lower
/// `num_points`) start at the smallest batch, the most frugal pass first,
/// so the search evaluates 36 of the grid's 135 candidates (126 when every
/// group's binary search started in the middle; 304 s then, 33 s now in
/// the release build) and finds the winner those 126 found.
#[test]
fn mask2former_on_a_tight_card_is_searched_in_under_a_third_of_its_grid() {
    let name = "mask2former_on_a_tight_card_is_searched_in_under_a_third_of_its_grid";
    let Some(shared) = common::require_shared(name) else {
        return;
    };
    let config = shared
        .join("mmseg-configs/configs/mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py");
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let result: serde_json::Value = serde_json::from_slice(&stdout_of(
        search_command_on(&config, &dir.path().join("out"), &["--vram", "1.6G"])
            .args(["--torch", "2.11", "--json"]),
    ))
    .unwrap();
    println!(
        "{name}: {} trials, {:.1} s (this build)",
        result["trials_run"],
        started.elapsed().as_secs_f64()
    );
    let (trials, grid) = (
        result["trials_run"].as_u64().unwrap(),
        result["grid_size"].as_u64().unwrap(),
    );
    assert_eq!(grid, 135, "{result}");
    assert!(trials * 10 <= grid * 3, "{trials} of {grid}: {result}");
    assert_eq!(
        result["winner"]["candidate"],
        serde_json::json!({
            "batch_size": 1,
            "crop": [320, 320],
            "amp": "bf16",
            "accumulation": 16,
            "checkpoint": false
        }),
        "{result}"
    );
}
