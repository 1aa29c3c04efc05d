//! What a written config sets for a training winner: each setting as an
//! MMEngine `--cfg-options` path and value with its reason ([`Edit`]), in
//! named phases (the user's own `--cfg-options`; batch, crop and model
//! knobs; the optimizer wrapper; the iteration-counted schedule), and from
//! them, once computed ([`Written`]), the child config's overrides, the
//! `--cfg-options` line and the changes list.

use super::recipe::{Change, Recipe, Schedule};
use super::space::{Amp, Candidate};
use crate::config::{Dict, Value};

pub(super) fn tuple(c: (i64, i64)) -> Value {
    Value::Tuple(vec![Value::Int(c.0), Value::Int(c.1)])
}

pub(super) fn dict(pairs: Vec<(&str, Value)>) -> Value {
    Value::Dict(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// The training pipeline of a dataloader, under `dataset` or under the
/// `dataset` of dataset wrappers (`RepeatDataset`, `ClassBalancedDataset`):
/// how many `dataset` levels down, and the pipeline.
fn dataset_pipeline(loader: &Value) -> Option<(usize, &Value)> {
    let mut node = loader.get_path("dataset")?;
    for depth in 1..=4 {
        if let Some(p) = node.get_path("pipeline") {
            return Some((depth, p));
        }
        node = node.get_path("dataset")?;
    }
    None
}

/// The winner as the written config sets it, and what of the recipe it
/// must keep.
pub struct Winner<'a> {
    pub candidate: Candidate,
    pub recipe: &'a Recipe,
    pub gpus: i64,
    /// `auto_scale_lr.base_batch_size` to enable, when the winner's batch
    /// does not keep the effective batch.
    pub auto_scale_lr: Option<i64>,
    /// The search's `--cfg-options`, part of the written config.
    pub cfg_options: &'a [String],
    pub schedule: Schedule,
    /// Why the precision, the crop and the batch are what they are (the
    /// search's words for the changes list).
    pub reasons: Reasons,
}

/// The search's reasons for the winner's precision, crop and batch.
#[derive(Debug, Clone, Default)]
pub struct Reasons {
    pub precision: String,
    pub crop: String,
    pub batch: String,
    pub knobs: String,
}

/// One setting the written config makes, as an MMEngine `--cfg-options`
/// path (list items by index) and its value; `why` empty for the user's own
/// `--cfg-options`.
#[derive(Debug, Clone, PartialEq)]
pub struct Edit {
    pub path: String,
    pub value: Value,
    pub why: String,
    /// One of the user's own `--cfg-options`.
    pub from_user: bool,
}

/// `(h, w)` with each side at most `cap`'s: a crop is never enlarged.
fn at_most(old: &Value, cap: (i64, i64)) -> Option<Value> {
    match old.as_seq()? {
        [h, w] => {
            let (h, w) = (h.as_i64()?, w.as_i64()?);
            Some(tuple((h.min(cap.0), w.min(cap.1))))
        }
        _ => None,
    }
}

/// The crop edits for a winner whose network input is `crop` (smaller than
/// the recipe's): every place that holds a crop (`crop_size`,
/// `data_preprocessor.size`, each `RandomCrop.crop_size`) at most `crop`
/// on each side, never larger than it was.
fn crop_edits(cfg: &Dict, crop: (i64, i64), why: &str) -> Vec<Edit> {
    let root = Value::Dict(cfg.clone());
    let mut paths: Vec<String> = vec![
        "crop_size".into(),
        "data_preprocessor.size".into(),
        "model.data_preprocessor.size".into(),
    ];
    let mut random_crops = |prefix: &str, pipeline: Option<&Value>| {
        for (i, step) in pipeline
            .and_then(Value::as_seq)
            .unwrap_or(&[])
            .iter()
            .enumerate()
        {
            if step.get_path("type").and_then(Value::as_str) == Some("RandomCrop") {
                paths.push(format!("{prefix}.{i}.crop_size"));
            }
        }
    };
    random_crops("train_pipeline", cfg.get("train_pipeline"));
    if let Some((depth, p)) = cfg.get("train_dataloader").and_then(dataset_pipeline) {
        let prefix = vec!["dataset"; depth].join(".");
        random_crops(&format!("train_dataloader.{prefix}.pipeline"), Some(p));
    }
    paths
        .into_iter()
        .filter_map(|path| {
            let old = root.get_path(&path)?;
            let new = at_most(old, crop).filter(|n| n != old)?;
            Some(Edit {
                path,
                value: new,
                why: why.to_string(),
                from_user: false,
            })
        })
        .collect()
}

/// The dtype `AmpOptimWrapper` takes for a half precision.
fn dtype_of(amp: Amp) -> &'static str {
    if amp == Amp::Bf16 {
        "bfloat16"
    } else {
        "float16"
    }
}

