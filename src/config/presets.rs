//! GPU presets (`presets/*.rhai`, embedded in the binary), which a `.rhai`
//! config imports as modules (`import "rtx3050ti" as gpu;`, resolved by
//! [`super::imports`]) and `--preset` names: one file per NVIDIA card (see
//! docs/gpus.md), found by its slug, an alias, its name or the name
//! nvidia-smi prints ([`resolve`]).

use super::error::{ConfigError, ErrorKind};
use super::value::{Dict, Value};
use rhai::{Engine, EvalAltResult, Module, Scope};
use std::sync::OnceLock;

/// `(slug, source)` of `presets/<slug>.rhai`.
macro_rules! preset {
    ($slug:literal) => {
        (
            $slug,
            include_str!(concat!("../../presets/", $slug, ".rhai")),
        )
    };
}

/// Shipped presets, Pascal to Blackwell: canonical name and source (a test
/// checks that every file of `presets/` is here).
const PRESETS: &[(&str, &str)] = &[
    preset!("gtx1060-6gb"),
    preset!("gtx1070"),
    preset!("gtx1080"),
    preset!("gtx1080ti"),
    preset!("p100-pcie-16gb"),
    preset!("v100-pcie-16gb"),
    preset!("v100-pcie-32gb"),
    preset!("v100-sxm2-16gb"),
    preset!("v100-sxm2-32gb"),
    preset!("gtx1650"),
    preset!("gtx1660ti"),
    preset!("rtx2060"),
    preset!("rtx2070"),
    preset!("rtx2080"),
    preset!("rtx2080ti"),
    preset!("titan-rtx"),
    preset!("t4"),
    preset!("rtx3050ti-laptop"),
    preset!("rtx3060-laptop"),
    preset!("rtx3070-laptop"),
    preset!("rtx3080ti-laptop"),
    preset!("rtx3060"),
    preset!("rtx3060ti"),
    preset!("rtx3070"),
    preset!("rtx3080"),
    preset!("rtx3090"),
    preset!("rtx3090ti"),
    preset!("rtx-a4000"),
    preset!("rtx-a6000"),
    preset!("a10"),
    preset!("a40"),
    preset!("a100-pcie-40gb"),
    preset!("a100-sxm4-40gb"),
    preset!("a100-pcie-80gb"),
    preset!("a100-sxm4-80gb"),
    preset!("rtx4050-laptop"),
    preset!("rtx4060-laptop"),
    preset!("rtx4070-laptop"),
    preset!("rtx4060"),
    preset!("rtx4060ti"),
    preset!("rtx4070"),
    preset!("rtx4070ti"),
    preset!("rtx4080"),
    preset!("rtx4090"),
    preset!("l4"),
    preset!("l40s"),
    preset!("h100-pcie"),
    preset!("h100-sxm"),
    preset!("h200"),
    preset!("rtx5080"),
    preset!("rtx5090"),
    preset!("b200"),
];

/// Every field a card states (docs/gpus.md), in the order `segtune
/// presets --json` writes them; the six calibrated presets also state
/// [`OVERHEAD_FIELDS`].
pub const CARD_FIELDS: &[&str] = &[
    "preset",
    "name",
    "nvidia_smi_names",
    "architecture",
    "form",
    "vram_mib",
    "compute_capability",
    "bf16",
    "tensor_cores",
    "sms",
    "boost_clock_mhz",
    "fp32_tflops",
    "fp16_tflops",
    "bf16_tflops",
    "tf32_tflops",
    "memory_bandwidth_gbs",
    "l2_kib",
    "link",
    "link_gbs",
];

/// The device-memory overheads only calibrated presets state.
pub const OVERHEAD_FIELDS: &[&str] = &["cuda_context_mib", "cublas_workspace_kib"];

/// Other names users type for the same cards.
const ALIASES: &[(&str, &str)] = &[
    ("rtx3050ti", "rtx3050ti-laptop"),
    ("3050ti", "rtx3050ti-laptop"),
    ("h100", "h100-sxm"),
    ("p100", "p100-pcie-16gb"),
];

/// Canonical names of the shipped presets.
pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _)| *n).collect()
}

/// The card's names besides its slug: `name`, then `nvidia_smi_names`
/// (read from the source's lines, without evaluating it).
pub fn card_names(slug: &str) -> Vec<&'static str> {
    let Some((_, source)) = PRESETS.iter().find(|(n, _)| *n == slug) else {
        return Vec::new();
    };
    let mut out = declared_strings(source, "name");
    out.extend(declared_strings(source, "nvidia_smi_names"));
    out
}

