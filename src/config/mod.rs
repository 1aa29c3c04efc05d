//! The config engine: loads MMSeg Python configs and native Rhai configs and
//! resolves them exactly as MMEngine 0.10.7's `Config.fromfile` does
//! (`../shared/mmseg-configs/SPEC.md`): every file evaluated eagerly on its
//! own, bases merged by `_merge_a_into_b`, `_delete_`, `{{_base_.x}}` and
//! `_base_.x`, predefined and environment variables, then `--cfg-options`.
//!
//! The layer, in the order a config goes through it:
//! - `loader`: [`Loader`] reads a file after its `_base_` files (once each,
//!   refusing cycles through `_base_` and `import`) and merges it over
//!   them; `imports` loads the `.rhai` modules a Rhai config imports;
//!   `new_style` loads MMEngine's new-style (`with read_base():`) configs;
//! - `substitute`: the text substitutions MMEngine makes in a Python config
//!   (`{{ fileDirname }}`, `{{'$ENV:default'}}`, `{{_base_.x}}`);
//! - `prepare`: per language, reads a file's `_base_` list and compiles it:
//!   Python through [`translate`] (Python to Rhai), Rhai as is;
//! - [`eval`]: the Rhai engine that runs it, with Python's operators and
//!   builtins from [`pyops`];
//! - [`merge`]: `_merge_a_into_b`, `_delete_` and `--cfg-options`;
//! - [`value`] and [`error`]: the values and the diagnostics all of these
//!   share; [`dump`] writes a resolved config back out, and [`written`]
//!   bounds how large that would be; [`presets`] are the shipped modules a
//!   Rhai config may `import`;
//! - [`metafile`]: MMSeg's `metafile.yaml` files, the published result of
//!   each config (`segtune atlas`).

pub mod dump;
pub mod error;
pub mod eval;
pub mod eval_meter;
mod guarded;
pub mod hf;
mod imports;
mod loader;
mod memo;
pub mod merge;
pub mod metafile;
mod new_style;
mod prepare;
pub mod presets;
pub mod pyops;
pub mod source;
mod substitute;
pub mod train_loop;
pub mod translate;
pub mod value;
pub mod written;

pub use error::{ConfigError, ErrorKind, Location};
pub use loader::{absolute, Loader, RESERVED_KEYS};
pub use value::{Dict, Value};

use eval::Limits;
use prepare::{FileKind, Prepared};
use std::path::Path;

/// A dataloader's pipeline: under its `dataset`, or the `dataset` of
/// dataset wrappers (`RepeatDataset`, `ConcatDataset`'s first, ...), four
/// deep at most.
pub fn dataloader_pipeline(loader: &Value) -> Option<&Value> {
    let mut node = loader.get_path("dataset")?;
    for _ in 0..4 {
        if let Some(p) = node.get_path("pipeline") {
            return Some(p);
        }
        node = node.get_path("dataset")?;
    }
    None
}

