//! The winner of a Hugging Face search, written as what transformers reads:
//! `training_args.json` (fields of `TrainingArguments`: the input's own
//! `training_args.json`, if any, with `per_device_train_batch_size`,
//! `gradient_accumulation_steps`, `fp16`/`bf16` and
//! `gradient_checkpointing` set when it matters) and `preprocessor_config.json` (the
//! input's, or a `SegformerImageProcessor`'s, with `size` set to the
//! winner's image size). Each file is written whole (a temporary file
//! renamed into place); the model directory is never written to.

use super::space::{Amp, Candidate};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The `TrainingArguments` fields of the winner, over `base` (the input's).
pub fn training_arguments(
    base: Option<serde_json::Map<String, serde_json::Value>>,
    c: &Candidate,
) -> serde_json::Map<String, serde_json::Value> {
    let mut args = base.unwrap_or_default();
    args.insert("per_device_train_batch_size".into(), c.batch_size.into());
    args.insert("gradient_accumulation_steps".into(), c.accumulation.into());
    args.insert("fp16".into(), (c.amp == Amp::Fp16).into());
    args.insert("bf16".into(), (c.amp == Amp::Bf16).into());
    // Deprecated in transformers 5 (activation_checkpointing), read by 4.x
    // and 5.x alike: set when the winner needs it or the input set it.
    if c.checkpoint || args.contains_key("gradient_checkpointing") {
        args.insert("gradient_checkpointing".into(), c.checkpoint.into());
    }
    args
}

/// The image processor's config with the winner's `size`, over `base`.
pub fn processor_config(
    base: Option<serde_json::Map<String, serde_json::Value>>,
    c: &Candidate,
) -> serde_json::Map<String, serde_json::Value> {
    let mut p = base.unwrap_or_else(|| {
        let mut m = serde_json::Map::new();
        m.insert(
            "image_processor_type".into(),
            "SegformerImageProcessor".into(),
        );
        m
    });
    p.insert(
        "size".into(),
        serde_json::json!({"height": c.crop.0, "width": c.crop.1}),
    );
    p
}

fn read_object(path: &Path) -> Option<serde_json::Map<String, serde_json::Value>> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text).ok()? {
        serde_json::Value::Object(m) => Some(m),
        _ => None,
    }
}

fn write_whole(path: &Path, value: &serde_json::Map<String, serde_json::Value>) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value).expect("JSON values serialise") + "\n";
    std::fs::write(&tmp, text)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(format!("cannot write {}", path.display()), e)
        })
}

/// The files a Hugging Face search writes into `out_dir`.
pub fn targets(out_dir: &Path) -> [PathBuf; 2] {
    [
        out_dir.join("training_args.json"),
        out_dir.join("preprocessor_config.json"),
    ]
}

/// Refuses, before any trial, an `--out` that is the model directory
/// itself, or that holds a `training_args.json` or `preprocessor_config.json`
/// that no earlier search there wrote.
pub fn check_out(model_dir: &Path, out_dir: &Path) -> Result<()> {
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(model_dir, out_dir) {
        return Err(Error::Input(format!(
            "--out {} is the model directory; segtune never writes into its input (give another --out)",
            out_dir.display()
        )));
    }
    for path in targets(out_dir) {
        if path.exists() && !super::saved::listed_as_emitted(out_dir, &path) {
            return Err(Error::Input(format!(
                "{} exists and no segtune search wrote it; segtune never replaces a file it \
                 did not write: move it away or give another --out",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Writes the winner of the search of the model directory `model_dir` into
/// `out_dir`; returns the written paths.
pub fn emit_hf(model_dir: &Path, c: &Candidate, out_dir: &Path) -> Result<Vec<PathBuf>> {
    check_out(model_dir, out_dir)?;
    let [args_path, processor_path] = targets(out_dir);
    write_whole(
        &args_path,
        &training_arguments(read_object(&model_dir.join("training_args.json")), c),
    )?;
    write_whole(
        &processor_path,
        &processor_config(read_object(&model_dir.join("preprocessor_config.json")), c),
    )?;
    Ok(vec![args_path, processor_path])
}
