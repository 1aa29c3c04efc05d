//! Text substitution, in the order MMEngine applies it to a Python config:
//! predefined variables (`{{ fileDirname }}` and friends) and environment
//! variables (`{{'$NAME:default'}}`) are replaced in the source text before
//! parsing; each `{{_base_.a.b}}` becomes a placeholder string that is
//! replaced by the bases' value once the file has been evaluated.
//! Rhai configs get none of this: they read `_base_` directly.

use super::error::{ConfigError, ErrorKind, Location};
use super::value::{Dict, Value};
use regex::Regex;
use std::path::Path;
use std::sync::OnceLock;

/// `{{_base_.x}}` placeholders of one file: (the token written into the
/// source as a string, the dotted path into the bases it stands for).
pub(super) type BasePlaceholders = Vec<(String, String)>;

/// Everything MMEngine substitutes in a Python config's text before parsing
/// it: the text to parse and the `{{_base_.x}}` placeholders in it.
pub(super) fn before_parsing(
    raw: &str,
    abs: &Path,
) -> Result<(String, BasePlaceholders), ConfigError> {
    let text = substitute_predefined_vars(raw, abs);
    let text = substitute_env_vars(&text, abs)?;
    Ok(pre_substitute_base_vars(&text))
}

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("static regex"))
}

/// `_substitute_predefined_vars`: `{{ fileDirname }}` and friends.
fn substitute_predefined_vars(text: &str, abs: &Path) -> String {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !text.contains("{{") {
        return text.to_string();
    }
    let dir = abs
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let base = abs
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let stem = abs
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let ext = abs
        .extension()
        .map(|s| format!(".{}", s.to_string_lossy()))
        .unwrap_or_default();
    let re = regex(
        &RE,
        r"\{\{\s*(fileDirname|fileBasename|fileBasenameNoExtension|fileExtname)\s*\}\}",
    );
    re.replace_all(text, |c: &regex::Captures| {
        match &c[1] {
            "fileDirname" => dir.clone(),
            "fileBasename" => base.clone(),
            "fileBasenameNoExtension" => stem.clone(),
            _ => ext.clone(),
        }
        .replace('\\', "/")
    })
    .into_owned()
}

/// `_substitute_env_variables`: `{{'$NAME:default'}}`.
fn substitute_env_vars(text: &str, abs: &Path) -> Result<String, ConfigError> {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !text.contains("{{") {
        return Ok(text.to_string());
    }
    let re = regex(&RE, r#"\{\{['"]?\s*\$(\w+)\s*:\s*(\S*?)\s*['"]?\}\}"#);
    let mut failure = None;
    let out = re.replace_all(text, |c: &regex::Captures| {
        match super::memo::env_var(&c[1]) {
            Some(v) => v,
            None if !c[2].is_empty() => c[2].to_string(),
            None => {
                failure.get_or_insert_with(|| c[1].to_string());
                String::new()
            }
        }
    });
    match failure {
        Some(name) => Err(ConfigError::new(
            ErrorKind::Evaluation,
            format!("environment variable `{name}` is not set and has no default"),
        )
        .at(Location::from_offset(
            abs,
            text,
            text.find(&format!("${name}")).unwrap_or(0),
        ))
        .with_help(format!(
            "set {name} or write a default: {{{{'${name}:value'}}}}"
        ))),
        None => Ok(out.into_owned()),
    }
}

/// `_pre_substitute_base_vars`: each `{{_base_.a.b}}` becomes a quoted
/// placeholder string, replaced by the base's value after evaluation.
fn pre_substitute_base_vars(text: &str) -> (String, BasePlaceholders) {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !text.contains("{{") {
        return (text.to_string(), Vec::new());
    }
    let re = regex(&RE, r"\{\{\s*_base_\.([\w\.]+)\s*\}\}");
    let mut placeholders: BasePlaceholders = Vec::new();
    let out = re.replace_all(text, |c: &regex::Captures| {
        let path = c[1].to_string();
        let token = match placeholders.iter().find(|(_, p)| *p == path) {
            Some((t, _)) => t.clone(),
            None => {
                let digest = path.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                    (h ^ b as u64).wrapping_mul(0x100000001b3)
                });
                let t = format!("_{path}_{:06x}", digest & 0xffffff);
                placeholders.push((t.clone(), path));
                t
            }
        };
        format!("\"{token}\"")
    });
    (out.into_owned(), placeholders)
}

/// `_substitute_base_vars`: replaces placeholder strings (dict values and
/// list/tuple items, never keys) by the bases' values.
pub(super) fn substitute_base_vars(
    cfg: Dict,
    placeholders: &[(String, String)],
    base: &Dict,
) -> Result<Dict, ConfigError> {
    fn lookup(path: &str, base: &Dict) -> Result<Value, ConfigError> {
        let mut cur: Option<&Value> = None;
        for (i, key) in path.split('.').enumerate() {
            let next = if i == 0 {
                base.get(key)
            } else {
                cur.and_then(|v| v.as_dict()).and_then(|d| d.get(key))
            };
            cur = Some(next.ok_or_else(|| {
                ConfigError::new(
                    ErrorKind::Evaluation,
                    format!("KeyError: `{{{{_base_.{path}}}}}`: the bases have no `{key}` there"),
                )
            })?);
        }
        Ok(cur.cloned().unwrap_or(Value::None))
    }
    fn walk(
        v: Value,
        placeholders: &[(String, String)],
        base: &Dict,
    ) -> Result<Value, ConfigError> {
        Ok(match v {
            Value::Str(s) => match placeholders.iter().find(|(t, _)| *t == s) {
                Some((_, path)) => lookup(path, base)?,
                None => Value::Str(s),
            },
            Value::List(items) => Value::List(
                items
                    .into_iter()
                    .map(|x| walk(x, placeholders, base))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Tuple(items) => Value::Tuple(
                items
                    .into_iter()
                    .map(|x| walk(x, placeholders, base))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Dict(d) => Value::Dict(
                d.into_iter()
                    .map(|(k, x)| Ok((k, walk(x, placeholders, base)?)))
                    .collect::<Result<_, ConfigError>>()?,
            ),
            other => other,
        })
    }
    match walk(Value::Dict(cfg), placeholders, base)? {
        Value::Dict(d) => Ok(d),
        _ => unreachable!("walking a dict gives a dict"),
    }
}
