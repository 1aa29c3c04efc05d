//! Writing a resolved config out: JSON in the encoding of
//! `mmseg-configs/resolved/*.json` (tuples as `{"__tuple__": [...]}`, floats
//! with Python's `repr`, NaN and infinities as `{"__float__": "nan"}` so that
//! the output stays strict JSON), a Python config that MMEngine loads back to the same
//! values (like `Config.dump`, keys sorted), and a native Rhai config.

use super::error::{ConfigError, ErrorKind};
use super::eval::mangle;
use super::translate::{rhai_float, rhai_string};
use super::value::{python_float_repr, python_str_repr, Dict, Value};
use std::fmt::Write as _;

/// The output formats of `segtune resolve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Py,
    Json,
    Rhai,
}

crate::named::named_enum!(Format, "a format", {
    Py => "py",
    Json => "json",
    Rhai => "rhai",
});

/// Renders `cfg` in `format`.
pub fn render(cfg: &Dict, format: Format) -> Result<String, ConfigError> {
    match format {
        Format::Json => Ok(to_json(&Value::Dict(cfg.clone()))),
        Format::Py => to_python(cfg),
        Format::Rhai => Ok(to_rhai(cfg)),
    }
}

/// JSON with two-space indentation, keys in config order.
pub fn to_json(v: &Value) -> String {
    let mut out = String::new();
    write_json(v, 0, &mut out);
    out.push('\n');
    out
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a str always serialises")
}

fn write_json(v: &Value, indent: usize, out: &mut String) {
    let pad = |n: usize| "  ".repeat(n);
    match v {
        Value::None => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        // Strict JSON has no NaN or Infinity: `{"__float__": "nan"}`, as
        // tuples are `{"__tuple__": [...]}`.
        Value::Float(f) if !f.is_finite() => {
            let name = if f.is_nan() {
                "nan"
            } else if *f > 0.0 {
                "inf"
            } else {
                "-inf"
            };
            let _ = write!(out, "{{\"__float__\": \"{name}\"}}");
        }
        Value::Float(f) => out.push_str(&python_float_repr(*f)),
        Value::Str(s) => out.push_str(&json_str(s)),
        Value::List(items) => write_json_array(items, indent, out),
        Value::Tuple(items) => {
            let _ = write!(out, "{{\n{}\"__tuple__\": ", pad(indent + 1));
            write_json_array(items, indent + 1, out);
            let _ = write!(out, "\n{}}}", pad(indent));
        }
        Value::Dict(d) => {
            if d.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push_str("{\n");
            for (i, (k, item)) in d.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                let _ = write!(out, "{}{}: ", pad(indent + 1), json_str(k));
                write_json(item, indent + 1, out);
            }
            let _ = write!(out, "\n{}}}", pad(indent));
        }
    }
}

fn write_json_array(items: &[Value], indent: usize, out: &mut String) {
    if items.is_empty() {
        out.push_str("[]");
        return;
    }
    out.push_str("[\n");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(",\n");
        }
        out.push_str(&"  ".repeat(indent + 1));
        write_json(item, indent + 1, out);
    }
    let _ = write!(out, "\n{}]", "  ".repeat(indent));
}

/// Reads the JSON encoding back (the inverse of [`to_json`]).
pub fn from_json(j: &serde_json::Value) -> Value {
    match j {
        serde_json::Value::Null => Value::None,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) if !n.is_f64() => Value::Int(i),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::Str(s.clone()),
        serde_json::Value::Array(items) => Value::List(items.iter().map(from_json).collect()),
        serde_json::Value::Object(map) => match (map.get("__tuple__"), map.get("__float__")) {
            (Some(serde_json::Value::Array(items)), _) if map.len() == 1 => {
                Value::Tuple(items.iter().map(from_json).collect())
            }
            (_, Some(serde_json::Value::String(name))) if map.len() == 1 => match name.as_str() {
                "nan" => Value::Float(f64::NAN),
                "inf" => Value::Float(f64::INFINITY),
                "-inf" => Value::Float(f64::NEG_INFINITY),
                _ => Value::Dict(map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect()),
            },
            _ => Value::Dict(map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect()),
        },
    }
}

const PY_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

fn is_py_identifier(k: &str) -> bool {
    let mut chars = k.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && !PY_KEYWORDS.contains(&k)
}

const WIDTH: usize = 79;

/// A Python config (`key = value` lines, keys sorted as `Config.dump`
/// sorts them) that MMEngine loads back to the same values.
pub fn to_python(cfg: &Dict) -> Result<String, ConfigError> {
    let mut keys: Vec<&String> = cfg.keys().collect();
    keys.sort();
    let mut out = String::new();
    for k in keys {
        if !is_py_identifier(k) || k == "_base_" {
            return Err(ConfigError::new(
                ErrorKind::Evaluation,
                format!("top-level key `{k}` cannot be written as a Python config variable"),
            ));
        }
        let prefix = format!("{k} = ");
        out.push_str(&prefix);
        write_py(&cfg[k], 0, prefix.len(), &mut out);
        out.push('\n');
    }
    Ok(out)
}

