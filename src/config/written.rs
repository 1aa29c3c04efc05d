//! How large a resolved config is when written out (`segtune resolve`'s
//! output, a dumped or emitted config), measured without writing it, and
//! the bound on it.
//!
//! The evaluation budget ([`super::budget`]) bounds what a config holds
//! while it runs, but Rhai shares a string between the places that hold
//! it: five lines of `x = [s, s, ...]` over a 100 kB string hold a few
//! megabytes and would print 1.1 GB (and ten times that abort on a failed
//! allocation). So every file's values are measured before they are copied
//! out of Rhai ([`check_scope`]: each shared string or shared container is
//! measured once and counted as many times as it will be written), and the
//! resolved config again after its bases and `--cfg-options` are merged
//! ([`check`]).
//!
//! The measure follows the JSON layout with the Python dump's indentation:
//! every item of a container on its own line, four spaces per level,
//! strings quoted and escaped. It is within a small factor of every output
//! format, and exact enough for a bound that real configs are far below.

use super::error::{ConfigError, ErrorKind};
use super::eval::{unmangle, PyTuple};
use super::value::{python_float_repr, Dict, Value};
use rhai::{Array, Dynamic, ImmutableString, Map, Scope};
use std::collections::HashMap;
use std::path::Path;

/// The most a resolved config may take when written. MMSeg's largest
/// config writes 35 KB of JSON (22 KB of Python) and holds under 4 MB
/// while it resolves; 64 MiB leaves room for any real or generated config
/// (a class list of a million names) while keeping `segtune resolve`'s
/// output, and the copy of the values it is made from, well inside the
/// evaluation budget of 256 MiB and the host's memory.
pub const MAX_WRITTEN_BYTES: u64 = 64 << 20;

/// Spaces per nesting level.
const INDENT: u64 = 4;

/// Strings at least this long are measured once per distinct buffer
/// (shorter ones are cheaper to measure than to look up).
const MEMO_STRING_BYTES: usize = 64;

/// Containers in containers deeper than this are refused, the bound on
/// the nesting of expressions in a config: Python cannot read back a config
/// written much deeper (its parser stops at 200 nested brackets, its JSON
/// reader at 1000), and `x = [x]` repeated builds one as deep as it has
/// lines.
pub const MAX_VALUE_NESTING: u32 = super::translate::MAX_EXPR_NESTING as u32;

/// One value as written: its bytes when it starts at nesting level 0, and
/// the lines after its first, each of which moves right by [`INDENT`] per
/// level it is nested further; and how many containers deep it goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Shape {
    bytes: u64,
    lines: u64,
    depth: u32,
}

impl Shape {
    fn inline(bytes: u64) -> Shape {
        Shape {
            bytes,
            lines: 0,
            depth: 0,
        }
    }

    /// Its bytes one level further in.
    fn one_level_in(self) -> u64 {
        self.bytes.saturating_add(self.lines.saturating_mul(INDENT))
    }
}

/// A list, tuple or dict being measured, item by item.
#[derive(Default)]
struct Block {
    shape: Shape,
    items: u64,
}

impl Block {
    /// An item on its own line (a newline, the indent, `prefix` bytes such
    /// as a dict key, the item, a comma).
    fn item(&mut self, prefix: u64, item: Shape) {
        let bytes = (2 + INDENT)
            .saturating_add(prefix)
            .saturating_add(item.one_level_in());
        self.shape.bytes = self.shape.bytes.saturating_add(bytes);
        self.shape.lines = self
            .shape
            .lines
            .saturating_add(1)
            .saturating_add(item.lines);
        self.shape.depth = self.shape.depth.max(item.depth);
        self.items += 1;
    }

    /// The brackets: `[]` when empty, else `[`, the items, a newline, `]`.
    fn close(self) -> Shape {
        if self.items == 0 {
            return Shape {
                depth: 1,
                ..Shape::inline(2)
            };
        }
        Shape {
            bytes: self.shape.bytes.saturating_add(3),
            lines: self.shape.lines.saturating_add(1),
            depth: self.shape.depth.saturating_add(1),
        }
    }
}

/// A string's length quoted and escaped as JSON writes it.
fn quoted(s: &str) -> u64 {
    let escapes: u64 = s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
            0..=0x1f => 5,
            _ => 0,
        })
        .sum();
    (s.len() as u64).saturating_add(2).saturating_add(escapes)
}

