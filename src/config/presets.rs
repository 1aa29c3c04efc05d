//! GPU presets (`presets/*.rhai`, embedded in the binary), which a `.rhai`
//! config imports as modules (`import "rtx3050ti" as gpu;`, resolved by
//! [`super::imports`]) and `--preset` names.

use super::error::{ConfigError, ErrorKind};
use super::value::{Dict, Value};
use rhai::{Engine, EvalAltResult, Module, Scope};

/// Shipped presets: canonical name and source.
const PRESETS: &[(&str, &str)] = &[
    (
        "rtx3050ti-laptop",
        include_str!("../../presets/rtx3050ti-laptop.rhai"),
    ),
    ("rtx2070", include_str!("../../presets/rtx2070.rhai")),
    ("rtx3060", include_str!("../../presets/rtx3060.rhai")),
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

/// The canonical name and source of preset `name` (or an alias of it).
pub(super) fn source_of(name: &str) -> Option<(&'static str, &'static str)> {
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

/// Evaluates a preset's source as a Rhai module.
pub(super) fn compile_module(
    engine: &Engine,
    source: &str,
    id: &str,
) -> Result<Module, Box<EvalAltResult>> {
    let mut ast = engine.compile(source)?;
    ast.set_source(id);
    Module::eval_ast_as_new(Scope::new(), &ast, engine)
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
                "cuda_context_mib",
                "cublas_workspace_kib",
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