/// The edits of one kind, pushed where they change the config.
struct EditList<'c> {
    root: Value,
    cfg: &'c Dict,
    out: Vec<Edit>,
}

impl EditList<'_> {
    fn push(&mut self, path: &str, value: Value, why: &str) {
        if self.root.get_path(path) != Some(&value) {
            self.out.push(Edit {
                path: path.to_string(),
                value,
                why: why.to_string(),
                from_user: false,
            });
        }
    }

    /// The user's own `--cfg-options`, at their values in the resolved config.
    fn user_options(&mut self, options: &[String]) {
        for item in options {
            let Some((path, _)) = item.split_once('=') else {
                continue;
            };
            if let Some(value) = self.root.get_path(path.trim()) {
                self.out.push(Edit {
                    path: path.trim().to_string(),
                    value: value.clone(),
                    why: String::new(),
                    from_user: true,
                });
            }
        }
    }

    /// Batch, crop and model knobs.
    fn candidate(&mut self, w: &Winner) {
        let c = &w.candidate;
        if c.batch_size != w.recipe.batch_size {
            self.push(
                "train_dataloader.batch_size",
                Value::Int(c.batch_size),
                &w.reasons.batch,
            );
        }
        if c.crop != w.recipe.crop {
            for e in crop_edits(self.cfg, c.crop, &w.reasons.crop) {
                self.push(&e.path, e.value, &e.why);
            }
        }
        for (key, value) in super::knobs::settings(c.knobs())
            .into_iter()
            .filter_map(super::knobs::Setting::config_item)
        {
            self.push(key, value, &w.reasons.knobs);
        }
    }

    /// The optimizer wrapper: precision, accumulation, `auto_scale_lr`.
    fn optimizer(&mut self, w: &Winner) {
        let c = &w.candidate;
        if c.amp != w.recipe.amp {
            let why = &w.reasons.precision;
            match c.amp {
                Amp::Off => self.push("optim_wrapper.type", Value::Str("OptimWrapper".into()), why),
                half => {
                    self.push(
                        "optim_wrapper.type",
                        Value::Str("AmpOptimWrapper".into()),
                        why,
                    );
                    self.push(
                        "optim_wrapper.dtype",
                        Value::Str(dtype_of(half).into()),
                        why,
                    );
                    if w.recipe.amp == Amp::Off {
                        self.push(
                            "optim_wrapper.loss_scale",
                            Value::Str("dynamic".into()),
                            why,
                        );
                    }
                }
            }
        }
        if c.accumulation != w.recipe.accumulation {
            let gpus = w.gpus;
            let kept = if w.auto_scale_lr.is_none() {
                format!(
                    ", the recipe's effective batch {}",
                    w.recipe.effective_batch
                )
            } else {
                String::new()
            };
            let why = format!(
                "batch {} x {gpus} GPU{} x accumulation {} = {} images per optimizer update{kept}",
                c.batch_size,
                if gpus == 1 { "" } else { "s" },
                c.accumulation,
                c.effective_batch(gpus),
            );
            self.push(
                "optim_wrapper.accumulative_counts",
                Value::Int(c.accumulation),
                &why,
            );
        }
        if let Some(base) = w.auto_scale_lr {
            let why = format!(
                "no batch that fits keeps the effective batch {base}: MMEngine scales the learning rate by the batch trained over {base}"
            );
            self.push("auto_scale_lr.enable", Value::Bool(true), &why);
            self.push("auto_scale_lr.base_batch_size", Value::Int(base), &why);
        }
    }

    /// The iteration-counted schedule, scaled to keep the recipe's updates.
    fn schedule(&mut self, w: &Winner) {
        let c = &w.candidate;
        if w.schedule != Schedule::KeepUpdates || c.accumulation == w.recipe.accumulation {
            return;
        }
        let factor = c.accumulation as f64 / w.recipe.accumulation as f64;
        let why = format!(
            "MMEngine's loop counts micro-batches: at accumulation {} (the recipe's {}), {} times the iterations keep the recipe's optimizer updates (--schedule keep-iters keeps the iterations)",
            c.accumulation,
            w.recipe.accumulation,
            if factor.fract() == 0.0 {
                format!("{factor:.0}")
            } else {
                format!("{factor:.3}")
            }
        );
        for s in super::recipe::counted_settings(self.cfg, factor) {
            self.push(&s.key, s.new, &why);
        }
    }
}

