//! Python's semantics for the operators and builtins a config may use, on
//! [`Value`]s: `/` is true division, `//` and `%` floor towards minus
//! infinity, `**` of ints stays an int, `[1.0] * n + [0.1]` concatenates,
//! `int(2.7)` truncates, and so on. The Rhai evaluator calls these for every
//! operator of a translated Python config, so Rhai's own (C-like) arithmetic
//! never decides a config value.

use super::value::{python_float_repr, python_repr, python_str, Dict, Value};

/// Largest list, tuple or string a config may build (items or bytes).
pub const MAX_SEQUENCE_LEN: usize = 1 << 20;

/// A Python exception raised while evaluating a config.
#[derive(Debug, Clone, PartialEq)]
pub struct PyError {
    /// The Python exception class (`TypeError`, ...), or `LimitExceeded`.
    pub class: &'static str,
    pub message: String,
}

impl PyError {
    pub fn new(class: &'static str, message: impl Into<String>) -> PyError {
        PyError {
            class,
            message: message.into(),
        }
    }
    fn type_error(message: impl Into<String>) -> PyError {
        PyError::new("TypeError", message)
    }
    fn value_error(message: impl Into<String>) -> PyError {
        PyError::new("ValueError", message)
    }
    fn zero_division(message: &str) -> PyError {
        PyError::new("ZeroDivisionError", message)
    }
    pub fn limit(message: impl Into<String>) -> PyError {
        PyError::new("LimitExceeded", message)
    }
    pub fn is_limit(&self) -> bool {
        self.class == "LimitExceeded"
    }
}

impl std::fmt::Display for PyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_limit() {
            write!(f, "limit exceeded: {}", self.message)
        } else {
            write!(f, "{}: {}", self.class, self.message)
        }
    }
}

pub type PyResult = Result<Value, PyError>;

/// A binary operator of Python's grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    TrueDiv,
    FloorDiv,
    Mod,
    Pow,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::TrueDiv => "/",
            BinOp::FloorDiv => "//",
            BinOp::Mod => "%",
            BinOp::Pow => "**",
        }
    }
}

enum Num {
    Int(i64),
    Float(f64),
}

fn num(v: &Value) -> Option<Num> {
    match v {
        Value::Bool(b) => Some(Num::Int(*b as i64)),
        Value::Int(i) => Some(Num::Int(*i)),
        Value::Float(f) => Some(Num::Float(*f)),
        _ => None,
    }
}

fn overflow(op: BinOp) -> PyError {
    PyError::limit(format!(
        "integer result of `{}` does not fit in 64 bits",
        op.symbol()
    ))
}

fn check_len(len: usize) -> Result<(), PyError> {
    if len > MAX_SEQUENCE_LEN {
        Err(PyError::limit(format!(
            "a sequence of {len} items is larger than the limit of {MAX_SEQUENCE_LEN}"
        )))
    } else {
        Ok(())
    }
}

fn floor_div_f(a: f64, b: f64) -> f64 {
    (a / b).floor()
}

fn py_mod_f(a: f64, b: f64) -> f64 {
    let r = a % b;
    if r != 0.0 && ((r < 0.0) != (b < 0.0)) {
        r + b
    } else {
        r
    }
}

fn repeat(items: &[Value], n: i64) -> Result<Vec<Value>, PyError> {
    let n = n.max(0) as usize;
    check_len(items.len().saturating_mul(n))?;
    Ok(items
        .iter()
        .cloned()
        .cycle()
        .take(items.len() * n)
        .collect())
}

