//! The Rhai runtime that evaluates every config: the engine with its safety
//! limits, the `tuple` type, the `py_*` functions through which translated
//! Python keeps Python's semantics, preset modules for `import`, and the
//! conversion between Rhai values and config [`Value`]s.

use super::error::{ConfigError, ErrorKind};
use super::eval_meter;
use super::guarded;
use super::imports;
use super::pyops::{self, BinOp, CmpOp, PyError};
use super::value::{python_repr, python_str, Dict, Value};
use rhai::{Array, Dynamic, Engine, EvalAltResult, ImmutableString, Map, Position, Scope, INT};

/// Limits that make a hostile or buggy config fail fast instead of hanging.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_operations: u64,
    pub max_call_levels: usize,
    pub max_expr_depth: usize,
    pub max_modules: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_operations: 5_000_000,
            max_call_levels: 64,
            max_expr_depth: 256,
            max_modules: 64,
        }
    }
}

impl Limits {
    /// The limits for a script translated from Python, whose nesting the
    /// translator bounds (Rhai's expression depth is raised to match it:
    /// [`super::translate::TRANSLATED_EXPR_DEPTH`]).
    pub fn translated(self) -> Limits {
        Limits {
            max_expr_depth: self
                .max_expr_depth
                .max(super::translate::TRANSLATED_EXPR_DEPTH),
            ..self
        }
    }
}

/// Why Rhai stopped a config: it held more than its memory budget.
#[derive(Debug, Clone, Copy)]
struct BudgetExceeded;

/// A Python tuple inside Rhai: immutable, distinct from a list.
#[derive(Debug, Clone)]
pub struct PyTuple(pub Array);

fn raise(err: PyError) -> Box<EvalAltResult> {
    Box::new(EvalAltResult::ErrorRuntime(
        Dynamic::from(err),
        Position::NONE,
    ))
}

type RhaiResult<T> = Result<T, Box<EvalAltResult>>;

/// The most values (leaves and containers) one config value may hold. The
/// largest MMSeg config holds about 3000; the cap keeps a hostile config
/// (`s.to_chars()` of a 2M-character string) from spending seconds and
/// hundreds of megabytes converting values that no model reads.
pub const MAX_CONFIG_VALUES: usize = 1 << 20;

/// Converts a Rhai value into a config value.
pub fn to_value(d: &Dynamic) -> Result<Value, PyError> {
    let mut remaining = MAX_CONFIG_VALUES;
    convert_counted(d, &mut remaining)
}

fn convert_counted(d: &Dynamic, remaining: &mut usize) -> Result<Value, PyError> {
    if *remaining == 0 {
        return Err(PyError::limit(format!(
            "a config value holds more than {MAX_CONFIG_VALUES} values (segtune's limit on what one \
             config value may hold; a real config holds a few thousand)"
        )));
    }
    *remaining -= 1;
    let mut items = |values: &mut dyn Iterator<Item = &Dynamic>| -> Result<Vec<Value>, PyError> {
        values.map(|v| convert_counted(v, remaining)).collect()
    };
    if d.is_unit() {
        return Ok(Value::None);
    }
    if let Some(b) = d.clone().try_cast::<bool>() {
        return Ok(Value::Bool(b));
    }
    if let Some(i) = d.clone().try_cast::<INT>() {
        return Ok(Value::Int(i));
    }
    if let Some(f) = d.clone().try_cast::<rhai::FLOAT>() {
        return Ok(Value::Float(f));
    }
    if let Some(s) = d.read_lock::<ImmutableString>() {
        // Rhai shares a string between the values that hold it; here each
        // becomes a copy, so a list of lists of one long string would
        // expand past any memory: ask the budget before each copy.
        eval_meter::reserve(s.len()).map_err(|_| {
            PyError::limit(format!(
                "copying the config's values out of the evaluation would hold more than {} MiB \
                 (a long string repeated many times?)",
                eval_meter::EVALUATION_BUDGET_BYTES >> 20
            ))
        })?;
        return Ok(Value::Str(s.to_string()));
    }
    if let Some(c) = d.clone().try_cast::<char>() {
        return Ok(Value::Str(c.to_string()));
    }
    if d.is_array() {
        let arr = d.read_lock::<Array>().expect("checked is_array");
        return Ok(Value::List(items(&mut arr.iter())?));
    }
    if d.is_map() {
        let map = d.read_lock::<Map>().expect("checked is_map");
        let mut out = Dict::new();
        for (k, v) in map.iter() {
            out.insert(k.to_string(), convert_counted(v, remaining)?);
        }
        return Ok(Value::Dict(out));
    }
    if d.is::<PyTuple>() {
        let t = d.read_lock::<PyTuple>().expect("checked is PyTuple");
        return Ok(Value::Tuple(items(&mut t.0.iter())?));
    }
    Err(PyError::new(
        "TypeError",
        format!(
            "a value of Rhai type `{}` cannot be part of a config",
            d.type_name()
        ),
    ))
}

