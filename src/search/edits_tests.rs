use super::*;
use crate::config::dump::from_json;

fn overrides(cfg: &Dict, w: &Winner) -> Dict {
    Written::of(cfg, w).overrides(cfg)
}

fn cfg_options_line(cfg: &Dict, w: &Winner) -> String {
    Written::of(cfg, w).cfg_options_line()
}

fn changes(cfg: &Dict, w: &Winner) -> Vec<Change> {
    Written::of(cfg, w).changes(cfg)
}

fn cfg(json: serde_json::Value) -> Dict {
    match from_json(&json) {
        Value::Dict(d) => d,
        _ => unreachable!(),
    }
}

fn candidate(batch: i64, crop: (i64, i64), amp: Amp, accumulation: i64) -> Candidate {
    Candidate {
        batch_size: batch,
        crop,
        amp,
        accumulation,
        checkpoint: false,
        num_points: None,
        test_mode: None,
    }
}

fn winner<'a>(recipe: &'a Recipe, c: Candidate, options: &'a [String]) -> Winner<'a> {
    Winner {
        candidate: c,
        recipe,
        gpus: 1,
        auto_scale_lr: None,
        cfg_options: options,
        schedule: Schedule::KeepUpdates,
        reasons: Reasons::default(),
    }
}

/// A recipe whose dataset is wrapped (`RepeatDataset`, as MMSeg's
/// HRF/DRIVE/STARE/CHASE_DB1 configs are): the crop goes into the
/// wrapped dataset's pipeline.
#[test]
fn a_wrapped_datasets_pipeline_gets_the_crop() {
    let cfg = cfg(serde_json::json!({
        "train_dataloader": {"batch_size": 4, "dataset": {
            "type": "RepeatDataset", "times": 40000, "dataset": {"pipeline": [
                {"type": "LoadImageFromFile"},
                {"type": "RandomCrop", "crop_size": {"__tuple__": [256, 256]}}
            ]}}},
        "optim_wrapper": {"type": "OptimWrapper"}
    }));
    let recipe = Recipe::of(&cfg, "x.py", 1, Some(4)).unwrap();
    let w = winner(&recipe, candidate(2, (128, 192), Amp::Off, 2), &[]);
    let o = overrides(&cfg, &w);
    let crop = o
        .get("train_dataloader")
        .and_then(|d| d.get_path("dataset.dataset.pipeline"))
        .and_then(Value::as_seq)
        .and_then(|p| p[1].get_path("crop_size"))
        .cloned();
    assert_eq!(crop, Some(tuple((128, 192))));
    let line = cfg_options_line(&cfg, &w);
    assert!(
        line.contains("train_dataloader.dataset.dataset.pipeline.1.crop_size=(128,192)"),
        "{line}"
    );
}

/// A 64x64 crop padded to 256x256 by the preprocessor: at the recipe's
/// input nothing about the crop is written; at a smaller input the
/// padding shrinks and the crop is never enlarged.
#[test]
fn a_padded_crop_is_kept_and_never_enlarged() {
    let cfg = cfg(serde_json::json!({
        "crop_size": {"__tuple__": [64, 64]},
        "train_dataloader": {"batch_size": 8, "dataset": {"pipeline": [
            {"type": "RandomCrop", "crop_size": {"__tuple__": [64, 64]}}]}},
        "model": {"data_preprocessor": {"size": {"__tuple__": [256, 256]}}},
        "optim_wrapper": {"type": "OptimWrapper"}
    }));
    let recipe = Recipe::of(&cfg, "x.py", 1, None).unwrap();
    assert_eq!(recipe.crop, (256, 256), "the network's input");
    let kept = winner(&recipe, candidate(4, (256, 256), Amp::Off, 2), &[]);
    let paths: Vec<String> = edits(&cfg, &kept).into_iter().map(|e| e.path).collect();
    assert_eq!(
        paths,
        [
            "train_dataloader.batch_size",
            "optim_wrapper.accumulative_counts"
        ]
    );
    let smaller = winner(&recipe, candidate(8, (224, 224), Amp::Off, 1), &[]);
    let e = edits(&cfg, &smaller);
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].path, "model.data_preprocessor.size");
    assert_eq!(e[0].value, tuple((224, 224)));
}

/// The recipe's precision and schedule: an fp32 winner writes no
/// optimizer wrapper type; accumulation scales the iteration counts.
#[test]
fn the_recipes_precision_stays_and_the_schedule_keeps_its_updates() {
    let cfg = cfg(serde_json::json!({
        "crop_size": {"__tuple__": [512, 512]},
        "train_dataloader": {"batch_size": 8},
        "optim_wrapper": {"type": "OptimWrapper", "optimizer": {"type": "SGD", "lr": 0.01}},
        "train_cfg": {"type": "IterBasedTrainLoop", "max_iters": 160000, "val_interval": 16000},
        "param_scheduler": [{"type": "PolyLR", "by_epoch": false, "begin": 0, "end": 160000}]
    }));
    let recipe = Recipe::of(&cfg, "deeplabv3plus_r50-d8_4xb8-160k_x-512x512.py", 1, None).unwrap();
    assert_eq!(recipe.effective_batch, 32);
    let w = winner(&recipe, candidate(4, (512, 512), Amp::Off, 8), &[]);
    let e: Vec<(String, Value)> = edits(&cfg, &w)
        .into_iter()
        .map(|e| (e.path, e.value))
        .collect();
    assert_eq!(
        e,
        [
            ("train_dataloader.batch_size", Value::Int(4)),
            ("optim_wrapper.accumulative_counts", Value::Int(8)),
            ("train_cfg.max_iters", Value::Int(1_280_000)),
            ("train_cfg.val_interval", Value::Int(128_000)),
            ("param_scheduler.0.end", Value::Int(1_280_000)),
        ]
        .map(|(k, v)| (k.to_string(), v))
    );
    let o = overrides(&cfg, &w);
    assert!(
        o.get("param_scheduler").and_then(Value::as_seq).is_some(),
        "written whole"
    );
    assert_eq!(
        o.get("optim_wrapper").and_then(|ow| ow.get_path("type")),
        None,
        "the wrapper merges, its type kept"
    );
    let keep_iters = Winner {
        schedule: Schedule::KeepIters,
        ..winner(&recipe, candidate(4, (512, 512), Amp::Off, 8), &[])
    };
    assert_eq!(edits(&cfg, &keep_iters).len(), 2);
    let bf16 = winner(&recipe, candidate(4, (512, 512), Amp::Bf16, 8), &[]);
    let line = cfg_options_line(&cfg, &bf16);
    assert!(
        line.contains("optim_wrapper.type=AmpOptimWrapper optim_wrapper.dtype=bfloat16 optim_wrapper.loss_scale=dynamic"),
        "{line}"
    );
}

