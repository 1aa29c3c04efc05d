//! Rhai built-ins that build a large value in one call, re-registered so
//! that they ask the evaluation budget ([`super::budget`]) first.
//!
//! segtune turns off Rhai's own size limits: they re-measure every array
//! after every call, which makes a loop of `push`es quadratic (200 000
//! pushes took 12 s). The allocator-counted budget replaces them, checked
//! before each operation; only the calls below can build far more than
//! their inputs in a single operation (`a.pad(100000000, x)`, `s.to_chars()`
//! of a long string, `s.split("")`), so they check before building.

use super::eval_meter;
use super::pyops::PyError;
use rhai::{Array, Dynamic, Engine, EvalAltResult, ImmutableString, INT};
use std::mem::size_of;

type Checked<T> = Result<T, Box<EvalAltResult>>;

fn limit(message: String) -> Box<EvalAltResult> {
    Box::new(EvalAltResult::ErrorRuntime(
        Dynamic::from(PyError::limit(message)),
        rhai::Position::NONE,
    ))
}

/// About how many bytes `value` holds, nested values included.
fn deep_bytes(value: &Dynamic) -> usize {
    let mut bytes = 0usize;
    let mut stack = vec![value.clone()];
    while let Some(v) = stack.pop() {
        bytes = bytes.saturating_add(size_of::<Dynamic>());
        if let Some(a) = v.read_lock::<Array>() {
            stack.extend(a.iter().cloned());
        } else if let Some(m) = v.read_lock::<rhai::Map>() {
            bytes = bytes.saturating_add(m.len() * 48);
            stack.extend(m.values().cloned());
        } else if let Some(s) = v.read_lock::<ImmutableString>() {
            bytes = bytes.saturating_add(s.len());
        }
        if bytes > eval_meter::EVALUATION_BUDGET_BYTES {
            break;
        }
    }
    bytes
}

fn reserve(bytes: usize) -> Checked<()> {
    eval_meter::reserve(bytes).map_err(limit)
}

/// What splitting `s` into up to its length + 1 pieces may hold.
fn reserve_pieces(s: &str) -> Checked<()> {
    reserve((s.len() + 1).saturating_mul(size_of::<Dynamic>() + 32))
}

fn to_array<'a>(pieces: impl Iterator<Item = &'a str>) -> Array {
    pieces.map(|p| Dynamic::from(p.to_string())).collect()
}

fn segments(n: INT) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Rhai keeps an empty string, or one without the delimiter, whole.
fn lacks(s: &str, delimiter: &str) -> bool {
    s.is_empty() || (!delimiter.is_empty() && !s.contains(delimiter))
}

/// Rhai's `split`/`split_rev`: the string whole when `keep_whole`, else its
/// pieces, after reserving what the pieces may hold.
fn split_checked<'s, I: Iterator<Item = &'s str>>(
    s: &'s ImmutableString,
    keep_whole: bool,
    split: impl FnOnce(&'s str) -> I,
) -> Checked<Array> {
    reserve_pieces(s)?;
    Ok(if keep_whole {
        vec![s.clone().into()]
    } else {
        to_array(split(s.as_str()))
    })
}

/// Registers the checked versions over Rhai's own.
pub fn register(engine: &mut Engine) {
    engine
        .register_fn(
            "pad",
            |a: &mut Array, len: INT, item: Dynamic| -> Checked<()> {
                let Ok(len) = usize::try_from(len) else {
                    return Ok(());
                };
                if len <= a.len() {
                    return Ok(());
                }
                reserve((len - a.len()).saturating_mul(deep_bytes(&item)))?;
                a.resize(len, item);
                Ok(())
            },
        )
        .register_fn(
            "pad",
            |s: &mut ImmutableString, len: INT, c: char| -> Checked<()> {
                let have = s.chars().count();
                let Ok(len) = usize::try_from(len) else {
                    return Ok(());
                };
                if len <= have {
                    return Ok(());
                }
                reserve((len - have).saturating_mul(c.len_utf8()))?;
                let p = s.make_mut();
                p.extend(std::iter::repeat_n(c, len - have));
                Ok(())
            },
        )
        .register_fn(
            "pad",
            |s: &mut ImmutableString, len: INT, padding: &str| -> Checked<()> {
                let have = s.chars().count();
                let Ok(len) = usize::try_from(len) else {
                    return Ok(());
                };
                if len <= have || padding.is_empty() {
                    return Ok(());
                }
                reserve((len - have).saturating_mul(4))?;
                let p = s.make_mut();
                p.extend(padding.chars().cycle().take(len - have));
                Ok(())
            },
        )
        .register_fn("to_chars", |s: &str| -> Checked<Array> {
            reserve(s.len().saturating_mul(size_of::<Dynamic>()))?;
            Ok(s.chars().map(Dynamic::from).collect())
        })
        .register_fn("split", |s: &mut ImmutableString| -> Checked<Array> {
            split_checked(s, s.is_empty(), |t| t.split_whitespace())
        })
        .register_fn(
            "split",
            |s: &mut ImmutableString, d: &str| -> Checked<Array> {
                split_checked(s, lacks(s, d), |t| t.split(d))
            },
        )
        .register_fn(
            "split",
            |s: &mut ImmutableString, d: &str, n: INT| -> Checked<Array> {
                split_checked(s, n <= 1 || lacks(s, d), |t| t.splitn(segments(n), d))
            },
        )
        .register_fn(
            "split",
            |s: &mut ImmutableString, d: char| -> Checked<Array> {
                split_checked(s, s.is_empty() || !s.contains(d), |t| t.split(d))
            },
        )
        .register_fn(
            "split",
            |s: &mut ImmutableString, d: char, n: INT| -> Checked<Array> {
                split_checked(s, n <= 1 || s.is_empty() || !s.contains(d), |t| {
                    t.splitn(segments(n), d)
                })
            },
        )
        .register_fn(
            "split_rev",
            |s: &mut ImmutableString, d: &str| -> Checked<Array> {
                split_checked(s, lacks(s, d), |t| t.rsplit(d))
            },
        )
        .register_fn(
            "split_rev",
            |s: &mut ImmutableString, d: &str, n: INT| -> Checked<Array> {
                split_checked(s, n <= 1 || lacks(s, d), |t| t.rsplitn(segments(n), d))
            },
        )
        .register_fn(
            "split_rev",
            |s: &mut ImmutableString, d: char| -> Checked<Array> {
                split_checked(s, s.is_empty() || !s.contains(d), |t| t.rsplit(d))
            },
        )
        .register_fn(
            "split_rev",
            |s: &mut ImmutableString, d: char, n: INT| -> Checked<Array> {
                split_checked(s, n <= 1 || s.is_empty() || !s.contains(d), |t| {
                    t.rsplitn(segments(n), d)
                })
            },
        );
}