/// `a <op> b` with Python's rules.
pub fn binary(op: BinOp, a: &Value, b: &Value) -> PyResult {
    if let (Some(x), Some(y)) = (num(a), num(b)) {
        return numeric(op, x, y);
    }
    match (op, a, b) {
        (BinOp::Add, Value::Str(x), Value::Str(y)) => {
            check_len(x.len() + y.len())?;
            Ok(Value::Str(format!("{x}{y}")))
        }
        (BinOp::Add, Value::List(x), Value::List(y)) => {
            check_len(x.len() + y.len())?;
            Ok(Value::List(x.iter().chain(y).cloned().collect()))
        }
        (BinOp::Add, Value::Tuple(x), Value::Tuple(y)) => {
            check_len(x.len() + y.len())?;
            Ok(Value::Tuple(x.iter().chain(y).cloned().collect()))
        }
        (BinOp::Mul, Value::List(x), n) | (BinOp::Mul, n, Value::List(x))
            if matches!(n, Value::Int(_) | Value::Bool(_)) =>
        {
            Ok(Value::List(repeat(x, n.as_i64().unwrap_or(0))?))
        }
        (BinOp::Mul, Value::Tuple(x), n) | (BinOp::Mul, n, Value::Tuple(x))
            if matches!(n, Value::Int(_) | Value::Bool(_)) =>
        {
            Ok(Value::Tuple(repeat(x, n.as_i64().unwrap_or(0))?))
        }
        (BinOp::Mul, Value::Str(s), n) | (BinOp::Mul, n, Value::Str(s))
            if matches!(n, Value::Int(_) | Value::Bool(_)) =>
        {
            let n = n.as_i64().unwrap_or(0).max(0) as usize;
            check_len(s.len().saturating_mul(n))?;
            Ok(Value::Str(s.repeat(n)))
        }
        (BinOp::Mod, Value::Str(_), _) => Err(PyError::type_error(
            "printf-style string formatting (`'...' % x`) is not supported; use an f-string",
        )),
        _ => Err(PyError::type_error(format!(
            "unsupported operand type(s) for {}: '{}' and '{}'",
            op.symbol(),
            a.type_name(),
            b.type_name()
        ))),
    }
}

fn numeric(op: BinOp, a: Num, b: Num) -> PyResult {
    use Num::{Float as F, Int as I};
    let as_f = |n: &Num| match n {
        I(i) => *i as f64,
        F(f) => *f,
    };
    match (op, &a, &b) {
        (BinOp::Add, I(x), I(y)) => x.checked_add(*y).map(Value::Int).ok_or(overflow(op)),
        (BinOp::Sub, I(x), I(y)) => x.checked_sub(*y).map(Value::Int).ok_or(overflow(op)),
        (BinOp::Mul, I(x), I(y)) => x.checked_mul(*y).map(Value::Int).ok_or(overflow(op)),
        (BinOp::FloorDiv, I(_), I(0)) => {
            Err(PyError::zero_division("integer division or modulo by zero"))
        }
        (BinOp::Mod, I(_), I(0)) => Err(PyError::zero_division("integer modulo by zero")),
        (BinOp::FloorDiv, I(x), I(y)) => {
            let q = x.checked_div(*y).ok_or(overflow(op))?;
            // Truncation rounds towards zero; Python floors.
            let floor = if x % y != 0 && ((*x < 0) != (*y < 0)) {
                q - 1
            } else {
                q
            };
            Ok(Value::Int(floor))
        }
        (BinOp::Mod, I(x), I(y)) => {
            let r = x.checked_rem(*y).ok_or(overflow(op))?;
            Ok(Value::Int(if r != 0 && ((r < 0) != (*y < 0)) {
                r + y
            } else {
                r
            }))
        }
        (BinOp::Pow, I(x), I(y)) if *y >= 0 => {
            let exp = u32::try_from(*y).map_err(|_| overflow(op))?;
            x.checked_pow(exp).map(Value::Int).ok_or(overflow(op))
        }
        (BinOp::Pow, I(0), I(_)) => Err(PyError::zero_division(
            "0.0 cannot be raised to a negative power",
        )),
        _ => {
            let (x, y) = (as_f(&a), as_f(&b));
            let zero = || PyError::zero_division("float division by zero");
            match op {
                BinOp::Add => Ok(Value::Float(x + y)),
                BinOp::Sub => Ok(Value::Float(x - y)),
                BinOp::Mul => Ok(Value::Float(x * y)),
                BinOp::TrueDiv if y == 0.0 => Err(PyError::zero_division("division by zero")),
                BinOp::TrueDiv => Ok(Value::Float(x / y)),
                BinOp::FloorDiv if y == 0.0 => Err(zero()),
                BinOp::FloorDiv => Ok(Value::Float(floor_div_f(x, y))),
                BinOp::Mod if y == 0.0 => Err(PyError::zero_division("float modulo")),
                BinOp::Mod => Ok(Value::Float(py_mod_f(x, y))),
                BinOp::Pow if x == 0.0 && y < 0.0 => Err(PyError::zero_division(
                    "0.0 cannot be raised to a negative power",
                )),
                BinOp::Pow => {
                    let r = x.powf(y);
                    if r.is_nan() && !x.is_nan() && !y.is_nan() {
                        Err(PyError::value_error(
                            "a negative number raised to a fractional power is complex",
                        ))
                    } else {
                        Ok(Value::Float(r))
                    }
                }
            }
        }
    }
}

