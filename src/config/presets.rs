//! GPU presets (`presets/*.rhai`, embedded in the binary) and the Rhai
//! module resolver that lets a `.rhai` config `import "rtx3050ti" as gpu;`.
//!
//! An `import` path is looked up first as a `.rhai` file relative to the
//! importing config's directory, then among the shipped presets.

use super::error::{ConfigError, ErrorKind};
use super::value::{Dict, Value};
use rhai::{Engine, EvalAltResult, Module, Position, Scope, Shared};
use std::path::{Path, PathBuf};

/// Shipped presets: canonical name and source.
const PRESETS: &[(&str, &str)] = &[
    (
        "rtx3050ti-laptop",
        include_str!("../../presets/rtx3050ti-laptop.rhai"),
    ),
    ("rtx2070", include_str!("../../presets/rtx2070.rhai")),
    ("rtx3090", include_str!("../../presets/rtx3090.rhai")),
    ("rtx4090", include_str!("../../presets/rtx4090.rhai")),
    ("h200", include_str!("../../presets/h200.rhai")),
];

/// Other names users type for the same cards.
const ALIASES: &[(&str, &str)] = &[
    ("rtx3050ti", "rtx3050ti-laptop"),
    ("3050ti", "rtx3050ti-laptop"),
];

/// Canonical names of the shipped presets.
pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _)| *n).collect()
}

fn source_of(name: &str) -> Option<(&'static str, &'static str)> {
    let key = name.trim_end_matches(".rhai").to_ascii_lowercase();
    let canonical = ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key.as_str(), |(_, c)| c);
    PRESETS.iter().find(|(n, _)| *n == canonical).copied()
}

/// The exported constants of preset `name` (`vram_mib`, `bf16`, ...).
pub fn load(name: &str) -> Result<Dict, ConfigError> {
    let (canonical, source) = source_of(name).ok_or_else(|| {
        ConfigError::new(ErrorKind::Io, format!("unknown GPU preset `{name}`"))
            .with_help(format!("shipped presets: {}", names().join(", ")))
    })?;
    let engine = Engine::new();
    let module = compile_module(&engine, source, canonical).map_err(|e| {
        ConfigError::new(
            ErrorKind::Evaluation,
            format!("preset `{canonical}` is broken: {e}"),
        )
    })?;
    let mut out = Dict::new();
    out.insert("preset".into(), Value::Str(canonical.into()));
    for (k, v) in module.iter_var() {
        let v = super::eval::to_value(v).map_err(|e| {
            ConfigError::new(ErrorKind::Evaluation, format!("preset `{canonical}`: {e}"))
        })?;
        out.insert(k.to_string(), v);
    }
    Ok(out)
}

fn compile_module(engine: &Engine, source: &str, id: &str) -> Result<Module, Box<EvalAltResult>> {
    let mut ast = engine.compile(source)?;
    ast.set_source(id);
    Module::eval_ast_as_new(Scope::new(), &ast, engine)
}

/// Resolves `import` paths for config scripts.
pub struct ModuleResolver {
    config_dir: Option<PathBuf>,
}

impl ModuleResolver {
    pub fn new(config_dir: Option<PathBuf>) -> ModuleResolver {
        ModuleResolver { config_dir }
    }

    fn local_file(&self, path: &str) -> Option<PathBuf> {
        let dir = self.config_dir.as_deref().unwrap_or(Path::new("."));
        let candidate = dir.join(path);
        let with_ext = if candidate.extension().is_some_and(|e| e == "rhai") {
            candidate
        } else {
            dir.join(format!("{path}.rhai"))
        };
        with_ext.is_file().then_some(with_ext)
    }
}

impl rhai::ModuleResolver for ModuleResolver {
    fn resolve(
        &self,
        engine: &Engine,
        _source: Option<&str>,
        path: &str,
        pos: Position,
    ) -> Result<Shared<Module>, Box<EvalAltResult>> {
        let not_found = || Box::new(EvalAltResult::ErrorModuleNotFound(path.to_string(), pos));
        let module = if let Some(file) = self.local_file(path) {
            let text = std::fs::read_to_string(&file).map_err(|_| not_found())?;
            compile_module(engine, &text, &file.display().to_string())
        } else if let Some((name, source)) = source_of(path) {
            compile_module(engine, source, name)
        } else {
            return Err(not_found());
        };
        module
            .map(Shared::new)
            .map_err(|e| Box::new(EvalAltResult::ErrorInModule(path.to_string(), e, pos)))
    }
}

/// A preset's VRAM in bytes (nvidia-smi's MiB are binary).
pub fn vram_bytes(preset: &Dict) -> Option<u64> {
    preset
        .get("vram_mib")
        .and_then(Value::as_i64)
        .map(|m| m as u64 * 1024 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rhai::Dynamic;

    #[test]
    fn every_preset_loads_with_its_fields() {
        for name in names() {
            let p = load(name).unwrap();
            for field in [
                "vram_mib",
                "compute_capability",
                "bf16",
                "fp32_tflops",
                "fp16_tflops",
                "memory_bandwidth_gbs",
            ] {
                assert!(p.contains_key(field), "{name} lacks {field}");
            }
        }
        assert_eq!(
            vram_bytes(&load("rtx3050ti").unwrap()),
            Some(4096 * 1024 * 1024)
        );
        assert!(load("gtx9999").is_err());
    }

    #[test]
    fn dynamic_unit_is_none() {
        assert_eq!(
            super::super::eval::to_value(&Dynamic::UNIT).unwrap(),
            Value::None
        );
    }
}
