//! The config value model: what a resolved MMSeg config is made of.
//!
//! Python configs hold `None`, bools, ints, floats, strings, lists, tuples and
//! dicts with string keys. [`Value`] keeps every one of those distinct (a tuple
//! is never silently turned into a list, an int never into a float) because
//! MMEngine keeps them distinct end to end. Dicts keep insertion order.

use indexmap::IndexMap;
use std::fmt::Write as _;

/// A dict with string keys in insertion order.
pub type Dict = IndexMap<String, Value>;

/// One config value, with Python's types.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    Dict(Dict),
}

impl Value {
    /// The brackets Python writes a sequence in: `[]` for a list, `()`
    /// for a tuple.
    pub(crate) fn python_brackets(&self) -> (char, char) {
        if matches!(self, Value::List(_)) {
            ('[', ']')
        } else {
            ('(', ')')
        }
    }

    /// Python's name for the value's type, used in error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
        }
    }

    pub fn as_dict(&self) -> Option<&Dict> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    pub fn as_dict_mut(&mut self) -> Option<&mut Dict> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            Value::Bool(b) => Some(*b as i64 as f64),
            _ => None,
        }
    }

    /// The items of a list or tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// Follows a dotted path of dict keys (`model.backbone.type`).
    pub fn get_path(&self, path: &str) -> Option<&Value> {
        path.split('.').try_fold(self, |v, key| match v {
            Value::Dict(d) => d.get(key),
            Value::List(items) | Value::Tuple(items) => {
                key.parse::<usize>().ok().and_then(|i| items.get(i))
            }
            _ => None,
        })
    }

    /// Python truthiness.
    pub fn truthy(&self) -> bool {
        match self {
            Value::None => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::Str(s) => !s.is_empty(),
            Value::List(v) | Value::Tuple(v) => !v.is_empty(),
            Value::Dict(d) => !d.is_empty(),
        }
    }

    /// Equality of values ignoring dict key order, with Python's `1 == 1.0`
    /// *not* applied: an int and a float are different config values.
    pub fn same_as(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Float(a), Value::Float(b)) => a == b || (a.is_nan() && b.is_nan()),
            (Value::List(a), Value::List(b)) | (Value::Tuple(a), Value::Tuple(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_as(y))
            }
            (Value::Dict(a), Value::Dict(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .all(|(k, v)| b.get(k).is_some_and(|w| v.same_as(w)))
            }
            _ => self == other,
        }
    }

    /// The first difference between two values, as a dotted path and both
    /// sides, or `None` when [`Value::same_as`] holds.
    pub fn first_difference(&self, other: &Value, path: &str) -> Option<String> {
        let here = || {
            Some(format!(
                "{}: {} != {}",
                if path.is_empty() { "<root>" } else { path },
                python_repr(self),
                python_repr(other)
            ))
        };
        let join = |k: &str| {
            if path.is_empty() {
                k.to_string()
            } else {
                format!("{path}.{k}")
            }
        };
        match (self, other) {
            (Value::Dict(a), Value::Dict(b)) => {
                for (k, v) in a {
                    match b.get(k) {
                        Some(w) => {
                            if let Some(d) = v.first_difference(w, &join(k)) {
                                return Some(d);
                            }
                        }
                        None => return Some(format!("{}: only on the left", join(k))),
                    }
                }
                b.keys()
                    .find(|k| !a.contains_key(*k))
                    .map(|k| format!("{}: only on the right", join(k)))
            }
            (Value::List(a), Value::List(b)) | (Value::Tuple(a), Value::Tuple(b))
                if a.len() == b.len() =>
            {
                a.iter()
                    .zip(b)
                    .enumerate()
                    .find_map(|(i, (x, y))| x.first_difference(y, &join(&i.to_string())))
            }
            _ if self.same_as(other) => None,
            _ => here(),
        }
    }
}

/// Python's `repr(float)`: the shortest digits that round-trip, in fixed
/// notation for exponents in `-4..16` and scientific (`1e-06`) otherwise.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. `1.5e-7`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x < 0.0 { "-" } else { "" };
    let n = digits.len() as i32;
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp + 1;
            if n <= int_len {
                format!("{digits}{}.0", "0".repeat((int_len - n) as usize))
            } else {
                format!(
                    "{}.{}",
                    &digits[..int_len as usize],
                    &digits[int_len as usize..]
                )
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let mant = if n == 1 {
            digits.clone()
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{esign}{:02}", exp.abs())
    };
    format!("{sign}{body}")
}

/// Python's `repr(str)`.
pub fn python_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `repr()` of a value (dicts as `{...}` literals).
pub fn python_repr(v: &Value) -> String {
    let mut out = String::new();
    write_python_repr(v, &mut out);
    out
}

fn write_python_repr(v: &Value, out: &mut String) {
    match v {
        Value::None => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) => out.push_str(&python_float_repr(*f)),
        Value::Str(s) => out.push_str(&python_str_repr(s)),
        Value::List(items) | Value::Tuple(items) => {
            let (open, close) = v.python_brackets();
            out.push(open);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_repr(item, out);
            }
            if matches!(v, Value::Tuple(_)) && items.len() == 1 {
                out.push(',');
            }
            out.push(close);
        }
        Value::Dict(d) => {
            out.push('{');
            for (i, (k, item)) in d.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&python_str_repr(k));
                out.push_str(": ");
                write_python_repr(item, out);
            }
            out.push('}');
        }
    }
}

/// Python's `str()` of a value: strings bare, everything else as `repr`.
pub fn python_str(v: &Value) -> String {
    match v {
        Value::Str(s) => s.clone(),
        other => python_repr(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (6e-05, "6e-05"),
            (1e-06, "1e-06"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.25, "0.25"),
            (-2.5, "-2.5"),
            (1.5e-7, "1.5e-07"),
            (123.456, "123.456"),
            (100.0, "100.0"),
            (1e22, "1e+22"),
        ];
        for (x, want) in cases {
            assert_eq!(python_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn str_repr_matches_python() {
        assert_eq!(python_str_repr("abc"), "'abc'");
        assert_eq!(python_str_repr("it's"), "\"it's\"");
        assert_eq!(python_str_repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(python_str_repr("x\\y\n"), "'x\\\\y\\n'");
    }

    #[test]
    fn repr_of_one_tuple_keeps_comma() {
        assert_eq!(python_repr(&Value::Tuple(vec![Value::Int(1)])), "(1,)");
    }
}