/// `-v`
pub fn negate(v: &Value) -> PyResult {
    match num(v) {
        Some(Num::Int(i)) => i
            .checked_neg()
            .map(Value::Int)
            .ok_or_else(|| PyError::limit("integer negation overflows 64 bits")),
        Some(Num::Float(f)) => Ok(Value::Float(-f)),
        None => Err(PyError::type_error(format!(
            "bad operand type for unary -: '{}'",
            v.type_name()
        ))),
    }
}

/// `+v`
pub fn positive(v: &Value) -> PyResult {
    match num(v) {
        Some(Num::Int(i)) => Ok(Value::Int(i)),
        Some(Num::Float(f)) => Ok(Value::Float(f)),
        None => Err(PyError::type_error(format!(
            "bad operand type for unary +: '{}'",
            v.type_name()
        ))),
    }
}

/// `~v`
pub fn invert(v: &Value) -> PyResult {
    match v {
        Value::Int(i) => Ok(Value::Int(!i)),
        Value::Bool(b) => Ok(Value::Int(!(*b as i64))),
        _ => Err(PyError::type_error(format!(
            "bad operand type for unary ~: '{}'",
            v.type_name()
        ))),
    }
}

/// Python `==` (with `1 == 1.0 == True`).
pub fn equal(a: &Value, b: &Value) -> bool {
    match (num(a), num(b)) {
        (Some(Num::Int(x)), Some(Num::Int(y))) => x == y,
        (Some(x), Some(y)) => {
            let f = |n: Num| match n {
                Num::Int(i) => i as f64,
                Num::Float(f) => f,
            };
            f(x) == f(y)
        }
        _ => match (a, b) {
            (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(p, q)| equal(p, q))
            }
            (Value::Dict(x), Value::Dict(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| equal(v, w)))
            }
            _ => a == b,
        },
    }
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    NotEq,
    Lt,
    LtE,
    Gt,
    GtE,
    In,
    NotIn,
    Is,
    IsNot,
}

fn order(a: &Value, b: &Value, symbol: &str) -> Result<std::cmp::Ordering, PyError> {
    use std::cmp::Ordering;
    let err = || {
        PyError::type_error(format!(
            "'{symbol}' not supported between instances of '{}' and '{}'",
            a.type_name(),
            b.type_name()
        ))
    };
    match (num(a), num(b)) {
        (Some(Num::Int(x)), Some(Num::Int(y))) => Ok(x.cmp(&y)),
        (Some(x), Some(y)) => {
            let f = |n: Num| match n {
                Num::Int(i) => i as f64,
                Num::Float(f) => f,
            };
            f(x).partial_cmp(&f(y)).ok_or_else(err)
        }
        _ => match (a, b) {
            (Value::Str(x), Value::Str(y)) => Ok(x.cmp(y)),
            (Value::List(x), Value::List(y)) | (Value::Tuple(x), Value::Tuple(y)) => {
                for (p, q) in x.iter().zip(y) {
                    if !equal(p, q) {
                        return order(p, q, symbol);
                    }
                }
                Ok(x.len().cmp(&y.len()))
            }
            _ => Err(err()).map(|o: Ordering| o),
        },
    }
}

