//! Writing the winner as an MMSeg config: a child of the original (relative
//! `_base_`) that overrides exactly what changed — batch size, the crop
//! everywhere the recipe uses it (lists rewritten whole, since every file is
//! evaluated eagerly), the optimizer wrapper (AMP, accumulation) and
//! `auto_scale_lr` when the effective batch cannot be kept — plus the
//! equivalent `--cfg-options` line for `tools/train.py`. For a `.rhai`
//! recipe, a `.rhai` override and a standalone resolved `.py` (MMSeg cannot
//! read Rhai). Files are written to a temporary name, checked by resolving
//! them, then renamed: nothing is left half-written, the input never touched.

use super::space::{Amp, Candidate, TestMode};
use crate::config::{self, dump, Dict, Value};
use crate::error::{Error, Result};
use std::path::{Component, Path, PathBuf};

fn tuple(c: (i64, i64)) -> Value {
    Value::Tuple(vec![Value::Int(c.0), Value::Int(c.1)])
}

/// A pipeline with every `RandomCrop.crop_size` set to `crop`.
fn with_crop(pipeline: &Value, crop: (i64, i64)) -> Option<Value> {
    let steps = pipeline.as_seq()?;
    let mut changed = false;
    let out: Vec<Value> = steps
        .iter()
        .map(|s| match s {
            Value::Dict(d) if d.get("type").and_then(Value::as_str) == Some("RandomCrop") => {
                let mut d = d.clone();
                d.insert("crop_size".into(), tuple(crop));
                changed = true;
                Value::Dict(d)
            }
            other => other.clone(),
        })
        .collect();
    changed.then_some(Value::List(out))
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

/// The overrides that turn the recipe into the candidate.
pub fn overrides(cfg: &Dict, c: &Candidate, auto_scale_lr: Option<i64>) -> Dict {
    let mut o = Dict::new();
    if cfg.contains_key("crop_size") {
        o.insert("crop_size".into(), tuple(c.crop));
    }
    if let Some(Value::Dict(_)) = cfg.get("data_preprocessor") {
        o.insert(
            "data_preprocessor".into(),
            dict(vec![("size", tuple(c.crop))]),
        );
    }
    if let Some(p) = cfg.get("train_pipeline").and_then(|p| with_crop(p, c.crop)) {
        o.insert("train_pipeline".into(), p);
    }
    let mut loader = vec![("batch_size", Value::Int(c.batch_size))];
    if let Some((depth, p)) = cfg
        .get("train_dataloader")
        .and_then(dataset_pipeline)
        .and_then(|(depth, p)| with_crop(p, c.crop).map(|p| (depth, p)))
    {
        // dataset(.dataset)*.pipeline: wrappers such as RepeatDataset nest it.
        let mut nested = dict(vec![("pipeline", p)]);
        for _ in 1..depth {
            nested = dict(vec![("dataset", nested)]);
        }
        loader.push(("dataset", nested));
    }
    o.insert("train_dataloader".into(), dict(loader));
    let mut model = Dict::new();
    model.insert(
        "data_preprocessor".into(),
        dict(vec![("size", tuple(c.crop))]),
    );
    for (key, value) in super::knobs::settings(c.knobs())
        .into_iter()
        .filter_map(super::knobs::Setting::config_item)
    {
        let path = key.strip_prefix("model.").expect("a model knob's key");
        insert_at_path(&mut model, path, value);
    }
    o.insert("model".into(), Value::Dict(model));
    let mut ow = cfg
        .get("optim_wrapper")
        .and_then(Value::as_dict)
        .cloned()
        .unwrap_or_default();
    for k in ["dtype", "loss_scale", "accumulative_counts"] {
        ow.shift_remove(k);
    }
    match c.amp {
        Amp::Off => {
            ow.insert("type".into(), Value::Str("OptimWrapper".into()));
        }
        half => {
            ow.insert("type".into(), Value::Str("AmpOptimWrapper".into()));
            ow.insert(
                "dtype".into(),
                Value::Str(
                    if half == Amp::Bf16 {
                        "bfloat16"
                    } else {
                        "float16"
                    }
                    .into(),
                ),
            );
            ow.insert("loss_scale".into(), Value::Str("dynamic".into()));
        }
    }
    if c.accumulation > 1 {
        ow.insert("accumulative_counts".into(), Value::Int(c.accumulation));
    }
    let mut ow_full = Dict::new();
    ow_full.insert("_delete_".into(), Value::Bool(true));
    ow_full.extend(ow);
    o.insert("optim_wrapper".into(), Value::Dict(ow_full));
    if let Some(base) = auto_scale_lr {
        o.insert(
            "auto_scale_lr".into(),
            dict(vec![
                ("enable", Value::Bool(true)),
                ("base_batch_size", Value::Int(base)),
            ]),
        );
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

/// The `--cfg-options` line for `tools/train.py`.
pub fn cfg_options_line(cfg: &Dict, c: &Candidate, auto_scale_lr: Option<i64>) -> String {
    let crop = format!("({},{})", c.crop.0, c.crop.1);
    let mut items = vec![format!("train_dataloader.batch_size={}", c.batch_size)];
    if let Some((depth, steps)) = cfg
        .get("train_dataloader")
        .and_then(dataset_pipeline)
        .and_then(|(depth, p)| p.as_seq().map(|s| (depth, s)))
    {
        let prefix = vec!["dataset"; depth].join(".");
        for (i, s) in steps.iter().enumerate() {
            if s.get_path("type").and_then(Value::as_str) == Some("RandomCrop") {
                items.push(format!(
                    "train_dataloader.{prefix}.pipeline.{i}.crop_size={crop}"
                ));
            }
        }
    }
    items.push(format!("model.data_preprocessor.size={crop}"));
    items.extend(super::knobs::cfg_option_items(c.knobs()));
    match c.amp {
        Amp::Off => items.push("optim_wrapper.type=OptimWrapper".into()),
        half => {
            items.push("optim_wrapper.type=AmpOptimWrapper".into());
            items.push(format!(
                "optim_wrapper.dtype={}",
                if half == Amp::Bf16 {
                    "bfloat16"
                } else {
                    "float16"
                }
            ));
            items.push("optim_wrapper.loss_scale=dynamic".into());
        }
    }
    if c.accumulation > 1 {
        items.push(format!(
            "optim_wrapper.accumulative_counts={}",
            c.accumulation
        ));
    }
    if let Some(base) = auto_scale_lr {
        items.push("auto_scale_lr.enable=True".into());
        items.push(format!("auto_scale_lr.base_batch_size={base}"));
    }
    quoted_line(&items)
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

fn check(path: &Path, c: &Candidate) -> Result<()> {
    let cfg = config::resolve(path, &[])
        .map_err(|e| Error::Trial(format!("the emitted config does not resolve:\n{e}")))?;
    let v = Value::Dict(cfg);
    let want_crop = tuple(c.crop);
    let ok = v.get_path("train_dataloader.batch_size") == Some(&Value::Int(c.batch_size))
        && v.get_path("model.data_preprocessor.size") == Some(&want_crop);
    if !ok {
        return Err(Error::Trial(format!(
            "the emitted config {} does not read back the winner",
            path.display()
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
    c: &Candidate,
    auto_scale_lr: Option<i64>,
    out_dir: &Path,
    header: &str,
) -> Result<Vec<PathBuf>> {
    let o = overrides(cfg, c, auto_scale_lr);
    write_child(input, &o, out_dir, header, TRAIN_SUFFIX, &|path| {
        check(path, c)
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
    if let [child, resolved_py] = targets.as_slice() {
        let mut text = format!(
            "// {header}\nlet _base_ = {};\n",
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
            "# {header}\n# Fully resolved (no _base_): MMSeg's tools/train.py and tools/test.py read it as is.\n{}",
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
            "# {header}\n# Fully resolved from a new-style config (no _base_: MMEngine refuses an old-style child of one; classes by their registered names, default_scope='mmseg'): MMSeg's tools/train.py reads it as is.\n{}",
            dump::to_python(&resolved)?
        );
        write_checked(path, &text, check, input)?;
        written.push(path.clone());
    } else {
        let path = &targets[0];
        let text = format!(
            "# {header}\n_base_ = {}\n{}",
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

    /// A recipe whose dataset is wrapped (`RepeatDataset`, as MMSeg's
    /// HRF/DRIVE/STARE/CHASE_DB1 configs are): the crop goes into the
    /// wrapped dataset's pipeline.
    #[test]
    fn a_wrapped_datasets_pipeline_gets_the_crop() {
        let cfg = match from_json(&serde_json::json!({
            "train_dataloader": {"batch_size": 4, "dataset": {
                "type": "RepeatDataset", "times": 40000, "dataset": {"pipeline": [
                    {"type": "LoadImageFromFile"},
                    {"type": "RandomCrop", "crop_size": {"__tuple__": [256, 256]}}
                ]}}},
            "optim_wrapper": {"type": "OptimWrapper"}
        })) {
            Value::Dict(d) => d,
            _ => unreachable!(),
        };
        let c = Candidate {
            batch_size: 2,
            crop: (128, 192),
            amp: Amp::Off,
            accumulation: 2,
            checkpoint: false,
            num_points: None,
            test_mode: None,
        };
        let o = overrides(&cfg, &c, None);
        let crop = o
            .get("train_dataloader")
            .and_then(|d| d.get_path("dataset.dataset.pipeline"))
            .and_then(Value::as_seq)
            .and_then(|p| p[1].get_path("crop_size"))
            .cloned();
        assert_eq!(crop, Some(tuple((128, 192))));
        let line = cfg_options_line(&cfg, &c, None);
        assert!(
            line.contains("train_dataloader.dataset.dataset.pipeline.1.crop_size=(128,192)"),
            "{line}"
        );
    }

    #[test]
    fn a_checkpointed_candidate_sets_the_backbones_with_cp() {
        let mut cfg = Dict::new();
        cfg.insert("crop_size".into(), tuple((512, 512)));
        let c = Candidate {
            batch_size: 2,
            crop: (512, 512),
            amp: Amp::Bf16,
            accumulation: 8,
            checkpoint: true,
            num_points: None,
            test_mode: None,
        };
        let o = overrides(&cfg, &c, None);
        assert_eq!(
            o.get("model").and_then(|m| m.get_path("backbone.with_cp")),
            Some(&Value::Bool(true))
        );
        let line = cfg_options_line(&cfg, &c, None);
        assert!(line.contains(" model.backbone.with_cp=True "), "{line}");
        let plain = Candidate {
            checkpoint: false,
            ..c
        };
        assert!(overrides(&cfg, &plain, None)
            .get("model")
            .and_then(|m| m.get_path("backbone"))
            .is_none());
        assert!(!cfg_options_line(&cfg, &plain, None).contains("with_cp"));
    }

    #[test]
    fn a_lowered_point_count_sets_the_heads_train_cfg() {
        let mut cfg = Dict::new();
        cfg.insert("crop_size".into(), tuple((512, 512)));
        let c = Candidate {
            batch_size: 2,
            crop: (512, 512),
            amp: Amp::Off,
            accumulation: 8,
            checkpoint: false,
            num_points: Some(6272),
            test_mode: None,
        };
        let o = overrides(&cfg, &c, None);
        assert_eq!(
            o.get("model")
                .and_then(|m| m.get_path("decode_head.train_cfg.num_points")),
            Some(&Value::Int(6272))
        );
        let line = cfg_options_line(&cfg, &c, None);
        assert!(
            line.contains(" model.decode_head.train_cfg.num_points=6272"),
            "{line}"
        );
    }
}