/// The name nvidia-smi prints for preset `slug` (else its `name`).
pub fn display_name(slug: &str) -> Option<&'static str> {
    let names = card_names(slug);
    names.get(1).or(names.first()).copied()
}

/// The quoted strings of `export const KEY = ...;` in a preset's source.
fn declared_strings(source: &'static str, key: &str) -> Vec<&'static str> {
    let prefix = format!("export const {key} =");
    source
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(prefix.as_str()))
        .map(|rest| {
            let code = rest.split(';').next().unwrap_or_default();
            code.split('"').skip(1).step_by(2).collect()
        })
        .unwrap_or_default()
}

/// A name as compared: lower case, single spaces, no leading "NVIDIA ".
fn normalized(text: &str) -> String {
    let joined = text
        .split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ");
    match joined.strip_prefix("nvidia ") {
        Some(rest) => rest.to_string(),
        None => joined,
    }
}

/// A name with only its letters and digits, less "nvidia" and "geforce"
/// (`RTX 3060`, `rtx-3060` and `GeForce RTX 3060` are `rtx3060`).
fn compact(text: &str) -> String {
    normalized(text)
        .replace("geforce", "")
        .replace("nvidia", "")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect()
}

/// Every name of every preset, normalized: `(preset, normalized, compact)`.
fn keys() -> &'static [(&'static str, String, String)] {
    static KEYS: OnceLock<Vec<(&'static str, String, String)>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut out = Vec::new();
        for (slug, _) in PRESETS {
            let aliases = ALIASES.iter().filter(|(_, c)| c == slug).map(|(a, _)| *a);
            let names = std::iter::once(*slug)
                .chain(aliases)
                .chain(card_names(slug));
            for n in names {
                out.push((*slug, normalized(n), compact(n)));
            }
        }
        out
    })
}

/// The canonical name of the preset `text` names: its slug or an alias
/// (a `.rhai` suffix allowed), or its `name` or one of its
/// `nvidia_smi_names`, case-insensitive, with or without a leading
/// "NVIDIA ", however spaced; last, the one card whose letters and digits
/// alone match (`RTX 3060`, `rtx-3060-laptop`).
pub fn resolve(text: &str) -> Option<&'static str> {
    let key = text.trim().trim_end_matches(".rhai").to_ascii_lowercase();
    let slug = ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key.as_str(), |(_, c)| c);
    if let Some((n, _)) = PRESETS.iter().find(|(n, _)| *n == slug) {
        return Some(n);
    }
    let normal = normalized(text);
    if let Some((n, _, _)) = keys().iter().find(|(_, k, _)| *k == normal) {
        return Some(n);
    }
    let short = compact(text);
    if short.is_empty() {
        return None;
    }
    let mut found = keys()
        .iter()
        .filter(|(_, _, c)| *c == short)
        .map(|(n, _, _)| *n);
    let first = found.next()?;
    found.all(|n| n == first).then_some(first)
}

/// The preset closest to `text` by edit distance over every slug, alias
/// and name: `(slug, the name nvidia-smi prints)`.
pub fn suggestion(text: &str) -> Option<(&'static str, &'static str)> {
    let (normal, short) = (normalized(text), compact(text));
    let (_, slug) = keys()
        .iter()
        .map(|(n, k, c)| (levenshtein(&normal, k).min(levenshtein(&short, c)), *n))
        .min_by_key(|(d, _)| *d)?;
    Some((slug, display_name(slug).unwrap_or(slug)))
}

/// Edits (insert, delete, substitute a character) from `a` to `b`.
fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The error for a name that is no preset: the closest card, and where
/// the list is.
pub fn unknown(name: &str) -> ConfigError {
    let guess = suggestion(name)
        .map(|(slug, card)| format!("did you mean `{slug}` ({card})? "))
        .unwrap_or_default();
    ConfigError::new(ErrorKind::Io, format!("unknown GPU preset `{name}`")).with_help(format!(
        "{guess}`segtune presets` lists every card (slug or the name nvidia-smi prints)"
    ))
}

/// The canonical name and source of preset `name` (see [`resolve`]).
pub(super) fn source_of(name: &str) -> Option<(&'static str, &'static str)> {
    let canonical = resolve(name)?;
    PRESETS.iter().find(|(n, _)| *n == canonical).copied()
}

/// The exported constants of preset `name` (`vram_mib`, `bf16`, ...).
pub fn load(name: &str) -> Result<Dict, ConfigError> {
    let (canonical, source) = source_of(name).ok_or_else(|| unknown(name))?;
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
mod tests;