/// `a <op> b` for comparisons and membership.
pub fn compare(op: CmpOp, a: &Value, b: &Value) -> Result<bool, PyError> {
    use std::cmp::Ordering::*;
    Ok(match op {
        CmpOp::Eq => equal(a, b),
        CmpOp::NotEq => !equal(a, b),
        CmpOp::Lt => order(a, b, "<")? == Less,
        CmpOp::LtE => order(a, b, "<=")? != Greater,
        CmpOp::Gt => order(a, b, ">")? == Greater,
        CmpOp::GtE => order(a, b, ">=")? != Less,
        CmpOp::In => contains(b, a)?,
        CmpOp::NotIn => !contains(b, a)?,
        // Only `x is None` is meaningful for config values.
        CmpOp::Is => a == b && matches!(a, Value::None | Value::Bool(_)),
        CmpOp::IsNot => !(a == b && matches!(a, Value::None | Value::Bool(_))),
    })
}

fn contains(container: &Value, item: &Value) -> Result<bool, PyError> {
    match container {
        Value::List(v) | Value::Tuple(v) => Ok(v.iter().any(|x| equal(x, item))),
        Value::Dict(d) => Ok(item.as_str().is_some_and(|k| d.contains_key(k))),
        Value::Str(s) => match item {
            Value::Str(sub) => Ok(s.contains(sub.as_str())),
            _ => Err(PyError::type_error(format!(
                "'in <string>' requires string as left operand, not {}",
                item.type_name()
            ))),
        },
        _ => Err(PyError::type_error(format!(
            "argument of type '{}' is not iterable",
            container.type_name()
        ))),
    }
}

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

/// The builtin functions a config may call, by Python name.
pub const BUILTINS: &[&str] = &[
    "len",
    "sum",
    "range",
    "enumerate",
    "int",
    "float",
    "str",
    "bool",
    "list",
    "tuple",
    "min",
    "max",
    "abs",
    "round",
    "zip",
    "sorted",
    "reversed",
];

