//! Reading into a config value the Python way: `v[i]` with negative
//! indices, `v[a:b:c]` with open and negative bounds, and the items
//! `for x in v` visits (a dict's keys, a string's characters).

use super::{PyError, PyResult};
use crate::config::value::{python_repr, Value};

/// The items `for x in v` visits.
pub fn iterate(v: &Value) -> Result<Vec<Value>, PyError> {
    match v {
        Value::List(items) | Value::Tuple(items) => Ok(items.clone()),
        Value::Dict(d) => Ok(d.keys().map(|k| Value::Str(k.clone())).collect()),
        Value::Str(s) => Ok(s.chars().map(|c| Value::Str(c.to_string())).collect()),
        _ => Err(PyError::type_error(format!(
            "'{}' object is not iterable",
            v.type_name()
        ))),
    }
}

fn normalise_index(i: i64, len: usize, what: &str) -> Result<usize, PyError> {
    let idx = if i < 0 { i + len as i64 } else { i };
    if idx < 0 || idx >= len as i64 {
        Err(PyError::new(
            "IndexError",
            format!("{what} index out of range"),
        ))
    } else {
        Ok(idx as usize)
    }
}

/// `v[key]`
pub fn get_item(v: &Value, key: &Value) -> PyResult {
    match (v, key) {
        (Value::Dict(d), Value::Str(k)) => d
            .get(k)
            .cloned()
            .ok_or_else(|| PyError::new("KeyError", python_repr(key))),
        (Value::Dict(_), _) => Err(PyError::new("KeyError", python_repr(key))),
        (Value::List(items), _) | (Value::Tuple(items), _) => {
            let i = key
                .as_i64()
                .filter(|_| !matches!(key, Value::Float(_)))
                .ok_or_else(|| {
                    PyError::type_error(format!(
                        "{} indices must be integers, not {}",
                        v.type_name(),
                        key.type_name()
                    ))
                })?;
            Ok(items[normalise_index(i, items.len(), v.type_name())?].clone())
        }
        (Value::Str(s), Value::Int(i)) => {
            let chars: Vec<char> = s.chars().collect();
            Ok(Value::Str(
                chars[normalise_index(*i, chars.len(), "string")?].to_string(),
            ))
        }
        _ => Err(PyError::type_error(format!(
            "'{}' object is not subscriptable",
            v.type_name()
        ))),
    }
}

/// `v[lower:upper:step]`; `None` bounds are open.
pub fn slice(v: &Value, lower: &Value, upper: &Value, step: &Value) -> PyResult {
    let bound = |b: &Value| -> Result<Option<i64>, PyError> {
        match b {
            Value::None => Ok(None),
            Value::Int(i) => Ok(Some(*i)),
            Value::Bool(x) => Ok(Some(*x as i64)),
            _ => Err(PyError::type_error(
                "slice indices must be integers or None",
            )),
        }
    };
    let step = bound(step)?.unwrap_or(1);
    if step == 0 {
        return Err(PyError::value_error("slice step cannot be zero"));
    }
    let pick = |len: usize| -> Result<Vec<usize>, PyError> {
        let len = len as i64;
        let clamp = |b: Option<i64>, default: i64, lo: i64, hi: i64| {
            b.map_or(default, |x| {
                let x = if x < 0 { x + len } else { x };
                x.clamp(lo, hi)
            })
        };
        let mut out = Vec::new();
        if step > 0 {
            let (mut i, end) = (
                clamp(bound(lower)?, 0, 0, len),
                clamp(bound(upper)?, len, 0, len),
            );
            while i < end {
                out.push(i as usize);
                i += step;
            }
        } else {
            let mut i = clamp(bound(lower)?, len - 1, -1, len - 1);
            let end = clamp(bound(upper)?, -1, -1, len - 1);
            while i > end {
                out.push(i as usize);
                i += step;
            }
        }
        Ok(out)
    };
    match v {
        Value::List(items) => Ok(Value::List(
            pick(items.len())?
                .into_iter()
                .map(|i| items[i].clone())
                .collect(),
        )),
        Value::Tuple(items) => Ok(Value::Tuple(
            pick(items.len())?
                .into_iter()
                .map(|i| items[i].clone())
                .collect(),
        )),
        Value::Str(s) => {
            let chars: Vec<char> = s.chars().collect();
            Ok(Value::Str(
                pick(chars.len())?.into_iter().map(|i| chars[i]).collect(),
            ))
        }
        _ => Err(PyError::type_error(format!(
            "'{}' object is not subscriptable",
            v.type_name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Value::Int as I;

    #[test]
    fn slices() {
        let l = Value::List(vec![I(0), I(1), I(2), I(3)]);
        assert_eq!(
            slice(&l, &I(1), &Value::None, &Value::None).unwrap(),
            Value::List(vec![I(1), I(2), I(3)])
        );
        assert_eq!(
            slice(&l, &Value::None, &Value::None, &I(-1)).unwrap(),
            Value::List(vec![I(3), I(2), I(1), I(0)])
        );
        assert_eq!(
            slice(&l, &I(-2), &Value::None, &Value::None).unwrap(),
            Value::List(vec![I(2), I(3)])
        );
    }
}