/// Converts a config value into a Rhai value.
pub fn to_dynamic(v: &Value) -> Dynamic {
    match v {
        Value::None => Dynamic::UNIT,
        Value::Bool(b) => Dynamic::from(*b),
        Value::Int(i) => Dynamic::from(*i),
        Value::Float(f) => Dynamic::from(*f),
        Value::Str(s) => Dynamic::from(s.clone()),
        Value::List(items) => Dynamic::from_array(items.iter().map(to_dynamic).collect()),
        Value::Tuple(items) => Dynamic::from(PyTuple(items.iter().map(to_dynamic).collect())),
        Value::Dict(d) => Dynamic::from_map(
            d.iter()
                .map(|(k, v)| (k.as_str().into(), to_dynamic(v)))
                .collect(),
        ),
    }
}

fn val(d: &Dynamic) -> RhaiResult<Value> {
    to_value(d).map_err(raise)
}

fn dynamic_result(r: Result<Value, PyError>) -> RhaiResult<Dynamic> {
    r.map(|v| to_dynamic(&v)).map_err(raise)
}

fn binary_fn(
    op: BinOp,
) -> impl Fn(Dynamic, Dynamic) -> RhaiResult<Dynamic> + Send + Sync + 'static {
    move |a, b| dynamic_result(pyops::binary(op, &val(&a)?, &val(&b)?))
}

fn cmp_op(symbol: &str) -> Result<CmpOp, PyError> {
    Ok(match symbol {
        "==" => CmpOp::Eq,
        "!=" => CmpOp::NotEq,
        "<" => CmpOp::Lt,
        "<=" => CmpOp::LtE,
        ">" => CmpOp::Gt,
        ">=" => CmpOp::GtE,
        "in" => CmpOp::In,
        "not in" => CmpOp::NotIn,
        "is" => CmpOp::Is,
        "is not" => CmpOp::IsNot,
        other => {
            return Err(PyError::new(
                "SyntaxError",
                format!("unknown comparison `{other}`"),
            ))
        }
    })
}

fn keyword_dict(kw: Map) -> RhaiResult<Dict> {
    kw.iter()
        .map(|(k, v)| Ok((k.to_string(), val(v)?)))
        .collect()
}

