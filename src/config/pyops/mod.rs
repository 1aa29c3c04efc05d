//! Python's semantics for the operators and builtins a config may use, on
//! [`Value`]s: `/` is true division, `//` and `%` floor towards minus
//! infinity, `**` of ints stays an int, `[1.0] * n + [0.1]` concatenates,
//! `int(2.7)` truncates, and so on. The Rhai evaluator calls these for every
//! operator of a translated Python config, so Rhai's own (C-like) arithmetic
//! never decides a config value.
//!
//! Operators (arithmetic, comparison, membership) are in `operators`;
//! indexing, slicing and iteration in `indexing`; the builtin functions and
//! `dict(...)` in `builtins`; f-string format specs in `format_spec`.

mod builtins;
mod format_spec;
mod indexing;
mod operators;

pub use builtins::{call_builtin, make_dict, BUILTINS};
pub use format_spec::format_value;
pub use indexing::{get_item, iterate, slice};
pub use operators::{binary, compare, equal, invert, negate, positive, BinOp, CmpOp};

use super::value::Value;

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

/// Values (counted through nesting) a built sequence may hold: Python
/// shares the inner list of `[[0] * 1000] * 1000`, segtune's evaluation
/// copies it, so the bound is on what would be copied.
pub const MAX_NESTED_VALUES: usize = 1 << 22;

/// Every value of `v`, nested ones included (a leaf counts one).
pub fn nested_values(v: &Value) -> usize {
    let mut count = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        count += 1;
        match v {
            Value::List(items) | Value::Tuple(items) => stack.extend(items.iter()),
            Value::Dict(d) => stack.extend(d.values()),
            _ => {}
        }
        if count > MAX_NESTED_VALUES {
            break;
        }
    }
    count
}

/// About how many bytes `v` holds once built, nested values included: a
/// generous count (a small dict costs a hash table here and a B-tree node
/// in Rhai, some 800 bytes in all), so that a repetition the budget lets
/// through cannot outgrow it by much.
fn deep_bytes(v: &Value) -> usize {
    let mut bytes = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        bytes = bytes.saturating_add(std::mem::size_of::<Value>() + 16);
        match v {
            Value::Str(s) => bytes = bytes.saturating_add(s.len() + 32),
            Value::List(items) | Value::Tuple(items) => {
                bytes = bytes.saturating_add(64);
                stack.extend(items.iter());
            }
            Value::Dict(d) => {
                bytes = bytes.saturating_add(768);
                bytes = bytes.saturating_add(d.iter().map(|(k, _)| k.len() + 96).sum());
                stack.extend(d.values());
            }
            _ => {}
        }
        if bytes > crate::config::eval_meter::EVALUATION_BUDGET_BYTES {
            break;
        }
    }
    bytes
}

/// Refuses a sequence of `copies` copies of `items` that would hold more
/// than [`MAX_NESTED_VALUES`] values in all, or more bytes than the
/// evaluation's budget has left, before it is built.
fn check_nested(items: &[Value], copies: usize) -> Result<(), PyError> {
    let one: usize = items
        .iter()
        .map(nested_values)
        .fold(0usize, usize::saturating_add);
    let total = one.saturating_mul(copies);
    if total > MAX_NESTED_VALUES {
        return Err(PyError::limit(format!(
            "this would build {total} values in all (nested lists counted item by item), \
             more than the limit of {MAX_NESTED_VALUES}"
        )));
    }
    let bytes = items
        .iter()
        .map(deep_bytes)
        .fold(0usize, usize::saturating_add)
        .saturating_mul(copies);
    // Built as segtune's value, then converted for Rhai: twice.
    crate::config::eval_meter::reserve(bytes.saturating_mul(2)).map_err(PyError::limit)
}

/// Refuses a sequence over [`MAX_SEQUENCE_LEN`] before it is built.
fn check_len(len: usize) -> Result<(), PyError> {
    if len > MAX_SEQUENCE_LEN {
        Err(PyError::limit(format!(
            "a sequence of {len} items is larger than the limit of {MAX_SEQUENCE_LEN}"
        )))
    } else {
        Ok(())
    }
}