/// Calls builtin `name` with positional arguments.
pub fn call_builtin(name: &str, args: &[Value]) -> PyResult {
    let arity = |lo: usize, hi: usize| -> Result<(), PyError> {
        if args.len() < lo || args.len() > hi {
            Err(PyError::type_error(format!(
                "{name}() takes {} argument(s) ({} given)",
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo} to {hi}")
                },
                args.len()
            )))
        } else {
            Ok(())
        }
    };
    match name {
        "len" => {
            arity(1, 1)?;
            let n = match &args[0] {
                Value::List(v) | Value::Tuple(v) => v.len(),
                Value::Dict(d) => d.len(),
                Value::Str(s) => s.chars().count(),
                other => {
                    return Err(PyError::type_error(format!(
                        "object of type '{}' has no len()",
                        other.type_name()
                    )))
                }
            };
            Ok(Value::Int(n as i64))
        }
        "sum" => {
            arity(1, 2)?;
            let mut acc = args.get(1).cloned().unwrap_or(Value::Int(0));
            if matches!(acc, Value::Str(_)) {
                return Err(PyError::type_error(
                    "sum() can't sum strings [use ''.join(seq) instead]",
                ));
            }
            for item in iterate(&args[0])? {
                acc = binary(BinOp::Add, &acc, &item)?;
            }
            Ok(acc)
        }
        "range" => {
            arity(1, 3)?;
            let ints: Vec<i64> = args
                .iter()
                .map(|a| match a {
                    Value::Int(i) => Ok(*i),
                    Value::Bool(b) => Ok(*b as i64),
                    other => Err(PyError::type_error(format!(
                        "'{}' object cannot be interpreted as an integer",
                        other.type_name()
                    ))),
                })
                .collect::<Result<_, _>>()?;
            let (start, stop, step) = match ints.as_slice() {
                [stop] => (0, *stop, 1),
                [start, stop] => (*start, *stop, 1),
                [start, stop, step] => (*start, *stop, *step),
                _ => unreachable!("arity checked"),
            };
            if step == 0 {
                return Err(PyError::value_error("range() arg 3 must not be zero"));
            }
            let count = if step > 0 {
                (stop - start + step - 1).max(0) / step
            } else {
                (start - stop - step - 1).max(0) / -step
            };
            check_len(count as usize)?;
            Ok(Value::List(
                (0..count).map(|k| Value::Int(start + k * step)).collect(),
            ))
        }
        "enumerate" => {
            arity(1, 2)?;
            let start = args.get(1).and_then(Value::as_i64).unwrap_or(0);
            Ok(Value::List(
                iterate(&args[0])?
                    .into_iter()
                    .enumerate()
                    .map(|(i, x)| Value::Tuple(vec![Value::Int(start + i as i64), x]))
                    .collect(),
            ))
        }
        "zip" => {
            let seqs: Vec<Vec<Value>> = args.iter().map(iterate).collect::<Result<_, _>>()?;
            let n = seqs.iter().map(Vec::len).min().unwrap_or(0);
            Ok(Value::List(
                (0..n)
                    .map(|i| Value::Tuple(seqs.iter().map(|s| s[i].clone()).collect()))
                    .collect(),
            ))
        }
        "int" => {
            arity(0, 1)?;
            match args.first().unwrap_or(&Value::Int(0)) {
                Value::Int(i) => Ok(Value::Int(*i)),
                Value::Bool(b) => Ok(Value::Int(*b as i64)),
                Value::Float(f) if f.is_finite() && f.abs() < 9.2e18 => {
                    Ok(Value::Int(f.trunc() as i64))
                }
                Value::Float(f) => Err(PyError::value_error(format!(
                    "cannot convert float {} to integer",
                    python_float_repr(*f)
                ))),
                Value::Str(s) => s
                    .trim()
                    .replace('_', "")
                    .parse::<i64>()
                    .map(Value::Int)
                    .map_err(|_| {
                        PyError::value_error(format!(
                            "invalid literal for int() with base 10: {}",
                            python_repr(&args[0])
                        ))
                    }),
                other => Err(PyError::type_error(format!(
                    "int() argument must be a string or a number, not '{}'",
                    other.type_name()
                ))),
            }
        }
        "float" => {
            arity(0, 1)?;
            match args.first().unwrap_or(&Value::Float(0.0)) {
                Value::Str(s) => {
                    let t = s.trim().to_ascii_lowercase();
                    let parsed = match t.as_str() {
                        "inf" | "+inf" | "infinity" | "+infinity" => Some(f64::INFINITY),
                        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
                        "nan" | "+nan" | "-nan" => Some(f64::NAN),
                        _ => t.replace('_', "").parse::<f64>().ok(),
                    };
                    parsed.map(Value::Float).ok_or_else(|| {
                        PyError::value_error(format!(
                            "could not convert string to float: {}",
                            python_repr(&args[0])
                        ))
                    })
                }
                other => other.as_f64().map(Value::Float).ok_or_else(|| {
                    PyError::type_error(format!(
                        "float() argument must be a string or a real number, not '{}'",
                        other.type_name()
                    ))
                }),
            }
        }
        "str" => {
            arity(0, 1)?;
            Ok(Value::Str(args.first().map(python_str).unwrap_or_default()))
        }
        "bool" => {
            arity(0, 1)?;
            Ok(Value::Bool(args.first().is_some_and(Value::truthy)))
        }
        "list" => {
            arity(0, 1)?;
            Ok(Value::List(
                args.first().map(iterate).transpose()?.unwrap_or_default(),
            ))
        }
        "tuple" => {
            arity(0, 1)?;
            Ok(Value::Tuple(
                args.first().map(iterate).transpose()?.unwrap_or_default(),
            ))
        }
        "sorted" => {
            arity(1, 1)?;
            let mut items = iterate(&args[0])?;
            let mut failure = None;
            items.sort_by(|a, b| {
                order(a, b, "<").unwrap_or_else(|e| {
                    failure.get_or_insert(e);
                    std::cmp::Ordering::Equal
                })
            });
            failure.map_or(Ok(Value::List(items)), Err)
        }
        "reversed" => {
            arity(1, 1)?;
            let mut items = iterate(&args[0])?;
            items.reverse();
            Ok(Value::List(items))
        }
        "min" | "max" => {
            if args.is_empty() {
                return Err(PyError::type_error(format!(
                    "{name} expected at least 1 argument, got 0"
                )));
            }
            let items = if args.len() == 1 {
                iterate(&args[0])?
            } else {
                args.to_vec()
            };
            let mut best: Option<Value> = None;
            for item in items {
                best = Some(match best {
                    None => item,
                    Some(b) => {
                        let better = if name == "min" {
                            compare(CmpOp::Lt, &item, &b)?
                        } else {
                            compare(CmpOp::Gt, &item, &b)?
                        };
                        if better {
                            item
                        } else {
                            b
                        }
                    }
                });
            }
            best.ok_or_else(|| PyError::value_error(format!("{name}() arg is an empty sequence")))
        }
        "abs" => {
            arity(1, 1)?;
            match num(&args[0]) {
                Some(Num::Int(i)) => i
                    .checked_abs()
                    .map(Value::Int)
                    .ok_or_else(|| PyError::limit("abs overflows 64 bits")),
                Some(Num::Float(f)) => Ok(Value::Float(f.abs())),
                None => Err(PyError::type_error(format!(
                    "bad operand type for abs(): '{}'",
                    args[0].type_name()
                ))),
            }
        }
        "round" => {
            arity(1, 2)?;
            let digits = args.get(1).filter(|d| !matches!(d, Value::None));
            match (num(&args[0]), digits) {
                (Some(Num::Int(i)), None) => Ok(Value::Int(i)),
                (Some(Num::Float(f)), None) => {
                    // Python rounds half to even.
                    let r = f.round();
                    let r = if (f - f.trunc()).abs() == 0.5 {
                        2.0 * (f / 2.0).round()
                    } else {
                        r
                    };
                    Ok(Value::Int(r as i64))
                }
                (Some(n), Some(d)) => {
                    let d = d
                        .as_i64()
                        .ok_or_else(|| PyError::type_error("round() digits must be an integer"))?;
                    let x = match n {
                        Num::Int(i) => return Ok(Value::Int(i)),
                        Num::Float(f) => f,
                    };
                    let text = format!("{:.*}", d.clamp(0, 17) as usize, x);
                    Ok(Value::Float(text.parse().unwrap_or(x)))
                }
                (None, _) => Err(PyError::type_error(format!(
                    "type {} doesn't define __round__ method",
                    args[0].type_name()
                ))),
            }
        }
        _ => Err(PyError::new(
            "NameError",
            format!("name '{name}' is not defined"),
        )),
    }
}