/// Every setting the written config makes, in order: the user's
/// `--cfg-options`, then what the winner changes of the recipe (batch,
/// crop, model knobs, precision, accumulation, `auto_scale_lr`, the
/// iteration-counted schedule), each with its reason. Nothing the winner
/// keeps is written.
pub fn edits(cfg: &Dict, w: &Winner) -> Vec<Edit> {
    let mut list = EditList {
        root: Value::Dict(cfg.clone()),
        cfg,
        out: Vec::new(),
    };
    list.user_options(w.cfg_options);
    list.candidate(w);
    list.optimizer(w);
    list.schedule(w);
    // A setting of the user's that the winner makes again is the winner's
    // (as in the `--cfg-options` line): two values for one key would leave
    // the written config reading back one of them only.
    let ours: std::collections::HashSet<String> = list
        .out
        .iter()
        .filter(|e| !e.from_user)
        .map(|e| e.path.clone())
        .collect();
    list.out.retain(|e| !e.from_user || !ours.contains(&e.path));
    list.out
}

/// What the written config sets, computed once: its edits (see [`edits`])
/// and whether the optimizer wrapper is replaced whole, with the user's
/// `--cfg-options` as they gave them.
pub struct Written {
    pub edits: Vec<Edit>,
    /// A mixed-precision recipe leaving AMP: `OptimWrapper` takes no
    /// `dtype` or `loss_scale`, so the wrapper is written whole.
    replace_optim_wrapper: bool,
    user_options: Vec<String>,
}

impl Written {
    pub fn of(cfg: &Dict, w: &Winner) -> Written {
        Written {
            edits: edits(cfg, w),
            replace_optim_wrapper: w.candidate.amp == Amp::Off && w.recipe.amp != Amp::Off,
            user_options: w.cfg_options.to_vec(),
        }
    }

    /// The overrides that turn the recipe into the winner.
    pub fn overrides(&self, cfg: &Dict) -> Dict {
        child_overrides(cfg, &self.edits, self.replace_optim_wrapper)
    }

    /// The `--cfg-options` line for `tools/train.py`: the user's own items
    /// as they gave them (those the winner sets again left out), then the
    /// winner's; empty when there is nothing to set.
    pub fn cfg_options_line(&self) -> String {
        let ours: Vec<&Edit> = self.edits.iter().filter(|e| !e.from_user).collect();
        let set_again = |path: &str| ours.iter().any(|e| e.path == path);
        let mut items: Vec<String> = self
            .user_options
            .iter()
            .filter(|item| {
                item.split_once('=')
                    .is_none_or(|(path, _)| !set_again(path.trim()))
            })
            .cloned()
            .collect();
        items.extend(
            ours.iter()
                .map(|e| format!("{}={}", e.path, option_value(&e.value))),
        );
        if items.is_empty() {
            return String::new();
        }
        quoted_line(&items)
    }

    /// The changes list: every edit of the winner's (not the user's own
    /// `--cfg-options`), its old value, new value and reason.
    pub fn changes(&self, cfg: &Dict) -> Vec<Change> {
        let root = Value::Dict(cfg.clone());
        let repr = crate::config::value::python_repr;
        self.edits
            .iter()
            .filter(|e| !e.from_user)
            .map(|e| {
                let old = root.get_path(&e.path).map_or("unset".to_string(), repr);
                Change::new(e.path.clone(), old, repr(&e.value), e.why.clone())
            })
            .collect()
    }
}

