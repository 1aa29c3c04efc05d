//! The user's recipe as they run it, and what a search changes of it: the
//! effective batch and where it comes from (`--effective-batch`,
//! `auto_scale_lr.base_batch_size`, the file name's `NxbB` only where it
//! agrees with the config, else batch x GPUs x accumulation), the
//! recipe's precision and crop, the iteration-counted schedule that
//! MMEngine's loops count in micro-batches (scaled so the recipe's
//! optimizer updates are kept, `--schedule`), and the list of every change
//! the written config makes, each with its reason.

use crate::config::{Dict, Value};
use crate::kinds::Amp;
use regex::Regex;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the recipe trains with.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Recipe {
    pub batch_size: i64,
    /// The network's input: the training crop, padded to
    /// `data_preprocessor.size` where that is larger.
    pub crop: (i64, i64),
    /// GPUs x batch per GPU x accumulation of the recipe.
    pub effective_batch: i64,
    /// Where the effective batch comes from.
    pub effective_batch_source: String,
    /// `optim_wrapper.accumulative_counts` of the recipe (1: none).
    #[serde(default = "one")]
    pub accumulation: i64,
    /// The recipe's precision (`AmpOptimWrapper`'s dtype; off: fp32).
    #[serde(default = "fp32")]
    pub amp: Amp,
    /// Where the file name's `NxbB` and the config disagree: both figures
    /// and how to choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_note: Option<String>,
}

fn one() -> i64 {
    1
}

fn fp32() -> Amp {
    Amp::Off
}

/// How a search keeps the recipe's schedule when the batch per iteration
/// changes (`--schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// Iteration-counted settings scaled so the recipe's optimizer updates
    /// (and, with its effective batch, its samples seen) are kept.
    #[default]
    KeepUpdates,
    /// Iteration-counted settings as the recipe has them: with more
    /// accumulation, fewer optimizer updates.
    KeepIters,
}

crate::named::named_enum!(Schedule, "a schedule", {
    KeepUpdates => "keep-updates",
    KeepIters => "keep-iters",
});

/// The recipe's precision: `AmpOptimWrapper` with `dtype` bfloat16 is bf16,
/// with float16 or none fp16; any other wrapper fp32.
pub fn recipe_amp(cfg: &Dict) -> Amp {
    let Some(ow) = cfg.get("optim_wrapper") else {
        return Amp::Off;
    };
    if ow.get_path("type").and_then(Value::as_str) != Some("AmpOptimWrapper") {
        return Amp::Off;
    }
    match ow.get_path("dtype").and_then(Value::as_str) {
        Some("bfloat16" | "bf16") => Amp::Bf16,
        _ => Amp::Fp16,
    }
}

/// The recipe's `optim_wrapper.accumulative_counts` (1: none).
pub fn recipe_accumulation(cfg: &Dict) -> i64 {
    crate::config::train_loop::accumulation(cfg)
}

/// The file name's `NxbB` (GPUs, batch per GPU), as MMSeg names its configs.
pub fn name_layout(file_name: &str) -> Option<(i64, i64)> {
    let c = Regex::new(r"(?:^|_)(\d+)xb(\d+)(?:[-_.]|$)")
        .expect("static regex")
        .captures(file_name)?;
    Some((c[1].parse().ok()?, c[2].parse().ok()?))
}

