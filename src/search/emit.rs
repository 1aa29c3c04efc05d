//! Writing the winner as an MMSeg config: a child of the original (relative
//! `_base_`) that overrides exactly what changed — batch size, the crop
//! everywhere the recipe uses it (lists rewritten whole, since every file is
//! evaluated eagerly), the optimizer wrapper (AMP, accumulation) and
//! `auto_scale_lr` when the effective batch cannot be kept — plus the
//! equivalent `--cfg-options` line for `tools/train.py`. For a `.rhai`
//! recipe, a `.rhai` override and a standalone resolved `.py` (MMSeg cannot
//! read Rhai). Files are written to a temporary name, checked by resolving
//! them, then renamed: nothing is left half-written, the input never touched.

use super::edits::{dict, quoted_line, tuple};
pub use super::edits::{Edit, Reasons, Winner, Written};
use super::space::{Amp, Candidate, TestMode};
use crate::config::{self, dump, Dict, Value};
use crate::error::{Error, Result};
use std::path::{Component, Path, PathBuf};

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
    written: &Written,
    out_dir: &Path,
    header: &str,
) -> Result<Vec<PathBuf>> {
    let o = written.overrides(cfg);
    write_child(input, &o, out_dir, header, TRAIN_SUFFIX, &|path| {
        check(path, &written.edits)
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