fn int_len(i: i64) -> u64 {
    let digits = i.unsigned_abs().checked_ilog10().unwrap_or(0) as u64 + 1;
    digits + u64::from(i < 0)
}

fn value_shape(v: &Value) -> Shape {
    match v {
        Value::None | Value::Bool(true) => Shape::inline(4),
        Value::Bool(false) => Shape::inline(5),
        Value::Int(i) => Shape::inline(int_len(*i)),
        Value::Float(f) => Shape::inline(python_float_repr(*f).len() as u64),
        Value::Str(s) => Shape::inline(quoted(s)),
        Value::List(items) | Value::Tuple(items) => {
            let mut block = Block::default();
            for item in items {
                block.item(0, value_shape(item));
            }
            block.close()
        }
        Value::Dict(d) => {
            let mut block = Block::default();
            for (k, item) in d {
                block.item(quoted(k) + 2, value_shape(item));
            }
            block.close()
        }
    }
}

/// The bytes of a top-level `key = value` line.
fn top_level(key: &str, value: Shape) -> u64 {
    (key.len() as u64 + 4).saturating_add(value.bytes)
}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

fn too_large(what: String) -> ConfigError {
    ConfigError::new(
        ErrorKind::Limit,
        format!(
            "limit exceeded: {what}, past the limit of {} MiB for a resolved config",
            MAX_WRITTEN_BYTES >> 20
        ),
    )
    .with_help(
        "a real config is tens of KB when written (MMSeg's largest 35 KB); \
         is a long value repeated many times, in a list of lists?",
    )
}

fn too_deep(what: String, depth: u32) -> ConfigError {
    ConfigError::new(
        ErrorKind::Limit,
        format!(
            "limit exceeded: {what} nests containers {depth} levels deep, more than the limit \
             of {MAX_VALUE_NESTING} levels"
        ),
    )
    .with_help(
        "Python could not read the config back (it stops at 200 nested brackets); \
         a real config nests fewer than 10",
    )
}

/// The top-level entries' shapes, measured by `shape`, summed and checked:
/// the error (with the entry to point at) for a config over either bound.
fn check_entries<'a>(
    entries: impl Iterator<Item = (&'a str, Shape)>,
    file: &Path,
    qualifier: &str,
) -> Result<(), (String, ConfigError)> {
    let mut total = 0u64;
    let mut largest = ("", 0u64);
    for (name, shape) in entries {
        if shape.depth > MAX_VALUE_NESTING {
            let what = format!("`{name}` in {}{qualifier}", file.display());
            return Err((name.to_string(), too_deep(what, shape.depth)));
        }
        let bytes = top_level(name, shape);
        total = total.saturating_add(bytes);
        if bytes > largest.1 {
            largest = (name, bytes);
        }
    }
    if total <= MAX_WRITTEN_BYTES {
        return Ok(());
    }
    let (name, bytes) = largest;
    let what = format!(
        "the resolved config of {}{qualifier} would be about {} MiB when written \
         (`{name}` alone {} MiB)",
        file.display(),
        mib(total),
        mib(bytes)
    );
    Err((name.to_string(), too_large(what)))
}

/// About how many bytes `cfg` takes when written.
pub fn written_bytes(cfg: &Dict) -> u64 {
    cfg.iter()
        .map(|(k, v)| top_level(k, value_shape(v)))
        .fold(0, u64::saturating_add)
}

/// Refuses a resolved config (of `file`; `qualifier` says what else went
/// into it, such as " with its --cfg-options") that would take more than
/// [`MAX_WRITTEN_BYTES`] when written, or nests deeper than
/// [`MAX_VALUE_NESTING`].
pub fn check(cfg: &Dict, file: &Path, qualifier: &str) -> Result<(), ConfigError> {
    let entries = cfg.iter().map(|(k, v)| (k.as_str(), value_shape(v)));
    check_entries(entries, file, qualifier).map_err(|(_, e)| e)
}

/// Measures Rhai values in place. A string (or a container shared through
/// a closure) that many places hold is measured once; the expansion that
/// writing them would make is never built.
#[derive(Default)]
struct Measure {
    strings: HashMap<usize, u64>,
    shared: HashMap<usize, Shape>,
}