/// Python methods on values that do not mutate their receiver.
fn call_method(recv: &Value, name: &str, args: &[Value]) -> Result<Value, PyError> {
    let arity = |n: std::ops::RangeInclusive<usize>| {
        if n.contains(&args.len()) {
            Ok(())
        } else {
            Err(PyError::new(
                "TypeError",
                format!(
                    "{}.{name}() got {} argument(s)",
                    recv.type_name(),
                    args.len()
                ),
            ))
        }
    };
    match (recv, name) {
        (Value::Dict(d), "get") => {
            arity(1..=2)?;
            let key = args[0].as_str().unwrap_or_default();
            Ok(d.get(key)
                .cloned()
                .unwrap_or_else(|| args.get(1).cloned().unwrap_or(Value::None)))
        }
        (Value::Dict(_) | Value::List(_), "copy") => {
            arity(0..=0)?;
            Ok(recv.clone())
        }
        (Value::Dict(d), "keys") => Ok(Value::List(
            d.keys().map(|k| Value::Str(k.clone())).collect(),
        )),
        (Value::Dict(d), "values") => Ok(Value::List(d.values().cloned().collect())),
        (Value::Dict(d), "items") => Ok(Value::List(
            d.iter()
                .map(|(k, v)| Value::Tuple(vec![Value::Str(k.clone()), v.clone()]))
                .collect(),
        )),
        (Value::List(items) | Value::Tuple(items), "index") => {
            arity(1..=1)?;
            items
                .iter()
                .position(|x| pyops::equal(x, &args[0]))
                .map(|i| Value::Int(i as i64))
                .ok_or_else(|| {
                    PyError::new(
                        "ValueError",
                        format!("{} is not in list", python_repr(&args[0])),
                    )
                })
        }
        (Value::List(items) | Value::Tuple(items), "count") => {
            arity(1..=1)?;
            Ok(Value::Int(
                items.iter().filter(|x| pyops::equal(x, &args[0])).count() as i64,
            ))
        }
        (Value::Str(s), "join") => {
            arity(1..=1)?;
            let parts = pyops::iterate(&args[0])?
                .iter()
                .map(|p| match p {
                    Value::Str(x) => Ok(x.clone()),
                    other => Err(PyError::new(
                        "TypeError",
                        format!(
                            "sequence item: expected str instance, {} found",
                            other.type_name()
                        ),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::Str(parts.join(s)))
        }
        (Value::Str(s), "upper") => Ok(Value::Str(s.to_uppercase())),
        (Value::Str(s), "lower") => Ok(Value::Str(s.to_lowercase())),
        (Value::Str(s), "strip") if args.is_empty() => Ok(Value::Str(s.trim().to_string())),
        (Value::Str(s), "replace") => {
            arity(2..=2)?;
            match (&args[0], &args[1]) {
                (Value::Str(a), Value::Str(b)) => Ok(Value::Str(s.replace(a.as_str(), b))),
                _ => Err(PyError::new("TypeError", "replace() arguments must be str")),
            }
        }
        (Value::Str(s), "split") => {
            arity(0..=1)?;
            let parts: Vec<Value> = match args.first() {
                None | Some(Value::None) => {
                    s.split_whitespace().map(|p| Value::Str(p.into())).collect()
                }
                Some(Value::Str(sep)) => s
                    .split(sep.as_str())
                    .map(|p| Value::Str(p.into()))
                    .collect(),
                Some(_) => return Err(PyError::new("TypeError", "must be str or None")),
            };
            Ok(Value::List(parts))
        }
        (Value::Str(s), "startswith" | "endswith") => {
            arity(1..=1)?;
            let probe = args[0]
                .as_str()
                .ok_or_else(|| PyError::new("TypeError", "expected a str"))?;
            Ok(Value::Bool(if name == "startswith" {
                s.starts_with(probe)
            } else {
                s.ends_with(probe)
            }))
        }
        _ => Err(PyError::new(
            "AttributeError",
            format!(
                "'{}' object has no attribute '{name}' (or segtune does not support it)",
                recv.type_name()
            ),
        )),
    }
}

/// Builds the engine that evaluates configs; its `import` finds only the
/// shipped presets (the engine of a script that may import `.rhai` files
/// is [`engine_importing`]).
pub fn engine(limits: Limits) -> Engine {
    engine_with(limits, imports::ModuleResolver::presets_only())
}

/// The engine that runs `importer`'s script: an `import` of a `.rhai` file
/// next to it is loaded by the importer's loader, which refuses cycles.
pub(super) fn engine_importing(limits: Limits, importer: imports::Importer) -> Engine {
    engine_with(limits, imports::ModuleResolver::new(importer))
}

fn engine_with(limits: Limits, resolver: imports::ModuleResolver) -> Engine {
    use rhai::packages::{self, Package};
    // Rhai's standard library without blobs and clocks (no config needs
    // them; a blob is built from a size argument in one call).
    let mut engine = Engine::new_raw();
    for package in [
        packages::CorePackage::new().as_shared_module(),
        packages::BitFieldPackage::new().as_shared_module(),
        packages::LogicPackage::new().as_shared_module(),
        packages::BasicMathPackage::new().as_shared_module(),
        packages::BasicArrayPackage::new().as_shared_module(),
        packages::BasicMapPackage::new().as_shared_module(),
        packages::MoreStringPackage::new().as_shared_module(),
    ] {
        engine.register_global_module(package);
    }
    engine.set_optimization_level(rhai::OptimizationLevel::None);
    // No Rhai size limits: they re-measure every array after every call
    // (quadratic); the allocator-counted budget bounds memory instead.
    engine
        .set_max_operations(limits.max_operations)
        .set_max_call_levels(limits.max_call_levels)
        .set_max_expr_depths(limits.max_expr_depth, limits.max_expr_depth)
        .set_max_modules(limits.max_modules);
    engine.on_progress(|_| eval_meter::exceeded().then(|| Dynamic::from(BudgetExceeded)));
    guarded::register(&mut engine);
    engine.set_module_resolver(resolver);
    // `print` and `debug` in a config must not write into `segtune
    // resolve`'s output (or break `--json`): both go to stderr.
    engine.on_print(|text| eprintln!("{text}"));
    engine.on_debug(|text, source, pos| match (source, pos.line()) {
        (Some(source), Some(line)) => eprintln!("{source}:{line}: {text}"),
        (None, Some(line)) => eprintln!("line {line}: {text}"),
        _ => eprintln!("{text}"),
    });

    engine
        .register_type_with_name::<PyTuple>("tuple")
        .register_fn("tuple", |items: Array| PyTuple(items))
        .register_fn("tuple", || PyTuple(Array::new()))
        .register_indexer_get(|t: &mut PyTuple, i: INT| -> RhaiResult<Dynamic> {
            let len = t.0.len() as INT;
            let idx = if i < 0 { i + len } else { i };
            t.0.get(idx as usize)
                .cloned()
                .ok_or_else(|| raise(PyError::new("IndexError", "tuple index out of range")))
        })
        .register_fn("len", |t: &mut PyTuple| t.0.len() as INT)
        .register_fn("to_array", |t: &mut PyTuple| t.0.clone())
        .register_fn("to_string", |t: &mut PyTuple| {
            to_value(&Dynamic::from(t.clone()))
                .map(|v| python_repr(&v))
                .unwrap_or_default()
        })
        .register_fn("to_debug", |t: &mut PyTuple| {
            to_value(&Dynamic::from(t.clone()))
                .map(|v| python_repr(&v))
                .unwrap_or_default()
        });

    engine
        .register_fn("py_add", binary_fn(BinOp::Add))
        .register_fn("py_sub", binary_fn(BinOp::Sub))
        .register_fn("py_mul", binary_fn(BinOp::Mul))
        .register_fn("py_truediv", binary_fn(BinOp::TrueDiv))
        .register_fn("py_floordiv", binary_fn(BinOp::FloorDiv))
        .register_fn("py_mod", binary_fn(BinOp::Mod))
        .register_fn("py_pow", binary_fn(BinOp::Pow))
        .register_fn("py_neg", |a: Dynamic| {
            dynamic_result(pyops::negate(&val(&a)?))
        })
        .register_fn("py_pos", |a: Dynamic| {
            dynamic_result(pyops::positive(&val(&a)?))
        })
        .register_fn("py_invert", |a: Dynamic| {
            dynamic_result(pyops::invert(&val(&a)?))
        })
        .register_fn("py_truthy", |a: Dynamic| -> RhaiResult<bool> {
            Ok(val(&a)?.truthy())
        })
        .register_fn("py_not", |a: Dynamic| -> RhaiResult<bool> {
            Ok(!val(&a)?.truthy())
        })
        .register_fn(
            "py_cmp",
            |op: ImmutableString, a: Dynamic, b: Dynamic| -> RhaiResult<bool> {
                pyops::compare(cmp_op(&op).map_err(raise)?, &val(&a)?, &val(&b)?).map_err(raise)
            },
        )
        .register_fn(
            "py_call",
            |name: ImmutableString, args: Array| -> RhaiResult<Dynamic> {
                let args: Vec<Value> = args.iter().map(val).collect::<Result<_, _>>()?;
                dynamic_result(pyops::call_builtin(&name, &args))
            },
        )
        .register_fn(
            "py_dict",
            |positional: Array, kw: Map| -> RhaiResult<Dynamic> {
                let positional: Vec<Value> =
                    positional.iter().map(val).collect::<Result<_, _>>()?;
                dynamic_result(pyops::make_dict(&positional, keyword_dict(kw)?))
            },
        )
        .register_fn("py_dict_chain", |parts: Array| -> RhaiResult<Dynamic> {
            let mut out = Dict::new();
            for part in &parts {
                match val(part)? {
                    Value::Dict(d) => out.extend(d),
                    other => {
                        return Err(raise(PyError::new(
                            "TypeError",
                            format!("'{}' object is not a mapping", other.type_name()),
                        )))
                    }
                }
            }
            Ok(to_dynamic(&Value::Dict(out)))
        })
        .register_fn("py_key", |k: Dynamic| -> RhaiResult<ImmutableString> {
            match val(&k)? {
                Value::Str(s) => Ok(s.into()),
                other => Err(raise(PyError::new(
                    "TypeError",
                    format!(
                        "config dict keys must be strings, not {}",
                        other.type_name()
                    ),
                ))),
            }
        })
        .register_fn(
            "py_getattr",
            |v: Dynamic, name: ImmutableString| -> RhaiResult<Dynamic> {
                match val(&v)? {
                    // An attribute of a lazily imported module or class.
                    Value::Str(s) if s.starts_with(super::translate::lazy::LAZY_MARK) => {
                        Ok(Dynamic::from(format!("{s}.{name}")))
                    }
                    Value::Dict(d) => d.get(name.as_str()).map(to_dynamic).ok_or_else(|| {
                        raise(PyError::new(
                            "AttributeError",
                            format!("the dict has no key '{name}'"),
                        ))
                    }),
                    other => Err(raise(PyError::new(
                        "AttributeError",
                        format!("'{}' object has no attribute '{name}'", other.type_name()),
                    ))),
                }
            },
        )
        .register_fn("py_getitem", |v: Dynamic, k: Dynamic| {
            dynamic_result(pyops::get_item(&val(&v)?, &val(&k)?))
        })
        .register_fn(
            "py_slice",
            |v: Dynamic, lo: Dynamic, hi: Dynamic, step: Dynamic| {
                dynamic_result(pyops::slice(
                    &val(&v)?,
                    &val(&lo)?,
                    &val(&hi)?,
                    &val(&step)?,
                ))
            },
        )
        .register_fn("py_iter", |v: Dynamic| -> RhaiResult<Array> {
            Ok(pyops::iterate(&val(&v)?)
                .map_err(raise)?
                .iter()
                .map(to_dynamic)
                .collect())
        })
        .register_fn("py_unpack", |v: Dynamic, n: INT| -> RhaiResult<Array> {
            let items = pyops::iterate(&val(&v)?).map_err(raise)?;
            if items.len() as INT != n {
                return Err(raise(PyError::new(
                    "ValueError",
                    format!("cannot unpack {} values into {n} names", items.len()),
                )));
            }
            Ok(items.iter().map(to_dynamic).collect())
        })
        .register_fn(
            "py_format",
            |v: Dynamic,
             conversion: ImmutableString,
             spec: ImmutableString|
             -> RhaiResult<ImmutableString> {
                let v = val(&v)?;
                let v = match conversion.as_str() {
                    "r" | "a" => Value::Str(python_repr(&v)),
                    "s" => Value::Str(python_str(&v)),
                    _ => v,
                };
                pyops::format_value(&v, &spec)
                    .map(Into::into)
                    .map_err(raise)
            },
        )
        .register_fn("py_concat", |parts: Array| -> RhaiResult<ImmutableString> {
            let mut out = String::new();
            for p in parts {
                out.push_str(&p.into_string().map_err(|t| {
                    raise(PyError::new("TypeError", format!("expected str, got {t}")))
                })?);
            }
            Ok(out.into())
        })
        .register_fn(
            "py_method",
            |recv: Dynamic, name: ImmutableString, args: Array| -> RhaiResult<Dynamic> {
                let args: Vec<Value> = args.iter().map(val).collect::<Result<_, _>>()?;
                dynamic_result(call_method(&val(&recv)?, &name, &args))
            },
        )
        .register_fn(
            "py_update",
            |m: &mut Dynamic, positional: Array, kw: Map| -> RhaiResult<()> {
                dict_update(m, positional, kw, |d, extra| d.extend(extra))
            },
        )
        .register_fn(
            "py_update_deep",
            |m: &mut Dynamic, positional: Array, kw: Map| -> RhaiResult<()> {
                dict_update(m, positional, kw, update_config_dict)
            },
        )
        .register_fn(
            "py_append",
            |l: &mut Dynamic, item: Dynamic| -> RhaiResult<()> {
                let mut arr = l.as_array_mut().map_err(|t| {
                    raise(PyError::new(
                        "AttributeError",
                        format!("'{t}' object has no attribute 'append'"),
                    ))
                })?;
                arr.push(item);
                Ok(())
            },
        )
        .register_fn(
            "py_extend",
            |l: &mut Dynamic, items: Dynamic| -> RhaiResult<()> {
                let extra: Array = pyops::iterate(&val(&items)?)
                    .map_err(raise)?
                    .iter()
                    .map(to_dynamic)
                    .collect();
                let mut arr = l.as_array_mut().map_err(|t| {
                    raise(PyError::new(
                        "AttributeError",
                        format!("'{t}' object has no attribute 'extend'"),
                    ))
                })?;
                arr.extend(extra);
                Ok(())
            },
        );
    engine
}

/// `d.update(*positional, **kw)` on the dict `m`, the new items joined to
/// it by `merge` (a plain update, or the config's deep one).
fn dict_update(
    m: &mut Dynamic,
    positional: Array,
    kw: Map,
    merge: impl FnOnce(&mut Dict, Dict),
) -> RhaiResult<()> {
    let current = val(m)?;
    let Value::Dict(mut d) = current else {
        return Err(raise(PyError::new(
            "AttributeError",
            format!("'{}' object has no attribute 'update'", current.type_name()),
        )));
    };
    let positional: Vec<Value> = positional.iter().map(val).collect::<Result<_, _>>()?;
    if let Value::Dict(extra) = pyops::make_dict(&positional, keyword_dict(kw)?).map_err(raise)? {
        merge(&mut d, extra);
    }
    *m = to_dynamic(&Value::Dict(d));
    Ok(())
}

/// addict's `Dict.update`, which MMEngine's `ConfigDict` inherits: a key
/// whose old and new values are both dicts is updated recursively; any
/// other key takes the new value.
fn update_config_dict(d: &mut Dict, extra: Dict) {
    for (k, v) in extra {
        match (d.get_mut(&k), v) {
            (Some(Value::Dict(old)), Value::Dict(new)) => update_config_dict(old, new),
            (_, v) => {
                d.insert(k, v);
            }
        }
    }
}

/// Runs a compiled script in `scope`, turning Rhai failures into config errors.
pub fn run(
    engine: &Engine,
    scope: &mut Scope,
    ast: &rhai::AST,
) -> Result<(), (ConfigError, Position)> {
    engine.run_ast_with_scope(scope, ast).map_err(|e| {
        let pos = e.position();
        (rhai_error(&e), pos)
    })
}

/// Describes a Rhai failure in Python's or the config author's terms.
pub fn rhai_error(e: &EvalAltResult) -> ConfigError {
    use EvalAltResult as E;
    match e {
        // A config error raised inside Rhai (an `import` that closes a
        // cycle, or fails in the imported file): already located.
        E::ErrorRuntime(payload, _) if payload.is::<ConfigError>() => {
            payload.clone().cast::<ConfigError>()
        }
        E::ErrorRuntime(payload, _) if payload.is::<PyError>() => {
            let py = payload.clone().cast::<PyError>();
            let kind = if py.is_limit() { ErrorKind::Limit } else { ErrorKind::Evaluation };
            ConfigError::new(kind, py.to_string())
        }
        E::ErrorTooManyOperations(_) => ConfigError::new(
            ErrorKind::Limit,
            "the config ran for too long (operation limit reached); is there an endless loop?",
        ),
        E::ErrorTerminated(token, _) if token.is::<BudgetExceeded>() => {
            ConfigError::new(ErrorKind::Limit, eval_meter::exceeded_message())
        }
        E::ErrorStackOverflow(_) => ConfigError::new(ErrorKind::Limit, "the config recursed too deeply (call depth limit reached)"),
        E::ErrorDataTooLarge(what, _) => ConfigError::new(ErrorKind::Limit, format!("the config built a value larger than the limit ({what})")),
        E::ErrorTooManyModules(_) => ConfigError::new(ErrorKind::Limit, "the config imported too many modules"),
        E::ErrorTooManyVariables(_) => ConfigError::new(ErrorKind::Limit, "the config defined too many variables"),
        E::ErrorVariableNotFound(name, _) => ConfigError::new(
            ErrorKind::Evaluation,
            format!("NameError: name '{}' is not defined", unmangle(name)),
        ),
        E::ErrorInFunctionCall(_, _, inner, _) | E::ErrorInModule(_, inner, _) => rhai_error(inner),
        E::ErrorModuleNotFound(name, _) => ConfigError::new(
            ErrorKind::Evaluation,
            format!("module `{name}` not found: neither a .rhai file next to the config nor a shipped preset"),
        )
        .with_help("`segtune presets` lists the shipped GPU presets"),
        other => {
            let mut text = other.to_string();
            if let Some(i) = text.rfind(" (line ") {
                text.truncate(i);
            }
            ConfigError::new(ErrorKind::Evaluation, text)
        }
    }
}

/// Prefix for Python names that are not valid Rhai variable names.
pub const MANGLE_PREFIX: &str = "py__";

/// The Rhai variable that holds Python name `name`.
pub fn mangle(name: &str) -> String {
    let reserved = rhai::Token::lookup_symbol_from_syntax(name).is_some()
        || RHAI_RESERVED.contains(&name)
        || name.starts_with(MANGLE_PREFIX);
    if rhai::is_valid_identifier(name) && !reserved {
        name.to_string()
    } else {
        format!("{MANGLE_PREFIX}{name}")
    }
}

/// The Python name behind a Rhai variable.
pub fn unmangle(name: &str) -> &str {
    name.strip_prefix(MANGLE_PREFIX).unwrap_or(name)
}

/// Words Rhai reserves that are not (yet) keywords.
const RHAI_RESERVED: &[&str] = &[
    "var",
    "static",
    "shared",
    "use",
    "case",
    "async",
    "public",
    "package",
    "super",
    "protected",
    "spawn",
    "sync",
    "default",
    "this",
    "thread",
    "yield",
    "new",
    "match",
    "await",
    "null",
    "with",
    "void",
    "nil",
    "exit",
    "is",
    "module",
    "goto",
    "go",
    "private",
    "export",
    "import",
    "as",
    "curry",
    "call",
    "type_of",
    "print",
    "debug",
    "eval",
    "is_def_var",
    "is_def_fn",
    "is_shared",
    "Fn",
    "fn",
    "global",
    "catch",
    "try",
    "throw",
];

/// Collects the variables a script left in `scope` as the file's config.
pub fn collect_scope(scope: &Scope, skip: &[&str]) -> Result<Dict, (String, PyError)> {
    let mut out = Dict::new();
    // In binding order (`iter_raw` runs newest first), as Python's module
    // namespace: a name keeps its first position and takes its last value.
    let entries: Vec<(&str, bool, &Dynamic)> = scope.iter_raw().collect();
    for (name, _constant, value) in entries.into_iter().rev() {
        let name = unmangle(name);
        if skip.contains(&name) || name.starts_with("__") {
            continue;
        }
        if value.is::<rhai::FnPtr>() {
            return Err((
                name.to_string(),
                PyError::new(
                    "TypeError",
                    format!(
                        "variable `{name}` holds a closure, and a config holds only values; \
                         write a helper as `fn {name}(...) {{ ... }}` (functions are not collected)"
                    ),
                ),
            ));
        }
        let v = to_value(value).map_err(|e| {
            let message = format!("variable `{name}`: {}", e.message);
            (name.to_string(), PyError::new(e.class, message))
        })?;
        out.insert(name.to_string(), v);
    }
    Ok(out)
}