impl Recipe {
    /// Reads the recipe from a resolved config and its file name:
    /// `effective` (`--effective-batch`, `segtune.effective_batch`) first,
    /// then `auto_scale_lr.base_batch_size`, then the name's `NxbB` where
    /// its batch is the config's, else batch x `gpus` x accumulation.
    pub fn of(
        cfg: &Dict,
        file_name: &str,
        gpus: i64,
        effective: Option<i64>,
    ) -> Result<Recipe, String> {
        let batch_size = crate::predict::estimate::recipe_batch_size(cfg)
            .ok_or("the config has no train_dataloader.batch_size")?;
        let crop = crate::predict::estimate::recipe_crop(cfg).ok_or(
            "the config has no crop size (crop_size, RandomCrop or data_preprocessor.size)",
        )?;
        let accumulation = recipe_accumulation(cfg);
        let base = cfg
            .get("auto_scale_lr")
            .and_then(|a| a.get_path("base_batch_size"))
            .and_then(Value::as_i64)
            .filter(|n| *n > 0);
        let name = name_layout(file_name);
        let from_config = batch_size * gpus * accumulation;
        let config_words = format!(
            "train_dataloader.batch_size {batch_size} x {gpus} GPU{} x accumulation {accumulation}",
            if gpus == 1 { "" } else { "s" }
        );
        let mut name_note = None;
        let (effective_batch, source) = if let Some(n) = effective {
            (
                n,
                "--effective-batch (or segtune.effective_batch)".to_string(),
            )
        } else if let Some(n) = base {
            (n, "auto_scale_lr.base_batch_size".to_string())
        } else {
            match name {
                Some((n, b)) if b == batch_size => (
                    n * b * accumulation,
                    format!(
                        "the config name's {n}xb{b} ({n} GPUs x batch {b}, x accumulation {accumulation})"
                    ),
                ),
                _ => (from_config, config_words.clone()),
            }
        };
        if let Some((n, b)) = name {
            let named = n * b * accumulation;
            if b != batch_size && named != effective_batch {
                name_note = Some(format!(
                    "the file name says {n}xb{b} (effective batch {named}) but the config trains at \
                     batch {batch_size}: the effective batch is {effective_batch}, from {source}; \
                     to train as the name says, give --effective-batch {named}"
                ));
            }
        }
        if effective_batch < 1 {
            return Err(format!(
                "the effective batch is {effective_batch} (from {source}): give a whole number of 1 or more"
            ));
        }
        Ok(Recipe {
            batch_size,
            crop,
            effective_batch,
            effective_batch_source: source,
            accumulation,
            amp: recipe_amp(cfg),
            name_note,
        })
    }

    /// The images of one iteration (one micro-batch on every GPU) of the
    /// recipe: its effective batch over its accumulation.
    pub fn samples_per_iteration(&self) -> f64 {
        self.effective_batch as f64 / self.accumulation as f64
    }
}

/// Where `cfg` is an MMSeg 0.x config (MMCV's runner layout: no
/// `optim_wrapper` or no `train_dataloader`, and 0.x keys such as
/// `data=dict(samples_per_gpu=...)`, `optimizer`, `optimizer_config`,
/// `runner`, `lr_config`, `fp16`): what to change, key by key.
pub fn mmseg_0x_layout(cfg: &Dict) -> Option<String> {
    if cfg.contains_key("optim_wrapper") && cfg.contains_key("train_dataloader") {
        return None;
    }
    const MAPPING: [(&str, &str); 7] = [
        (
            "data.samples_per_gpu",
            "train_dataloader = dict(batch_size=...)",
        ),
        (
            "data.workers_per_gpu",
            "train_dataloader = dict(num_workers=...)",
        ),
        (
            "optimizer",
            "optim_wrapper = dict(type='OptimWrapper', optimizer=dict(...))",
        ),
        (
            "optimizer_config",
            "optim_wrapper's clip_grad / accumulative_counts",
        ),
        (
            "fp16",
            "optim_wrapper = dict(type='AmpOptimWrapper', loss_scale=...)",
        ),
        (
            "runner",
            "train_cfg = dict(type='IterBasedTrainLoop', max_iters=..., val_interval=...)",
        ),
        ("lr_config", "param_scheduler = [dict(type='PolyLR', ...)]"),
    ];
    let root = Value::Dict(cfg.clone());
    let found: Vec<String> = MAPPING
        .iter()
        .filter(|(key, _)| root.get_path(key).is_some())
        .map(|(key, new)| format!("  {key} -> {new}"))
        .collect();
    if found.is_empty() {
        return None;
    }
    Some(format!(
        "this is an MMSeg 0.x config (MMCV's runner layout), which MMSeg 1.x and segtune do not read; \
         MMSeg's migration guide (docs/en/migration/interface.md) maps each key:\n{}",
        found.join("\n")
    ))
}