/// Sets `value` at the dotted `path` of `v` (list items by index),
/// creating dicts on the way.
fn set_path(v: &mut Value, path: &[&str], value: Value) {
    let Some((head, rest)) = path.split_first() else {
        *v = value;
        return;
    };
    match v {
        Value::Dict(d) => {
            let entry = d
                .entry(head.to_string())
                .or_insert_with(|| Value::Dict(Dict::new()));
            set_path(entry, rest, value);
        }
        Value::List(items) | Value::Tuple(items) => {
            if let Some(item) = head.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                set_path(item, rest, value);
            }
        }
        other => {
            *other = Value::Dict(Dict::new());
            set_path(other, path, value);
        }
    }
}

/// The overrides a child config (relative `_base_`) writes for `edits`:
/// each edit at its path, except that a path through a list writes the
/// whole list as edited (a child's list replaces its base's whole). A
/// winner that leaves mixed precision replaces the optimizer wrapper whole
/// (`_delete_`): `OptimWrapper` takes no `dtype` or `loss_scale`.
fn child_overrides(cfg: &Dict, edits: &[Edit], drop_amp_keys: bool) -> Dict {
    let mut edited = Value::Dict(cfg.clone());
    for e in edits {
        let keys: Vec<&str> = e.path.split('.').collect();
        set_path(&mut edited, &keys, e.value.clone());
    }
    let mut o = Dict::new();
    for e in edits {
        let keys: Vec<&str> = e.path.split('.').collect();
        // The longest prefix of dicts: below a list, the list is written whole.
        let mut depth = keys.len();
        let mut node = &edited;
        for (i, k) in keys.iter().enumerate().take(keys.len().saturating_sub(1)) {
            match node.get_path(k) {
                Some(next @ (Value::List(_) | Value::Tuple(_)))
                    if matches!(node, Value::Dict(_)) =>
                {
                    let _ = next;
                    depth = i + 1;
                    break;
                }
                Some(next) => node = next,
                None => break,
            }
        }
        let prefix = keys[..depth].join(".");
        if let Some(value) = edited.get_path(&prefix) {
            insert_at_path(&mut o, &prefix, value.clone());
        }
    }
    if drop_amp_keys {
        if let Some(Value::Dict(ow)) = edited.get_path("optim_wrapper") {
            let mut whole = Dict::new();
            whole.insert("_delete_".into(), Value::Bool(true));
            whole.extend(ow.clone());
            whole.shift_remove("dtype");
            whole.shift_remove("loss_scale");
            o.insert("optim_wrapper".into(), Value::Dict(whole));
        }
    }
    o
}

/// Sets `value` at the dotted `path` of `dict`, creating the dicts on the way.
fn insert_at_path(dict: &mut Dict, path: &str, value: Value) {
    match path.split_once('.') {
        None => {
            dict.insert(path.into(), value);
        }
        Some((head, rest)) => {
            let entry = dict
                .entry(head.to_string())
                .or_insert_with(|| Value::Dict(Dict::new()));
            if let Value::Dict(inner) = entry {
                insert_at_path(inner, rest, value);
            }
        }
    }
}

/// A value as MMEngine's `DictAction` reads it back from `--cfg-options`.
fn option_value(v: &Value) -> String {
    let items = |xs: &[Value]| xs.iter().map(option_value).collect::<Vec<_>>().join(",");
    match v {
        Value::Str(s) => s.clone(),
        Value::Tuple(xs) => format!("({})", items(xs)),
        Value::List(xs) => format!("[{}]", items(xs)),
        other => crate::config::value::python_repr(other),
    }
}

/// `--cfg-options` and the items, each quoted for the shell where it needs
/// it (tuples, lists, spaces, quotes): MMEngine's DictAction then parses it
/// back as meant.
pub(super) fn quoted_line(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|item| {
            let plain = item
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.,=:/+@%-".contains(c));
            if plain {
                return item.clone();
            }
            shlex::try_quote(item)
                .map(|q| q.into_owned())
                .unwrap_or_else(|_| item.clone())
        })
        .collect();
    format!("--cfg-options {}", quoted.join(" "))
}

#[cfg(test)]
#[path = "edits_tests.rs"]
mod tests;