impl Measure {
    fn dynamic(&mut self, d: &Dynamic) -> Shape {
        if d.is_unit() {
            return Shape::inline(4);
        }
        if let Ok(b) = d.as_bool() {
            return Shape::inline(if b { 4 } else { 5 });
        }
        if let Ok(i) = d.as_int() {
            return Shape::inline(int_len(i));
        }
        if let Ok(f) = d.as_float() {
            return Shape::inline(python_float_repr(f).len() as u64);
        }
        if let Some(s) = d.read_lock::<ImmutableString>() {
            return Shape::inline(self.string(&s));
        }
        if d.is::<char>() {
            return Shape::inline(6);
        }
        if !d.is_shared() {
            return self.container(d);
        }
        // One cell that several values point at: measured once.
        let key = match d.read_lock::<Array>() {
            Some(a) => &*a as *const Array as usize,
            None => match d.read_lock::<Map>() {
                Some(m) => &*m as *const Map as usize,
                None => return self.container(d),
            },
        };
        if let Some(shape) = self.shared.get(&key) {
            return *shape;
        }
        let shape = self.container(d);
        self.shared.insert(key, shape);
        shape
    }

    fn string(&mut self, s: &ImmutableString) -> u64 {
        if s.len() < MEMO_STRING_BYTES {
            return quoted(s);
        }
        *self
            .strings
            .entry(s.as_str().as_ptr() as usize)
            .or_insert_with(|| quoted(s))
    }

    fn container(&mut self, d: &Dynamic) -> Shape {
        let mut block = Block::default();
        if let Some(a) = d.read_lock::<Array>() {
            for item in a.iter() {
                block.item(0, self.dynamic(item));
            }
        } else if let Some(m) = d.read_lock::<Map>() {
            for (k, item) in m.iter() {
                block.item(quoted(k) + 2, self.dynamic(item));
            }
        } else if let Some(t) = d.read_lock::<PyTuple>() {
            for item in t.0.iter() {
                block.item(0, self.dynamic(item));
            }
        } else {
            // Not a config value (a function pointer): refused by the
            // conversion that follows, with its own message.
            return Shape::default();
        }
        block.close()
    }
}

/// Refuses a file whose top-level variables in `scope` (but `skip` and
/// `__` names) would take more than [`MAX_WRITTEN_BYTES`] when written, or
/// nest deeper than [`MAX_VALUE_NESTING`], before they are copied out of
/// Rhai. The error comes with the variable to point at.
pub fn check_scope(scope: &Scope, skip: &[&str], file: &Path) -> Result<(), (String, ConfigError)> {
    let mut measure = Measure::default();
    let entries = scope
        .iter_raw()
        .map(|(name, _constant, value)| (unmangle(name), value))
        .filter(|(name, _)| !skip.contains(name) && !name.starts_with("__"))
        .map(|(name, value)| (name, measure.dynamic(value)));
    check_entries(entries, file, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dict(items: &[(&str, Value)]) -> Dict {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn the_measure_is_the_json_dump_with_four_space_indents() {
        let inner = Value::Dict(dict(&[
            ("type", Value::Str("SyncBN".into())),
            ("eps", Value::Float(1e-5)),
        ]));
        let cfg = dict(&[
            ("norm_cfg", inner.clone()),
            ("crop", Value::Tuple(vec![Value::Int(512), Value::Int(-1)])),
            (
                "deep",
                Value::List(vec![Value::List(vec![inner]), Value::None]),
            ),
            ("empty", Value::List(vec![])),
        ]);
        // The JSON dump (two spaces per level) plus `key = ` per line.
        let json = super::super::dump::to_json(&Value::Dict(cfg.clone()));
        let measured = written_bytes(&cfg);
        assert!(
            measured as usize >= json.len() - 40 && (measured as usize) < json.len() * 2,
            "{measured} vs {}:\n{json}",
            json.len()
        );
    }

    #[test]
    fn shared_strings_count_as_often_as_they_are_written_but_are_read_once() {
        let s: ImmutableString = "a".repeat(100_000).into();
        let mut x = Dynamic::from_array(vec![Dynamic::from(s.clone()); 10]);
        for _ in 0..3 {
            x = Dynamic::from_array(vec![x; 10]);
        }
        // 10^4 copies of 100 kB: 1 GB written, measured reading 100 kB.
        let shape = Measure::default().dynamic(&x);
        assert!(shape.bytes > 1_000_000_000, "{shape:?}");
        assert!(shape.bytes < 1_100_000_000, "{shape:?}");
        assert_eq!(shape.lines, 10 + 100 + 1000 + 10_000 + 1111);
    }
}