fn py_inline(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) if f.is_finite() => python_float_repr(*f),
        Value::Float(f) => format!("float('{}')", python_float_repr(*f)),
        Value::Str(s) => python_str_repr(s),
        Value::List(items) => format!(
            "[{}]",
            items.iter().map(py_inline).collect::<Vec<_>>().join(", ")
        ),
        Value::Tuple(items) if items.len() == 1 => format!("({},)", py_inline(&items[0])),
        Value::Tuple(items) => format!(
            "({})",
            items.iter().map(py_inline).collect::<Vec<_>>().join(", ")
        ),
        Value::Dict(d) => {
            let mut keys: Vec<&String> = d.keys().collect();
            keys.sort();
            if d.keys().all(|k| is_py_identifier(k)) {
                let parts: Vec<String> = keys
                    .iter()
                    .map(|k| format!("{k}={}", py_inline(&d[*k])))
                    .collect();
                format!("dict({})", parts.join(", "))
            } else {
                let parts: Vec<String> = keys
                    .iter()
                    .map(|k| format!("{}: {}", python_str_repr(k), py_inline(&d[*k])))
                    .collect();
                format!("{{{}}}", parts.join(", "))
            }
        }
    }
}

/// Writes `v` at `indent` levels, `column` characters into the line.
fn write_py(v: &Value, indent: usize, column: usize, out: &mut String) {
    let inline = py_inline(v);
    if column + inline.len() <= WIDTH
        || !matches!(v, Value::List(_) | Value::Tuple(_) | Value::Dict(_))
    {
        out.push_str(&inline);
        return;
    }
    let inner = "    ".repeat(indent + 1);
    match v {
        Value::List(items) | Value::Tuple(items) => {
            let (open, close) = v.python_brackets();
            out.push(open);
            out.push('\n');
            for item in items {
                out.push_str(&inner);
                write_py(item, indent + 1, inner.len(), out);
                out.push_str(",\n");
            }
            let _ = write!(out, "{}{close}", "    ".repeat(indent));
        }
        Value::Dict(d) => {
            let mut keys: Vec<&String> = d.keys().collect();
            keys.sort();
            let kwargs = d.keys().all(|k| is_py_identifier(k));
            out.push_str(if kwargs { "dict(\n" } else { "{\n" });
            for k in keys {
                let prefix = if kwargs {
                    format!("{k}=")
                } else {
                    format!("{}: ", python_str_repr(k))
                };
                let _ = write!(out, "{inner}{prefix}");
                write_py(&d[k], indent + 1, inner.len() + prefix.len(), out);
                out.push_str(",\n");
            }
            let _ = write!(
                out,
                "{}{}",
                "    ".repeat(indent),
                if kwargs { ")" } else { "}" }
            );
        }
        _ => unreachable!("scalars are written inline"),
    }
}

/// A native Rhai config: one `let` per top-level key.
pub fn to_rhai(cfg: &Dict) -> String {
    let mut out = String::from("// Resolved by segtune; evaluates to the same config.\n");
    for (k, v) in cfg {
        let _ = writeln!(out, "let {} = {};", mangle(k), rhai_value(v, 0));
    }
    out
}

/// A Rhai expression for `v`.
pub fn rhai_value(v: &Value, indent: usize) -> String {
    match v {
        Value::None => "()".into(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) if *i == i64::MIN => format!("({} - 1)", i64::MIN + 1),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => rhai_float(*f),
        Value::Str(s) => rhai_string(s),
        Value::List(items) => format!(
            "[{}]",
            items
                .iter()
                .map(|x| rhai_value(x, indent))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Tuple(items) => format!(
            "tuple([{}])",
            items
                .iter()
                .map(|x| rhai_value(x, indent))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Dict(d) if d.is_empty() => "#{}".into(),
        Value::Dict(d) => {
            let pad = "    ".repeat(indent + 1);
            let parts: Vec<String> = d
                .iter()
                .map(|(k, x)| format!("{pad}{}: {}", rhai_string(k), rhai_value(x, indent + 1)))
                .collect();
            format!("#{{\n{}\n{}}}", parts.join(",\n"), "    ".repeat(indent))
        }
    }
}

/// FNV-1a 64 of a text, in hex: a stable hash of a resolved config (the
/// search journal's key, the trace cache's).
pub fn hash_text(text: &str) -> String {
    let h = text.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trips_tuples_and_floats() {
        let mut d = Dict::new();
        d.insert(
            "crop_size".into(),
            Value::Tuple(vec![Value::Int(512), Value::Int(512)]),
        );
        d.insert("lr".into(), Value::Float(6e-05));
        d.insert("one".into(), Value::Float(1.0));
        let text = to_json(&Value::Dict(d.clone()));
        assert!(text.contains("6e-05") && text.contains("1.0"), "{text}");
        let back = from_json(&serde_json::from_str(&text).unwrap());
        assert_eq!(back, Value::Dict(d));
    }

    #[test]
    fn python_dump_sorts_and_quotes() {
        let mut inner = Dict::new();
        inner.insert("backbone.norm".into(), Value::Dict(Dict::new()));
        let mut d = Dict::new();
        d.insert("z".into(), Value::Tuple(vec![Value::Int(1)]));
        d.insert("a".into(), Value::Dict(inner));
        let text = to_python(&d).unwrap();
        assert_eq!(text, "a = {'backbone.norm': dict()}\nz = (1,)\n");
    }
}