/// One change the written config makes to the recipe.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Change {
    /// The config key (a `--cfg-options` path) or the environment variable.
    pub key: String,
    /// The recipe's value, as Python writes it (`None` when unset).
    pub old: String,
    pub new: String,
    pub why: String,
}

impl Change {
    pub fn new(
        key: impl Into<String>,
        old: impl Into<String>,
        new: impl Into<String>,
        why: impl Into<String>,
    ) -> Change {
        Change {
            key: key.into(),
            old: old.into(),
            new: new.into(),
            why: why.into(),
        }
    }
}

/// One iteration-counted setting of the config: its `--cfg-options` path,
/// where to write it in a child config, and its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    pub key: String,
    pub old: Value,
    pub new: Value,
}

pub use crate::config::train_loop::{iteration_based, max_iters};

/// The scheduler keys that count iterations where `by_epoch=False`.
const SCHEDULER_KEYS: [&str; 7] = [
    "begin",
    "end",
    "T_max",
    "milestones",
    "step_size",
    "total_steps",
    "periods",
];

fn scaled(v: &Value, factor: f64) -> Option<Value> {
    match v {
        // MMEngine's INF end (a huge int) means "to the end": kept.
        Value::Int(i) if *i >= 1 << 40 => None,
        Value::Int(i) => Some(Value::Int(((*i as f64) * factor).round() as i64)),
        Value::Float(f) if f.is_finite() && *f < 1e12 => Some(Value::Float((*f * factor).round())),
        Value::List(items) => items
            .iter()
            .map(|x| scaled(x, factor))
            .collect::<Option<Vec<_>>>()
            .map(Value::List),
        Value::Tuple(items) => items
            .iter()
            .map(|x| scaled(x, factor))
            .collect::<Option<Vec<_>>>()
            .map(Value::Tuple),
        _ => None,
    }
}

/// Every iteration-counted setting scaled by `factor` (new iterations per
/// recipe iteration): `train_cfg.max_iters`, `val_interval` and
/// `val_begin` of an iteration-based loop; `by_epoch=False` scheduler
/// entries' `begin`/`end`/`T_max`/...; the checkpoint hook's interval where
/// it counts iterations; the logger's interval. Unchanged ones are left out.
pub fn counted_settings(cfg: &Dict, factor: f64) -> Vec<Counted> {
    let mut out = Vec::new();
    let mut push = |key: String, old: &Value| {
        if let Some(new) = scaled(old, factor).filter(|n| n != old) {
            out.push(Counted {
                key,
                old: old.clone(),
                new,
            });
        }
    };
    if iteration_based(cfg) {
        if let Some(t) = cfg.get("train_cfg") {
            for k in ["max_iters", "val_interval", "val_begin"] {
                if let Some(v) = t.get_path(k) {
                    push(format!("train_cfg.{k}"), v);
                }
            }
        }
    }
    let schedulers: Vec<(String, &Value)> = match cfg.get("param_scheduler") {
        Some(Value::List(items) | Value::Tuple(items)) => items
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("param_scheduler.{i}"), s))
            .collect(),
        Some(d @ Value::Dict(_)) => vec![("param_scheduler".to_string(), d)],
        _ => Vec::new(),
    };
    for (prefix, s) in schedulers {
        if s.get_path("by_epoch") != Some(&Value::Bool(false)) {
            continue;
        }
        for k in SCHEDULER_KEYS {
            if let Some(v) = s.get_path(k) {
                push(format!("{prefix}.{k}"), v);
            }
        }
    }
    if let Some(hooks) = cfg.get("default_hooks") {
        if let Some(ck) = hooks.get_path("checkpoint") {
            let by_iter = ck.get_path("by_epoch") == Some(&Value::Bool(false));
            if let (true, Some(v)) = (by_iter, ck.get_path("interval")) {
                push("default_hooks.checkpoint.interval".into(), v);
            }
        }
        if let Some(v) = hooks
            .get_path("logger")
            .and_then(|l| l.get_path("interval"))
        {
            push("default_hooks.logger.interval".into(), v);
        }
    }
    out
}

