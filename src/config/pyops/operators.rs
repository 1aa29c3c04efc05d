//! Python's operators on config values: arithmetic with Python's int/float
//! rules (true division, flooring `//` and `%`, exact int `**`, 64-bit
//! overflow as a limit error), sequence concatenation and repetition, unary
//! operators, `==` across numeric types, ordering, `in` and `is`.

use super::{check_len, check_nested, PyError, PyResult};
use crate::config::value::Value;

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

/// A number as Python's arithmetic sees it (`True` is the int 1).
pub(super) enum Num {
    Int(i64),
    Float(f64),
}

pub(super) fn num(v: &Value) -> Option<Num> {
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
    check_nested(items, n)?;
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
            check_nested(x, 1)?;
            check_nested(y, 1)?;
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

/// Arithmetic on two numbers: int results stay exact ints (64-bit overflow
/// is a limit error, never a silent float); `/`, a negative `**` exponent
/// and any float operand give a float.
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

/// Python's ordering for `<`, `<=`, `>`, `>=`, `sorted`, `min` and `max`;
/// `symbol` is the operator the TypeError names.
pub(super) fn order(a: &Value, b: &Value, symbol: &str) -> Result<std::cmp::Ordering, PyError> {
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
    fn sequences_concatenate_and_repeat() {
        let l = binary(BinOp::Mul, &Value::List(vec![F(1.0)]), &I(3)).unwrap();
        let l = binary(BinOp::Add, &l, &Value::List(vec![F(0.1)])).unwrap();
        assert_eq!(l, Value::List(vec![F(1.0), F(1.0), F(1.0), F(0.1)]));
        assert!(binary(BinOp::Mul, &Value::List(vec![I(0)]), &I(1 << 40))
            .unwrap_err()
            .is_limit());
    }
}
