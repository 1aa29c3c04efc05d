//! Writing the winner as an MMSeg config: a child of the original (relative
//! `_base_`) that overrides exactly what changed — batch size, the crop
//! everywhere the recipe uses it (lists rewritten whole, since every file is
//! evaluated eagerly), the optimizer wrapper (AMP, accumulation) and
//! `auto_scale_lr` when the effective batch cannot be kept — plus the
//! equivalent `--cfg-options` line for `tools/train.py`. For a `.rhai`
//! recipe, a `.rhai` override and a standalone resolved `.py` (MMSeg cannot
//! read Rhai). Files are written to a temporary name, checked by resolving
//! them, then renamed: nothing is left half-written, the input never touched.

use super::recipe::{Change, Recipe, Schedule};
use super::space::{Amp, Candidate, TestMode};
use crate::config::{self, dump, Dict, Value};
use crate::error::{Error, Result};
use std::path::{Component, Path, PathBuf};

fn tuple(c: (i64, i64)) -> Value {
    Value::Tuple(vec![Value::Int(c.0), Value::Int(c.1)])
}

fn dict(pairs: Vec<(&str, Value)>) -> Value {
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

/// Every setting the written config makes, in order: the user's
/// `--cfg-options`, then what the winner changes of the recipe (batch,
/// crop, model knobs, precision, accumulation, `auto_scale_lr`, the
/// iteration-counted schedule), each with its reason. Nothing the winner
/// keeps is written.
pub fn edits(cfg: &Dict, w: &Winner) -> Vec<Edit> {
    let root = Value::Dict(cfg.clone());
    let c = &w.candidate;
    let mut out: Vec<Edit> = w
        .cfg_options
        .iter()
        .filter_map(|item| {
            let (path, _) = item.split_once('=')?;
            Some(Edit {
                path: path.trim().to_string(),
                value: root.get_path(path.trim())?.clone(),
                why: String::new(),
                from_user: true,
            })
        })
        .collect();
    let mut push = |path: &str, value: Value, why: String| {
        if root.get_path(path) != Some(&value) {
            out.push(Edit {
                path: path.to_string(),
                value,
                why,
                from_user: false,
            });
        }
    };
    if c.batch_size != w.recipe.batch_size {
        push(
            "train_dataloader.batch_size",
            Value::Int(c.batch_size),
            w.reasons.batch.clone(),
        );
    }
    if c.crop != w.recipe.crop {
        for e in crop_edits(cfg, c.crop, &w.reasons.crop) {
            push(&e.path, e.value, e.why);
        }
    }
    for (key, value) in super::knobs::settings(c.knobs())
        .into_iter()
        .filter_map(super::knobs::Setting::config_item)
    {
        push(key, value, w.reasons.knobs.clone());
    }
    if c.amp != w.recipe.amp {
        let why = w.reasons.precision.clone();
        match c.amp {
            Amp::Off => push("optim_wrapper.type", Value::Str("OptimWrapper".into()), why),
            half => {
                push(
                    "optim_wrapper.type",
                    Value::Str("AmpOptimWrapper".into()),
                    why.clone(),
                );
                push(
                    "optim_wrapper.dtype",
                    Value::Str(dtype_of(half).into()),
                    why.clone(),
                );
                if w.recipe.amp == Amp::Off {
                    push(
                        "optim_wrapper.loss_scale",
                        Value::Str("dynamic".into()),
                        why,
                    );
                }
            }
        }
    }
    if c.accumulation != w.recipe.accumulation {
        push(
            "optim_wrapper.accumulative_counts",
            Value::Int(c.accumulation),
            format!(
                "batch {} x {} GPU{} x accumulation {} = {} images per optimizer update{}",
                c.batch_size,
                w.gpus,
                if w.gpus == 1 { "" } else { "s" },
                c.accumulation,
                c.effective_batch(w.gpus),
                if w.auto_scale_lr.is_none() {
                    format!(
                        ", the recipe's effective batch {}",
                        w.recipe.effective_batch
                    )
                } else {
                    String::new()
                }
            ),
        );
    }
    if let Some(base) = w.auto_scale_lr {
        let why = format!(
            "no batch that fits keeps the effective batch {base}: MMEngine scales the learning rate by the batch trained over {base}"
        );
        push("auto_scale_lr.enable", Value::Bool(true), why.clone());
        push("auto_scale_lr.base_batch_size", Value::Int(base), why);
    }
    if w.schedule == Schedule::KeepUpdates && c.accumulation != w.recipe.accumulation {
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
        for s in super::recipe::counted_settings(cfg, factor) {
            push(&s.key, s.new, why.clone());
        }
    }
    out
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
pub fn child_overrides(cfg: &Dict, edits: &[Edit], drop_amp_keys: bool) -> Dict {
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

/// The overrides that turn the recipe into the winner (see [`edits`]).
pub fn overrides(cfg: &Dict, w: &Winner) -> Dict {
    let drop_amp_keys = w.candidate.amp == Amp::Off && w.recipe.amp != Amp::Off;
    child_overrides(cfg, &edits(cfg, w), drop_amp_keys)
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

/// The `--cfg-options` line for `tools/train.py`: the user's own items as
/// they gave them (those the winner sets again left out), then the
/// winner's.
pub fn cfg_options_line(cfg: &Dict, w: &Winner) -> String {
    let edits = edits(cfg, w);
    let ours: Vec<&Edit> = edits.iter().filter(|e| !e.from_user).collect();
    let set_again = |path: &str| ours.iter().any(|e| e.path == path);
    let mut items: Vec<String> = w
        .cfg_options
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
pub fn changes(cfg: &Dict, w: &Winner) -> Vec<Change> {
    let root = Value::Dict(cfg.clone());
    edits(cfg, w)
        .iter()
        .filter(|e| !e.from_user)
        .map(|e| {
            Change::new(
                e.path.clone(),
                root.get_path(&e.path)
                    .map_or("unset".to_string(), crate::config::value::python_repr),
                crate::config::value::python_repr(&e.value),
                e.why.clone(),
            )
        })
        .collect()
}

/// `--cfg-options` and the items, each quoted for the shell where it needs
/// it (tuples, lists, spaces, quotes): MMEngine's DictAction then parses it
/// back as meant.
fn quoted_line(items: &[String]) -> String {
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

/// `target` relative to directory `from` (both made absolute).
pub fn relative_path(target: &Path, from: &Path) -> PathBuf {
    let t = config::absolute(target);
    let f = config::absolute(from);
    let tc: Vec<Component> = t.components().collect();
    let fc: Vec<Component> = f.components().collect();
    let common = tc.iter().zip(&fc).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..fc.len() {
        out.push("..");
    }
    for c in &tc[common..] {
        out.push(c.as_os_str());
    }
    out
}

/// Whether the written config at `path` reads back every edit.
fn check(path: &Path, edits: &[Edit]) -> Result<()> {
    let cfg = config::resolve(path, &[])
        .map_err(|e| Error::Trial(format!("the emitted config does not resolve:\n{e}")))?;
    let v = Value::Dict(cfg);
    if let Some(e) = edits.iter().find(|e| v.get_path(&e.path) != Some(&e.value)) {
        return Err(Error::Trial(format!(
            "the emitted config {} does not read back the winner ({} is {}, not {})",
            path.display(),
            e.path,
            v.get_path(&e.path)
                .map_or("unset".to_string(), crate::config::value::python_repr),
            crate::config::value::python_repr(&e.value)
        )));
    }
    Ok(())
}

fn write_checked(
    path: &Path,
    text: &str,
    check: &dyn Fn(&Path) -> Result<()>,
    input: &Path,
) -> Result<()> {
    if config::absolute(path) == config::absolute(input) {
        return Err(Error::Input(format!(
            "refusing to overwrite the input config {}",
            input.display()
        )));
    }
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let tmp = tmp.with_file_name(format!(
        ".{}",
        tmp.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("segtune.tmp")
    ));
    // The temporary keeps the real extension last so the config loader accepts it.
    let tmp = tmp.with_file_name(format!(
        ".{}.tmp.{}",
        path.file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or("segtune"),
        path.extension().and_then(|e| e.to_str()).unwrap_or("py")
    ));
    // The temporary never outlives a failure: a full disk leaves nothing.
    let written = std::fs::write(&tmp, text)
        .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
        .and_then(|()| check(&tmp))
        .and_then(|()| {
            std::fs::rename(&tmp, path)
                .map_err(|e| Error::io(format!("cannot write {}", path.display()), e))
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Writes the winner next to `out_dir`; returns the written paths.
pub fn emit(
    input: &Path,
    cfg: &Dict,
    w: &Winner,
    out_dir: &Path,
    header: &str,
) -> Result<Vec<PathBuf>> {
    let o = overrides(cfg, w);
    let edits = edits(cfg, w);
    write_child(input, &o, out_dir, header, TRAIN_SUFFIX, &|path| {
        check(path, &edits)
    })
}

/// The overrides that set an inference winner: the test batch,
/// `model.test_cfg` (whole, or slide with its crop and stride) and, for
/// fp16, MMEngine's `TestLoop(fp16=True)`.
pub fn inference_overrides(c: &Candidate) -> Dict {
    let mut o = Dict::new();
    o.insert(
        "test_dataloader".into(),
        dict(vec![("batch_size", Value::Int(c.batch_size))]),
    );
    let test_cfg = match c.test_mode {
        Some(TestMode::Slide { crop, stride }) => dict(vec![
            ("mode", Value::Str("slide".into())),
            ("crop_size", tuple(crop)),
            ("stride", tuple(stride)),
        ]),
        _ => dict(vec![("mode", Value::Str("whole".into()))]),
    };
    o.insert("model".into(), dict(vec![("test_cfg", test_cfg)]));
    if c.amp != Amp::Off {
        o.insert(
            "test_cfg".into(),
            dict(vec![
                ("type", Value::Str("TestLoop".into())),
                ("fp16", Value::Bool(true)),
            ]),
        );
    }
    o
}

/// The `--cfg-options` line of [`inference_overrides`] for `tools/test.py`.
pub fn inference_cfg_options_line(c: &Candidate) -> String {
    let mut items = vec![format!("test_dataloader.batch_size={}", c.batch_size)];
    items.extend(c.test_mode.unwrap_or(TestMode::Whole).cfg_options());
    if c.amp != Amp::Off {
        items.push("test_cfg.type=TestLoop".into());
        items.push("test_cfg.fp16=True".into());
    }
    quoted_line(&items)
}

/// Writes an inference winner next to `out_dir`; returns the written paths.
pub fn emit_inference(
    input: &Path,
    c: &Candidate,
    out_dir: &Path,
    header: &str,
) -> Result<Vec<PathBuf>> {
    let o = inference_overrides(c);
    let check = |path: &Path| {
        let cfg = config::resolve(path, &[])
            .map_err(|e| Error::Trial(format!("the emitted config does not resolve:\n{e}")))?;
        let batch = Value::Dict(cfg)
            .get_path("test_dataloader.batch_size")
            .cloned();
        if batch != Some(Value::Int(c.batch_size)) {
            return Err(Error::Trial(format!(
                "the emitted config {} does not read back the winner",
                path.display()
            )));
        }
        Ok(())
    };
    write_child(input, &o, out_dir, header, INFER_SUFFIX, &check)
}

/// The suffix of a training search's emitted config (`<stem>_segtune.py`).
pub const TRAIN_SUFFIX: &str = "segtune";
/// The suffix of an inference search's emitted config.
pub const INFER_SUFFIX: &str = "segtune_infer";

/// The files a search of `input` writes into `out_dir` (named
/// `<stem>_<suffix>`): for a `.rhai` input a `.rhai` child and a standalone
/// resolved `.py` (MMSeg cannot read Rhai), else a `.py` child.
pub fn targets(input: &Path, out_dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let stem = input
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("config");
    if input.extension().is_some_and(|e| e == "rhai") {
        vec![
            out_dir.join(format!("{stem}_{suffix}.rhai")),
            out_dir.join(format!("{stem}_{suffix}_resolved.py")),
        ]
    } else {
        vec![out_dir.join(format!("{stem}_{suffix}.py"))]
    }
}

/// The first line of every config segtune writes, after the comment sign.
const HEADER_START: &str = "Generated by segtune";

/// Whether `path` is a file segtune may replace: absent, or a config that
/// starts with segtune's header line, or a file the last search in
/// `out_dir` wrote (its `search.json` lists it).
fn replaceable(path: &Path, out_dir: &Path) -> bool {
    use std::io::{BufRead, BufReader, Read};
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return true;
    };
    if !meta.is_file() {
        return false;
    }
    let mut first = String::new();
    let headed = std::fs::File::open(path)
        .map(|f| BufReader::new(f).take(4096).read_line(&mut first).is_ok())
        .unwrap_or(false)
        && ["# ", "// "]
            .iter()
            .any(|sign| first.starts_with(&format!("{sign}{HEADER_START}")));
    headed || super::saved::listed_as_emitted(out_dir, path)
}

/// Refuses, before any trial, a search whose output would replace a file
/// that segtune did not write (a user's own `<stem>_segtune.py` in
/// `--out`), or the input itself.
pub fn check_targets(input: &Path, out_dir: &Path, targets: &[PathBuf]) -> Result<()> {
    for path in targets {
        if config::absolute(path) == config::absolute(input) {
            return Err(Error::Input(format!(
                "refusing to overwrite the input config {}; give another --out",
                input.display()
            )));
        }
        if !replaceable(path, out_dir) {
            return Err(Error::Input(format!(
                "{} exists and segtune did not write it (it does not start with segtune's \
                 header line); segtune never replaces a file it did not write: move it away \
                 or give another --out",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Writes `o` as a child of `input` (relative `_base_`) into `out_dir`,
/// as the files [`targets`] names. Each file is checked by `check` before
/// it takes its name.
fn write_child(
    input: &Path,
    o: &Dict,
    out_dir: &Path,
    header: &str,
    suffix: &str,
    check: &dyn Fn(&Path) -> Result<()>,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir)
        .map_err(|e| Error::io(format!("cannot create {}", out_dir.display()), e))?;
    let targets = targets(input, out_dir, suffix);
    check_targets(input, out_dir, &targets)?;
    let base = relative_path(input, out_dir);
    let mut written = Vec::new();
    // The header may run over several lines: each one a comment.
    let commented = |sign: &str| -> String {
        header
            .lines()
            .map(|l| {
                if l.is_empty() {
                    format!("{}\n", sign.trim_end())
                } else {
                    format!("{sign}{l}\n")
                }
            })
            .collect()
    };
    let (py_header, rhai_header) = (commented("# "), commented("// "));
    if let [child, resolved_py] = targets.as_slice() {
        let mut text = format!(
            "{rhai_header}let _base_ = {};\n",
            crate::config::translate::rhai_string(&base.to_string_lossy())
        );
        for (k, v) in o {
            text.push_str(&format!(
                "let {} = {};\n",
                crate::config::eval::mangle(k),
                dump::rhai_value(v, 0)
            ));
        }
        write_checked(child, &text, check, input)?;
        written.push(child.clone());
        // MMSeg cannot read Rhai: a standalone, fully resolved Python config too.
        let resolved = config::resolve(child, &[])?;
        let text = format!(
            "{py_header}# Fully resolved (no _base_): MMSeg's tools/train.py and tools/test.py read it as is.\n{}",
            dump::to_python(&resolved)?
        );
        write_checked(resolved_py, &text, check, input)?;
        written.push(resolved_py.clone());
    } else if config::is_new_style(input) {
        // MMEngine refuses an old-style `_base_` child of a new-style
        // config: the recipe is written whole, its classes by the names
        // MMSeg's registries know them by, which mean those classes in
        // MMSeg's scope.
        let mut resolved = config::resolve(input, &[])?;
        for (k, v) in o {
            crate::config::merge::merge_entry(&mut resolved, k.clone(), v.clone(), false)?;
        }
        if matches!(resolved.get("default_scope"), None | Some(Value::None)) {
            resolved.insert("default_scope".into(), Value::Str("mmseg".into()));
        }
        let path = &targets[0];
        let text = format!(
            "{py_header}# Fully resolved from a new-style config (no _base_: MMEngine refuses an old-style child of one; classes by their registered names, default_scope='mmseg'): MMSeg's tools/train.py reads it as is.\n{}",
            dump::to_python(&resolved)?
        );
        write_checked(path, &text, check, input)?;
        written.push(path.clone());
    } else {
        let path = &targets[0];
        let text = format!(
            "{py_header}_base_ = {}\n{}",
            crate::config::value::python_str_repr(&base.to_string_lossy()),
            dump::to_python(o)?
        );
        write_checked(path, &text, check, input)?;
        written.push(path.clone());
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::dump::from_json;
    use crate::trial::Amp;

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
        let recipe =
            Recipe::of(&cfg, "deeplabv3plus_r50-d8_4xb8-160k_x-512x512.py", 1, None).unwrap();
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
}
