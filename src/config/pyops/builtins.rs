//! The builtin functions a config may call (`len`, `range`, `int`, `min`,
//! `sorted`, ...) and `dict(...)`, with Python's results and Python's error
//! messages.

use super::indexing::iterate;
use super::operators::{binary, compare, num, order, BinOp, CmpOp, Num};
use super::{check_len, PyError, PyResult};
use crate::config::value::{python_float_repr, python_repr, python_str, Dict, Value};

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

#[cfg(test)]
mod tests {
    use super::*;
    use Value::{Float as F, Int as I};

    #[test]
    fn int_of_float_times_int_truncates() {
        // `int(512 * x * 0.1)` from the SAN config.
        let x = binary(BinOp::Mul, &I(512), &I(7)).unwrap();
        let x = binary(BinOp::Mul, &x, &F(0.1)).unwrap();
        assert_eq!(call_builtin("int", &[x]).unwrap(), I(358));
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
}