/// The modules a config's `custom_imports` names (`imports`, a string or a
/// list), in order: the user's Python that MMEngine imports before building
/// anything, and that segtune reads as text and never runs.
pub fn custom_imports(cfg: &Dict) -> Vec<String> {
    let imports = match cfg.get("custom_imports") {
        Some(Value::Dict(d)) => d.get("imports"),
        _ => None,
    };
    match imports {
        Some(Value::Str(one)) => vec![one.clone()],
        Some(Value::List(many) | Value::Tuple(many)) => many
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// What segtune says of a config's `custom_imports` when it builds the
/// model itself: the modules were read as names, never imported, although
/// MMEngine imports them before building (and may stop there, or they may
/// register types that replace MMSeg's). `None` without `custom_imports`.
pub fn custom_imports_note(cfg: &Dict) -> Option<String> {
    // MMSeg's own configs import OpenMMLab's libraries (ConvNeXt's
    // `mmpretrain.models`, Mask2Former's `mmdet.models`), whose types
    // segtune rebuilds: not the user's code.
    const OPENMMLAB: [&str; 6] = ["mmpretrain", "mmdet", "mmseg", "mmcv", "mmengine", "mmcls"];
    let modules: Vec<String> = custom_imports(cfg)
        .into_iter()
        .filter(|m| !OPENMMLAB.contains(&m.split('.').next().unwrap_or("")))
        .collect();
    if modules.is_empty() {
        return None;
    }
    let strict = !matches!(
        cfg.get("custom_imports"),
        Some(Value::Dict(d)) if matches!(d.get("allow_failed_imports"), Some(Value::Bool(true)))
    );
    Some(format!(
        "custom_imports ({}) not imported: segtune never runs your Python unasked, so it built \
         MMSeg's own types from the config's text; MMEngine imports them first{} and a module \
         may register a type that replaces MMSeg's. --python-worker runs the step with your \
         modules imported",
        modules
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", "),
        if strict {
            " (and stops with ImportError where one cannot be imported: allow_failed_imports=False)"
        } else {
            ""
        }
    ))
}

/// Loads `path` and applies `--cfg-options` items: the whole of
/// `Config.fromfile(path)` + `merge_from_dict`.
/// Answered from [`memo`] when this process resolved the same file and
/// options before and nothing the load read has changed since.
pub fn resolve(path: &Path, cfg_options: &[String]) -> Result<Dict, ConfigError> {
    if hf::is_hf_dir(path) {
        return on_evaluation_stack(|| {
            let cfg = hf::load_dir(path)?;
            let cfg = with_cfg_options(cfg, cfg_options)?;
            written::check(&cfg, path, "")?;
            Ok(cfg)
        });
    }
    let abs = absolute(path);
    if let Some(cfg) = memo::recall(&abs, cfg_options) {
        return Ok(cfg);
    }
    let (resolved, sources, env) = on_evaluation_stack(|| {
        memo::start_noting();
        // `load` checks the size of what it resolved; options merge after.
        let mut loader = Loader::new(Limits::default());
        let resolved = loader.load(path).and_then(|cfg| {
            if cfg_options.is_empty() {
                return Ok(cfg);
            }
            let cfg = with_cfg_options(cfg, cfg_options)?;
            written::check(&cfg, &abs, " with its --cfg-options")?;
            Ok(cfg)
        });
        (resolved, loader.sources(), memo::env_read())
    });
    if let Ok(cfg) = &resolved {
        let mut sources = sources;
        sources.push(abs.clone());
        memo::keep(&abs, cfg_options, sources, env, cfg);
    }
    resolved
}

/// Whether `path` is an MMEngine new-style config (`with read_base():`,
/// imported classes): MMEngine refuses an old-style `_base_` child of one.
pub fn is_new_style(path: &Path) -> bool {
    let abs = absolute(path);
    source::read_source(&abs)
        .ok()
        .is_some_and(|text| new_style::is_new_style(&abs, &text).unwrap_or(false))
}

fn with_cfg_options(cfg: Dict, cfg_options: &[String]) -> Result<Dict, ConfigError> {
    if cfg_options.is_empty() {
        Ok(cfg)
    } else {
        merge::apply_cfg_options(cfg, merge::parse_cfg_options(cfg_options)?)
    }
}

/// Stack for loading a config. The parser's syntax trees of a hostile file
/// can be deep (a 100 000-term sum parses into a tree that deep), and
/// dropping or walking them recurses; the translator refuses nesting beyond
/// [`translate::MAX_EXPR_NESTING`], and this stack holds what comes before.
/// Only the pages touched are ever committed.
const EVALUATION_STACK_BYTES: usize = 512 << 20;

/// Runs `f` on a thread with [`EVALUATION_STACK_BYTES`] of stack.
fn on_evaluation_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("segtune-config".into())
            .stack_size(EVALUATION_STACK_BYTES)
            .spawn_scoped(scope, || {
                eval_meter::start_metering();
                let out = f();
                eval_meter::stop_metering();
                out
            });
        match handle {
            Ok(h) => h
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(e) => panic!("cannot start a thread to load the config: {e}"),
        }
    })
}

/// Evaluates one config's source text on its own (no `_base_` allowed):
/// the entry point for property tests and fuzzing of the translator.
pub fn evaluate_source(path: &Path, source: &str) -> Result<Dict, ConfigError> {
    on_evaluation_stack(|| evaluate_source_here(path, source))
}

fn evaluate_source_here(path: &Path, source: &str) -> Result<Dict, ConfigError> {
    let limits = Limits::default();
    let prepared = Prepared::new(FileKind::of(path)?, path, source, limits)?;
    if !prepared.bases.paths.is_empty() {
        return Err(ConfigError::new(
            ErrorKind::MissingBase,
            "evaluate_source takes configs without `_base_`",
        ));
    }
    let (cfg, _) = prepared.evaluate(path, source, Dict::new(), &Loader::new(limits))?;
    Ok(cfg)
}