/// `dict(positional, **keywords)`.
pub fn make_dict(positional: &[Value], keywords: Dict) -> PyResult {
    if positional.len() > 1 {
        return Err(PyError::type_error(format!(
            "dict expected at most 1 argument, got {}",
            positional.len()
        )));
    }
    let mut out = Dict::new();
    if let Some(first) = positional.first() {
        match first {
            Value::Dict(d) => out.extend(d.iter().map(|(k, v)| (k.clone(), v.clone()))),
            other => {
                for pair in iterate(other)? {
                    match pair.as_seq() {
                        Some([Value::Str(k), v]) => {
                            out.insert(k.clone(), v.clone());
                        }
                        Some([k, _]) => {
                            return Err(PyError::type_error(format!(
                                "config dict keys must be strings, not {}",
                                k.type_name()
                            )))
                        }
                        _ => {
                            return Err(PyError::value_error(
                                "dictionary update sequence element has the wrong length; 2 is required",
                            ))
                        }
                    }
                }
            }
        }
    }
    out.extend(keywords);
    Ok(Value::Dict(out))
}

/// Formats `v` by a format spec (`f'{x:.2f}'`, `f'{i:03d}'`).
pub fn format_value(v: &Value, spec: &str) -> Result<String, PyError> {
    if spec.is_empty() {
        return Ok(python_str(v));
    }
    let unsupported =
        || PyError::value_error(format!("format spec '{spec}' is not supported by segtune"));
    let re_spec = parse_spec(spec).ok_or_else(unsupported)?;
    let body = match (re_spec.kind, v) {
        (None | Some('s'), Value::Str(s)) => s.clone(),
        (None | Some('d'), Value::Int(i)) => i.abs().to_string(),
        (None, Value::Float(f)) if re_spec.precision.is_none() => python_float_repr(f.abs()),
        (Some('f' | 'F') | None, n) if n.as_f64().is_some() => {
            format!(
                "{:.*}",
                re_spec.precision.unwrap_or(6),
                n.as_f64().unwrap_or(0.0).abs()
            )
        }
        (Some('e'), n) if n.as_f64().is_some() => {
            let s = format!(
                "{:.*e}",
                re_spec.precision.unwrap_or(6),
                n.as_f64().unwrap_or(0.0).abs()
            );
            let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
            let e: i32 = e.parse().unwrap_or(0);
            format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
        }
        (Some('%'), n) if n.as_f64().is_some() => {
            format!(
                "{:.*}%",
                re_spec.precision.unwrap_or(6),
                n.as_f64().unwrap_or(0.0).abs() * 100.0
            )
        }
        _ => return Err(unsupported()),
    };
    let negative = v.as_f64().is_some_and(|x| x < 0.0) && !matches!(v, Value::Str(_));
    let sign = if negative {
        "-"
    } else if re_spec.sign == Some('+') && v.as_f64().is_some() {
        "+"
    } else {
        ""
    };
    let len = sign.len() + body.chars().count();
    let pad = re_spec.width.saturating_sub(len);
    Ok(if re_spec.zero_pad {
        format!("{sign}{}{body}", "0".repeat(pad))
    } else {
        let text = format!("{sign}{body}");
        let fill = re_spec.fill.to_string();
        let default_right = !matches!(v, Value::Str(_));
        match re_spec
            .align
            .unwrap_or(if default_right { '>' } else { '<' })
        {
            '<' => format!("{text}{}", fill.repeat(pad)),
            '^' => format!(
                "{}{text}{}",
                fill.repeat(pad / 2),
                fill.repeat(pad - pad / 2)
            ),
            _ => format!("{}{text}", fill.repeat(pad)),
        }
    })
}