/// A batch the user's `--cfg-options` set and the winner changes is
/// written once, at the winner's value.
#[test]
fn a_users_option_the_winner_sets_again_is_the_winners() {
    let cfg = cfg(serde_json::json!({
        "crop_size": {"__tuple__": [512, 512]},
        "train_dataloader": {"batch_size": 4},
        "optim_wrapper": {"type": "OptimWrapper"}
    }));
    let recipe = Recipe::of(&cfg, "x.py", 1, Some(4)).unwrap();
    let options = vec!["train_dataloader.batch_size=4".to_string()];
    let w = winner(&recipe, candidate(2, (512, 512), Amp::Off, 2), &options);
    let written = Written::of(&cfg, &w);
    let batch: Vec<&Edit> = written
        .edits
        .iter()
        .filter(|e| e.path == "train_dataloader.batch_size")
        .collect();
    assert_eq!(batch.len(), 1);
    assert_eq!(batch[0].value, Value::Int(2));
    assert!(!batch[0].from_user);
    assert_eq!(
        overrides(&cfg, &w)
            .get("train_dataloader")
            .and_then(|d| d.get_path("batch_size")),
        Some(&Value::Int(2))
    );
}

/// The search's `--cfg-options` are part of the written config and of
/// the printed line.
#[test]
fn the_users_cfg_options_are_written() {
    let cfg = cfg(serde_json::json!({
        "crop_size": {"__tuple__": [512, 512]},
        "train_dataloader": {"batch_size": 2},
        "model": {"decode_head": {"num_classes": 19}},
        "optim_wrapper": {"type": "OptimWrapper"}
    }));
    let recipe = Recipe::of(&cfg, "x.py", 1, Some(2)).unwrap();
    let options = vec!["model.decode_head.num_classes=19".to_string()];
    let w = winner(&recipe, candidate(1, (512, 512), Amp::Off, 2), &options);
    let o = overrides(&cfg, &w);
    assert_eq!(
        o.get("model")
            .and_then(|m| m.get_path("decode_head.num_classes")),
        Some(&Value::Int(19))
    );
    let line = cfg_options_line(&cfg, &w);
    assert!(
        line.starts_with(
            "--cfg-options model.decode_head.num_classes=19 train_dataloader.batch_size=1"
        ),
        "{line}"
    );
    assert!(changes(&cfg, &w)
        .iter()
        .all(|c| c.key != "model.decode_head.num_classes"));
}

#[test]
fn a_checkpointed_candidate_sets_the_backbones_with_cp() {
    let cfg = cfg(serde_json::json!({
        "crop_size": {"__tuple__": [512, 512]},
        "train_dataloader": {"batch_size": 2},
        "optim_wrapper": {"type": "OptimWrapper"}
    }));
    let recipe = Recipe::of(&cfg, "x.py", 1, Some(16)).unwrap();
    let c = Candidate {
        checkpoint: true,
        ..candidate(2, (512, 512), Amp::Bf16, 8)
    };
    let w = winner(&recipe, c, &[]);
    let o = overrides(&cfg, &w);
    assert_eq!(
        o.get("model").and_then(|m| m.get_path("backbone.with_cp")),
        Some(&Value::Bool(true))
    );
    let line = cfg_options_line(&cfg, &w);
    assert!(line.contains(" model.backbone.with_cp=True "), "{line}");
    let plain = winner(
        &recipe,
        Candidate {
            checkpoint: false,
            ..c
        },
        &[],
    );
    assert!(overrides(&cfg, &plain)
        .get("model")
        .and_then(|m| m.get_path("backbone"))
        .is_none());
    assert!(!cfg_options_line(&cfg, &plain).contains("with_cp"));
}

#[test]
fn a_lowered_point_count_sets_the_heads_train_cfg() {
    let cfg = cfg(serde_json::json!({
        "crop_size": {"__tuple__": [512, 512]},
        "train_dataloader": {"batch_size": 2},
        "optim_wrapper": {"type": "OptimWrapper"}
    }));
    let recipe = Recipe::of(&cfg, "x.py", 1, Some(16)).unwrap();
    let c = Candidate {
        num_points: Some(6272),
        ..candidate(2, (512, 512), Amp::Off, 8)
    };
    let w = winner(&recipe, c, &[]);
    assert_eq!(
        overrides(&cfg, &w)
            .get("model")
            .and_then(|m| m.get_path("decode_head.train_cfg.num_points")),
        Some(&Value::Int(6272))
    );
    let line = cfg_options_line(&cfg, &w);
    assert!(
        line.contains(" model.decode_head.train_cfg.num_points=6272"),
        "{line}"
    );
}
