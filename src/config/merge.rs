//! MMEngine's merge rules (`Config._merge_a_into_b`) and its `--cfg-options`
//! parsing (`DictAction` + `merge_from_dict`), as SPEC.md sections 3 and 9
//! describe them.

use super::error::{ConfigError, ErrorKind, Result};
use super::translate::MAX_EXPR_NESTING;
use super::value::{python_repr, Dict, Value};

pub const DELETE_KEY: &str = "_delete_";

/// Merges child dict `a` into base `b` (which is a dict, or a list when
/// `allow_list_keys` lets digit keys index it).
pub fn merge_a_into_b(a: Dict, b: Value, allow_list_keys: bool) -> Result<Value> {
    match b {
        Value::Dict(mut base) => {
            for (k, v) in a {
                merge_entry(&mut base, k, v, allow_list_keys)?;
            }
            Ok(Value::Dict(base))
        }
        Value::List(mut items) if allow_list_keys => {
            for (k, v) in a {
                if k.bytes().all(|c| c.is_ascii_digit()) && !k.is_empty() {
                    let i: usize = k.parse().map_err(|_| index_error(&k, &items))?;
                    if i >= items.len() {
                        return Err(index_error(&k, &items));
                    }
                    let Value::Dict(child) = v else {
                        return Err(ConfigError::new(
                            ErrorKind::MergeType,
                            format!(
                                "cannot merge {} into item {i} of a list: only a dict merges into a list item",
                                python_repr(&v)
                            ),
                        )
                        .with_help(format!("replace the whole list instead, e.g. KEY=[...]; the list is {}", python_repr(&Value::List(items.clone())))));
                    };
                    let old = std::mem::replace(&mut items[i], Value::None);
                    items[i] = merge_a_into_b(child, old, true)?;
                } else {
                    return Err(ConfigError::new(
                        ErrorKind::MergeType,
                        format!("key `{k}` cannot index a list; use a list index (0, 1, ...)"),
                    ));
                }
            }
            Ok(Value::List(items))
        }
        other => Err(ConfigError::new(
            ErrorKind::MergeType,
            format!(
                "cannot merge a dict into a value of type {}",
                other.type_name()
            ),
        )),
    }
}

fn index_error(k: &str, items: &[Value]) -> ConfigError {
    ConfigError::new(
        ErrorKind::CfgOption,
        format!(
            "Index {k} exceeds the length of list {}",
            python_repr(&Value::List(items.to_vec()))
        ),
    )
}

/// Merges child value `v` of key `k` into `base` (one step of `_merge_a_into_b`).
pub fn merge_entry(base: &mut Dict, k: String, v: Value, allow_list_keys: bool) -> Result<()> {
    let Value::Dict(mut child) = v else {
        base.insert(k, v);
        return Ok(());
    };
    let Some(existing) = base.get_mut(&k) else {
        // A new key lands verbatim, `_delete_` and all (SPEC §3).
        base.insert(k, Value::Dict(child));
        return Ok(());
    };
    let delete = child.shift_remove(DELETE_KEY).is_some_and(|d| d.truthy());
    if delete {
        *existing = Value::Dict(child);
        return Ok(());
    }
    let mergeable = matches!(existing, Value::Dict(_))
        || (allow_list_keys && matches!(existing, Value::List(_)));
    if !mergeable {
        return Err(ConfigError::new(
            ErrorKind::MergeType,
            format!(
                "`{k}` is a dict in the child config but a {} in its base ({}), so it cannot inherit from it",
                existing.type_name(),
                python_repr(existing)
            ),
        )
        .with_help(format!("add `_delete_=True` to the child's `{k}` dict to replace the base value instead")));
    }
    let old = std::mem::replace(existing, Value::None);
    *existing = merge_a_into_b(child, old, allow_list_keys)?;
    Ok(())
}

/// Parses `--cfg-options` items (`KEY=VALUE`) into the nested dict that
/// `Config.merge_from_dict` merges, later duplicates winning.
pub fn parse_cfg_options(items: &[String]) -> Result<Dict> {
    let mut flat: Dict = Dict::new();
    for item in items {
        let Some((key, value)) = item.split_once('=') else {
            return Err(ConfigError::new(
                ErrorKind::CfgOption,
                format!("--cfg-options item `{}` is not KEY=VALUE", shown(item)),
            )
            .with_help("write e.g. --cfg-options train_dataloader.batch_size=4"));
        };
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(ConfigError::new(
                ErrorKind::CfgOption,
                format!("--cfg-options key `{}` is not a dotted name", shown(key)),
            ));
        }
        check_key_depth(key)?;
        flat.shift_remove(key);
        let value = parse_option_value(value)?;
        match flat.get_mut(key) {
            Some(slot) => *slot = value,
            None => {
                flat.insert(key.to_string(), value);
            }
        }
    }
    let mut nested = Dict::new();
    for (key, value) in flat {
        let parts: Vec<&str> = key.split('.').collect();
        insert_path(&mut nested, &parts, value, &key)?;
    }
    Ok(nested)
}