struct FormatSpec {
    fill: char,
    align: Option<char>,
    sign: Option<char>,
    zero_pad: bool,
    width: usize,
    precision: Option<usize>,
    kind: Option<char>,
}

fn parse_spec(spec: &str) -> Option<FormatSpec> {
    let chars: Vec<char> = spec.chars().collect();
    let mut i = 0;
    let mut out = FormatSpec {
        fill: ' ',
        align: None,
        sign: None,
        zero_pad: false,
        width: 0,
        precision: None,
        kind: None,
    };
    if chars.len() >= 2 && matches!(chars[1], '<' | '>' | '^') {
        out.fill = chars[0];
        out.align = Some(chars[1]);
        i = 2;
    } else if chars.first().is_some_and(|c| matches!(c, '<' | '>' | '^')) {
        out.align = Some(chars[0]);
        i = 1;
    }
    if chars.get(i).is_some_and(|c| matches!(c, '+' | '-' | ' ')) {
        out.sign = Some(chars[i]);
        i += 1;
    }
    if chars.get(i) == Some(&'0') {
        out.zero_pad = true;
        i += 1;
    }
    let start = i;
    while chars.get(i).is_some_and(char::is_ascii_digit) {
        i += 1;
    }
    if i > start {
        out.width = chars[start..i].iter().collect::<String>().parse().ok()?;
    }
    if chars.get(i) == Some(&'.') {
        i += 1;
        let start = i;
        while chars.get(i).is_some_and(char::is_ascii_digit) {
            i += 1;
        }
        out.precision = Some(chars[start..i].iter().collect::<String>().parse().ok()?);
    }
    if let Some(c) = chars.get(i) {
        if !matches!(c, 'd' | 'f' | 'F' | 'e' | 's' | '%') {
            return None;
        }
        out.kind = Some(*c);
        i += 1;
    }
    (i == chars.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Value::{Float as F, Int as I};

    #[test]
    fn division_follows_python() {
        assert_eq!(binary(BinOp::TrueDiv, &I(1), &F(4.0)).unwrap(), F(0.25));
        assert_eq!(binary(BinOp::TrueDiv, &I(1), &I(4)).unwrap(), F(0.25));
        assert_eq!(binary(BinOp::FloorDiv, &I(-7), &I(2)).unwrap(), I(-4));
        assert_eq!(binary(BinOp::FloorDiv, &I(7), &I(-2)).unwrap(), I(-4));
        assert_eq!(binary(BinOp::Mod, &I(-7), &I(2)).unwrap(), I(1));
        assert_eq!(binary(BinOp::Mod, &I(7), &I(-2)).unwrap(), I(-1));
        assert_eq!(binary(BinOp::Mod, &F(-7.5), &I(2)).unwrap(), F(0.5));
        assert_eq!(binary(BinOp::Pow, &I(2), &I(10)).unwrap(), I(1024));
        assert_eq!(binary(BinOp::Pow, &I(2), &I(-1)).unwrap(), F(0.5));
        assert_eq!(
            binary(BinOp::FloorDiv, &I(160000), &I(10)).unwrap(),
            I(16000)
        );
        assert!(binary(BinOp::TrueDiv, &I(1), &I(0)).is_err());
    }

    #[test]
    fn int_of_float_times_int_truncates() {
        // `int(512 * x * 0.1)` from the SAN config.
        let x = binary(BinOp::Mul, &I(512), &I(7)).unwrap();
        let x = binary(BinOp::Mul, &x, &F(0.1)).unwrap();
        assert_eq!(call_builtin("int", &[x]).unwrap(), I(358));
    }

    #[test]
    fn sequences_concatenate_and_repeat() {
        let l = binary(BinOp::Mul, &Value::List(vec![F(1.0)]), &I(3)).unwrap();
        let l = binary(BinOp::Add, &l, &Value::List(vec![F(0.1)])).unwrap();
        assert_eq!(l, Value::List(vec![F(1.0), F(1.0), F(1.0), F(0.1)]));
        assert!(binary(BinOp::Mul, &Value::List(vec![I(0)]), &I(1 << 40))
            .unwrap_err()
            .is_limit());
    }

    #[test]
    fn range_and_enumerate() {
        assert_eq!(
            call_builtin("range", &[I(5), I(8)]).unwrap(),
            Value::List(vec![I(5), I(6), I(7)])
        );
        assert_eq!(
            call_builtin("range", &[I(5), I(0), I(-2)]).unwrap(),
            Value::List(vec![I(5), I(3), I(1)])
        );
        assert_eq!(
            call_builtin("enumerate", &[Value::List(vec![I(9)])]).unwrap(),
            Value::List(vec![Value::Tuple(vec![I(0), I(9)])])
        );
    }

    #[test]
    fn format_specs() {
        assert_eq!(format_value(&I(3), "03d").unwrap(), "003");
        assert_eq!(format_value(&F(0.5), ".2f").unwrap(), "0.50");
        assert_eq!(format_value(&F(1e-6), "").unwrap(), "1e-06");
        assert_eq!(
            format_value(&Value::Str("ab".into()), ">4").unwrap(),
            "  ab"
        );
        assert_eq!(format_value(&F(12345.0), ".2e").unwrap(), "1.23e+04");
    }

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