/// "160k" for 160000, else the number.
pub fn iterations_words(n: i64) -> String {
    if n >= 1000 && n % 1000 == 0 {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(json: serde_json::Value) -> Dict {
        match crate::config::dump::from_json(&json) {
            Value::Dict(d) => d,
            _ => unreachable!(),
        }
    }

    fn stock(batch: i64) -> Dict {
        cfg(serde_json::json!({
            "crop_size": {"__tuple__": [512, 512]},
            "train_dataloader": {"batch_size": batch},
            "optim_wrapper": {"type": "OptimWrapper"},
        }))
    }

    #[test]
    fn the_name_counts_only_where_it_agrees_with_the_config() {
        let name = "deeplabv3plus_r50-d8_4xb8-160k_mydata-512x512.py";
        let r = Recipe::of(&stock(8), name, 1, None).unwrap();
        assert_eq!(r.effective_batch, 32);
        assert!(r.name_note.is_none());
        // Copied and trained at batch 4 on one GPU: the config's figure.
        let r = Recipe::of(&stock(4), name, 1, None).unwrap();
        assert_eq!(r.effective_batch, 4);
        let note = r.name_note.unwrap();
        assert!(note.contains("--effective-batch 32"), "{note}");
        // Said outright, it wins.
        let r = Recipe::of(&stock(4), name, 1, Some(32)).unwrap();
        assert_eq!(r.effective_batch, 32);
        // auto_scale_lr's base batch comes before the name.
        let mut c = stock(4);
        c.insert(
            "auto_scale_lr".into(),
            crate::config::dump::from_json(
                &serde_json::json!({"enable": false, "base_batch_size": 4}),
            ),
        );
        assert_eq!(Recipe::of(&c, name, 1, None).unwrap().effective_batch, 4);
        // No name: batch x GPUs x accumulation.
        assert_eq!(
            Recipe::of(&stock(2), "mine.py", 2, None)
                .unwrap()
                .effective_batch,
            4
        );
    }

    #[test]
    fn the_recipes_precision_is_its_optim_wrappers() {
        let amp =
            |ow: serde_json::Value| recipe_amp(&cfg(serde_json::json!({"optim_wrapper": ow})));
        assert_eq!(amp(serde_json::json!({"type": "OptimWrapper"})), Amp::Off);
        assert_eq!(
            amp(serde_json::json!({"type": "AmpOptimWrapper"})),
            Amp::Fp16
        );
        assert_eq!(
            amp(serde_json::json!({"type": "AmpOptimWrapper", "dtype": "bfloat16"})),
            Amp::Bf16
        );
    }

    #[test]
    fn iteration_counted_settings_scale_and_epochs_do_not() {
        let c = cfg(serde_json::json!({
            "train_cfg": {"type": "IterBasedTrainLoop", "max_iters": 160000, "val_interval": 16000},
            "param_scheduler": [
                {"type": "LinearLR", "by_epoch": false, "begin": 0, "end": 1500},
                {"type": "PolyLR", "by_epoch": false, "begin": 1500, "end": 160000},
                {"type": "PolyLR", "begin": 0, "end": 10}
            ],
            "default_hooks": {"checkpoint": {"by_epoch": false, "interval": 16000},
                              "logger": {"interval": 50}}
        }));
        let got: Vec<(String, Value)> = counted_settings(&c, 8.0)
            .into_iter()
            .map(|s| (s.key, s.new))
            .collect();
        let want = [
            ("train_cfg.max_iters", 1_280_000),
            ("train_cfg.val_interval", 128_000),
            ("param_scheduler.0.end", 12_000),
            ("param_scheduler.1.begin", 12_000),
            ("param_scheduler.1.end", 1_280_000),
            ("default_hooks.checkpoint.interval", 128_000),
            ("default_hooks.logger.interval", 400),
        ];
        assert_eq!(
            got,
            want.iter()
                .map(|(k, v)| (k.to_string(), Value::Int(*v)))
                .collect::<Vec<_>>()
        );
        let epochs = cfg(serde_json::json!({
            "train_cfg": {"type": "EpochBasedTrainLoop", "max_epochs": 100}
        }));
        assert!(counted_settings(&epochs, 8.0).is_empty());
    }
}