/// An option's text as an error shows it: its first characters.
fn shown(text: &str) -> String {
    const SHOWN_CHARS: usize = 60;
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

/// Refuses a key of more levels than a config may nest
/// ([`MAX_EXPR_NESTING`]): each level becomes a dict in a dict, and a
/// config written that deep is one Python cannot read back.
fn check_key_depth(key: &str) -> Result<()> {
    let levels = key.split('.').count();
    if levels <= MAX_EXPR_NESTING {
        return Ok(());
    }
    Err(ConfigError::new(
        ErrorKind::CfgOption,
        format!(
            "limit exceeded: --cfg-options key `{}` is {levels} levels deep, more than the \
             limit of {MAX_EXPR_NESTING} levels (the bound on nesting in a config)",
            shown(key)
        ),
    )
    .with_help("a real key names a few levels, e.g. model.decode_head.num_classes"))
}

fn insert_path(d: &mut Dict, parts: &[&str], value: Value, full_key: &str) -> Result<()> {
    let (first, rest) = parts.split_first().expect("keys are non-empty");
    if rest.is_empty() {
        d.insert(first.to_string(), value);
        return Ok(());
    }
    match d.entry(first.to_string()).or_insert_with(|| Value::Dict(Dict::new())) {
        Value::Dict(inner) => insert_path(inner, rest, value, full_key),
        other => Err(ConfigError::new(
            ErrorKind::CfgOption,
            format!("--cfg-options `{full_key}` goes inside `{first}`, which an earlier option set to {}", python_repr(other)),
        )),
    }
}

/// Applies parsed `--cfg-options` to a resolved config.
pub fn apply_cfg_options(cfg: Dict, options: Dict) -> Result<Dict> {
    match merge_a_into_b(options, Value::Dict(cfg), true)? {
        Value::Dict(d) => Ok(d),
        _ => unreachable!("merging into a dict gives a dict"),
    }
}

/// `DictAction._parse_iterable`: the value of one `KEY=VALUE`.
pub fn parse_option_value(raw: &str) -> Result<Value> {
    let balanced =
        |open: char, close: char| raw.matches(open).count() == raw.matches(close).count();
    if !balanced('(', ')') || !balanced('[', ']') {
        return Err(ConfigError::new(
            ErrorKind::CfgOption,
            format!("imbalanced brackets in --cfg-options value `{raw}`"),
        ));
    }
    parse_iterable(raw, 0).ok_or_else(|| {
        ConfigError::new(
            ErrorKind::CfgOption,
            format!("--cfg-options value `{raw}` cannot be parsed (a comma list runs into brackets); quote it differently"),
        )
    })
}

/// `None` where MMEngine recurses without end (a value like `[1,2]x`).
fn parse_iterable(raw: &str, depth: usize) -> Option<Value> {
    if depth > 64 {
        return None;
    }
    let stripped: String = raw
        .trim_matches(|c| c == '\'' || c == '"')
        .chars()
        .filter(|c| *c != ' ')
        .collect();
    let val = stripped.as_str();
    let (is_tuple, inner) = if val.starts_with('(') && val.ends_with(')') && val.len() >= 2 {
        (true, &val[1..val.len() - 1])
    } else if val.starts_with('[') && val.ends_with(']') && val.len() >= 2 {
        (false, &val[1..val.len() - 1])
    } else if !val.contains(',') {
        return Some(parse_scalar(val));
    } else {
        (false, val)
    };
    let mut items = Vec::new();
    let mut rest = inner;
    while !rest.is_empty() {
        let end = find_next_comma(rest);
        items.push(parse_iterable(&rest[..end], depth + 1)?);
        rest = rest.get(end + 1..).unwrap_or("");
    }
    Some(if is_tuple {
        Value::Tuple(items)
    } else {
        Value::List(items)
    })
}

/// Index of the first comma whose prefix has balanced `()` and `[]` (or the length).
fn find_next_comma(s: &str) -> usize {
    let (mut round, mut square) = (0i64, 0i64);
    for (i, c) in s.char_indices() {
        match c {
            '(' => round += 1,
            ')' => round -= 1,
            '[' => square += 1,
            ']' => square -= 1,
            ',' if round == 0 && square == 0 => return i,
            _ => {}
        }
    }
    s.len()
}

/// `DictAction._parse_int_float_bool`.
fn parse_scalar(val: &str) -> Value {
    if let Some(i) = parse_python_int(val) {
        return Value::Int(i);
    }
    if let Some(f) = parse_python_float(val) {
        return Value::Float(f);
    }
    match val.to_ascii_lowercase().as_str() {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ if val == "None" => Value::None,
        _ => Value::Str(val.to_string()),
    }
}

/// Python's `int(str)`: optional sign, digits with single `_` between.
fn parse_python_int(s: &str) -> Option<i64> {
    let t = s.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
    {
        return None;
    }
    if !digits.bytes().all(|c| c.is_ascii_digit() || c == b'_') {
        return None;
    }
    t.replace('_', "").parse().ok()
}

/// Python's `float(str)`, including `inf`, `nan` and `1e-3`.
fn parse_python_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let unsigned = lower.trim_start_matches(['+', '-']);
    if matches!(unsigned, "inf" | "infinity" | "nan") {
        return lower.parse::<f64>().ok().or(Some(if unsigned == "nan" {
            f64::NAN
        } else if lower.starts_with('-') {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        }));
    }
    let ok_chars = unsigned
        .bytes()
        .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'+' | b'-' | b'_'));
    if !ok_chars || !unsigned.bytes().any(|c| c.is_ascii_digit()) {
        return None;
    }
    t.replace('_', "").parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Value::{Int as I, Str as S};

    fn d(pairs: &[(&str, Value)]) -> Dict {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    fn parse_option_value_ok(raw: &str) -> Value {
        parse_option_value(raw).unwrap()
    }

    #[test]
    fn option_values_follow_dict_action() {
        assert!(parse_option_value("[1,2]x").is_err());
        assert_eq!(parse_option_value_ok("1"), I(1));
        assert_eq!(parse_option_value_ok("1e-3"), Value::Float(1e-3));
        assert_eq!(parse_option_value_ok("True"), Value::Bool(true));
        assert_eq!(parse_option_value_ok("None"), Value::None);
        assert_eq!(parse_option_value_ok("none"), S("none".into()));
        assert_eq!(parse_option_value_ok("\"1\""), I(1));
        assert_eq!(parse_option_value_ok("hello world"), S("helloworld".into()));
        assert_eq!(parse_option_value_ok("1,2"), Value::List(vec![I(1), I(2)]));
        assert_eq!(parse_option_value_ok("1,"), Value::List(vec![I(1)]));
        assert_eq!(parse_option_value_ok("()"), Value::Tuple(vec![]));
        assert_eq!(parse_option_value_ok("[]"), Value::List(vec![]));
        assert_eq!(
            parse_option_value_ok("[(1,2),[3,4],5]"),
            Value::List(vec![
                Value::Tuple(vec![I(1), I(2)]),
                Value::List(vec![I(3), I(4)]),
                I(5)
            ])
        );
    }

    #[test]
    fn first_equals_splits_and_later_duplicates_win() {
        let o = parse_cfg_options(&["q=a=b".into(), "x=1".into(), "x=2".into()]).unwrap();
        assert_eq!(o.get("q"), Some(&S("a=b".into())));
        assert_eq!(o.get("x"), Some(&I(2)));
    }

    #[test]
    fn delete_is_popped_only_over_an_existing_key() {
        let base = d(&[("a", Value::Dict(d(&[("x", I(1))])))]);
        let child = d(&[
            (
                "a",
                Value::Dict(d(&[("_delete_", Value::Bool(true)), ("y", I(2))])),
            ),
            ("b", Value::Dict(d(&[("_delete_", Value::Bool(true))]))),
        ]);
        let out = merge_a_into_b(child, Value::Dict(base), false).unwrap();
        assert_eq!(out.get_path("a").unwrap(), &Value::Dict(d(&[("y", I(2))])));
        assert_eq!(out.get_path("b._delete_"), Some(&Value::Bool(true)));
    }

    #[test]
    fn dict_over_list_is_a_type_error_naming_the_key() {
        let base = d(&[("pipeline", Value::List(vec![I(1)]))]);
        let child = d(&[("pipeline", Value::Dict(d(&[("p", I(0))])))]);
        let err = merge_a_into_b(child, Value::Dict(base), false).unwrap_err();
        assert_eq!(err.kind, ErrorKind::MergeType);
        assert!(err.message.contains("`pipeline`"), "{}", err.message);
    }

    #[test]
    fn list_index_keys_merge_into_items() {
        let cfg = d(&[(
            "pipeline",
            Value::List(vec![
                Value::Dict(d(&[("p", I(1))])),
                Value::Dict(d(&[("p", I(2))])),
            ]),
        )]);
        let opts = parse_cfg_options(&["pipeline.1.p=0.9".into()]).unwrap();
        let out = apply_cfg_options(cfg.clone(), opts).unwrap();
        assert_eq!(
            Value::Dict(out).get_path("pipeline.1.p"),
            Some(&Value::Float(0.9))
        );
        let opts = parse_cfg_options(&["pipeline.5.p=0".into()]).unwrap();
        assert!(apply_cfg_options(cfg, opts).is_err());
    }
}
