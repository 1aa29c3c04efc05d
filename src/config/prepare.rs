//! Per-language preparation of one config file: a Python config is parsed
//! and translated to Rhai ([`super::translate`]), a Rhai config is compiled
//! as is; either way its `_base_` list is read ahead of evaluation, so the
//! loader can load the bases first, and each top-level name remembers where
//! it is bound, so a merge error can point at it. [`Prepared::evaluate`]
//! then runs the file with `_base_` bound to its merged bases.

use super::error::{ConfigError, ErrorKind, Location};
use super::eval::{self, Limits};
use super::imports::Importer;
use super::loader::Loader;
use super::translate::{self, BASE_KEY};
use super::value::{Dict, Value};
use super::written;
use rhai::{Dynamic, Scope};
use std::collections::HashMap;
use std::path::Path;

/// A config's language, told by its extension.
#[derive(Clone, Copy)]
pub(super) enum FileKind {
    Python,
    Rhai,
}

impl FileKind {
    pub(super) fn of(path: &Path) -> Result<FileKind, ConfigError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("py") => Ok(FileKind::Python),
            Some("rhai") => Ok(FileKind::Rhai),
            _ => Err(ConfigError::new(
                ErrorKind::Io,
                format!("{}: a config must be a .py or .rhai file", path.display()),
            )),
        }
    }
}

/// How a file names its bases and where that statement is.
pub(super) struct Bases {
    pub(super) paths: Vec<String>,
    pub(super) location: Option<Location>,
}

/// A parsed file, ready to be evaluated once its bases are known.
pub(super) struct Prepared {
    pub(super) bases: Bases,
    body: Body,
    /// Where each top-level name is first bound: a byte offset (Python) or
    /// a 1-based line and column (Rhai).
    bindings: HashMap<String, (usize, usize)>,
}

/// The compiled script; a translated Python file also keeps, per Rhai line,
/// the byte offset of the Python statement it came from.
enum Body {
    Python {
        script: rhai::AST,
        line_offsets: Vec<usize>,
    },
    Rhai {
        script: rhai::AST,
    },
}

impl Prepared {
    pub(super) fn new(
        kind: FileKind,
        abs: &Path,
        source: &str,
        limits: Limits,
    ) -> Result<Prepared, ConfigError> {
        match kind {
            FileKind::Python => Prepared::python(abs, source, limits),
            FileKind::Rhai => Prepared::rhai(abs, source, limits),
        }
    }

    fn python(abs: &Path, source: &str, limits: Limits) -> Result<Prepared, ConfigError> {
        let limits = limits.translated();
        let stmts = translate::parse(abs, source)?;
        let bases = match translate::base_expression(&stmts) {
            None => Bases {
                paths: Vec::new(),
                location: None,
            },
            Some(expr) => {
                use rustpython_parser::ast::Ranged;
                let location = Location::from_offset(abs, source, usize::from(expr.start()));
                let code = translate::translate_expression(abs, source, expr)?;
                let engine = eval::engine(limits);
                let value = engine
                    .eval_expression::<Dynamic>(&code)
                    .or_else(|_| engine.eval::<Dynamic>(&code))
                    .map_err(|e| eval::rhai_error(&e).at(location.clone()))?;
                let value = eval::to_value(&value).map_err(|e| {
                    ConfigError::new(ErrorKind::Evaluation, e.to_string()).at(location.clone())
                })?;
                base_list(value, Some(location))?
            }
        };
        let translation = translate::translate_module(abs, source, &stmts)?;
        let mut prepared = Prepared::translated(abs, source, translation, &stmts, limits)?;
        prepared.bases = bases;
        Ok(prepared)
    }

    /// A translated Python file, compiled; its bases are the caller's.
    pub(super) fn translated(
        abs: &Path,
        source: &str,
        translation: translate::Translation,
        stmts: &[rustpython_parser::ast::Stmt],
        limits: Limits,
    ) -> Result<Prepared, ConfigError> {
        let limits = limits.translated();
        let engine = eval::engine(limits);
        let script = engine.compile(&translation.script).map_err(|e| {
            let line = e.position().line().unwrap_or(1);
            let offset = translation.line_offsets.get(line - 1).copied().unwrap_or(0);
            let at = Location::from_offset(abs, source, offset);
            if matches!(e.err_type(), rhai::ParseErrorType::ExprTooDeep) {
                // Not expected (the translator's bound comes first), but
                // if a construct nests deeper in Rhai than allowed for, it
                // is still the nesting, said as the translator says it.
                return ConfigError::new(
                    ErrorKind::Limit,
                    format!(
                        "this expression is nested more than {} levels deep",
                        translate::MAX_EXPR_NESTING
                    ),
                )
                .at(at)
                .with_help("split it into several assignments");
            }
            ConfigError::new(
                ErrorKind::Unsupported,
                format!("segtune could not translate this statement to Rhai ({e})"),
            )
            .at(at)
            .with_help(
                "please report this config to segtune; meanwhile rewrite the statement more simply",
            )
        })?;
        let mut bindings = HashMap::new();
        for stmt in stmts {
            use rustpython_parser::ast::{Expr, Ranged, Stmt};
            if let Stmt::Assign(a) = stmt {
                for t in &a.targets {
                    if let Expr::Name(n) = t {
                        bindings
                            .entry(n.id.to_string())
                            .or_insert((usize::from(stmt.start()), 0));
                    }
                }
            }
        }
        Ok(Prepared {
            bases: Bases {
                paths: Vec::new(),
                location: None,
            },
            body: Body::Python {
                script,
                line_offsets: translation.line_offsets,
            },
            bindings,
        })
    }

    fn rhai(abs: &Path, source: &str, limits: Limits) -> Result<Prepared, ConfigError> {
        let engine = eval::engine(limits);
        let ast = engine.compile(source).map_err(|e| {
            let (line, column) = (
                e.position().line().unwrap_or(1),
                e.position().position().unwrap_or(1),
            );
            let at = Location::from_line_column(abs, source, line, column);
            if matches!(e.err_type(), rhai::ParseErrorType::ExprTooDeep) {
                return ConfigError::new(
                    ErrorKind::Limit,
                    format!(
                        "this expression is nested too deeply (past Rhai's expression-depth \
                         limit of {})",
                        limits.max_expr_depth
                    ),
                )
                .at(at)
                .with_help("split it into several `let`s");
            }
            ConfigError::new(
                ErrorKind::Syntax,
                format!("Rhai syntax error: {}", e.err_type()),
            )
            .at(at)
        })?;
        let mut base_expr = None;
        let mut kept = Vec::new();
        let mut bindings = HashMap::new();
        for stmt in ast.statements() {
            match stmt {
                rhai::Stmt::Var(var, _, pos) if var.0.name == BASE_KEY => {
                    if base_expr.is_none() {
                        base_expr = Some((var.1.clone(), *pos));
                    }
                }
                other => {
                    if let rhai::Stmt::Var(var, _, pos) = other {
                        let at = (pos.line().unwrap_or(1), pos.position().unwrap_or(1));
                        bindings
                            .entry(eval::unmangle(&var.0.name).to_string())
                            .or_insert(at);
                    }
                    kept.push(other.clone())
                }
            }
        }
        let bases = match base_expr {
            None => Bases {
                paths: Vec::new(),
                location: None,
            },
            Some((expr, pos)) => {
                let location = Location::from_line_column(
                    abs,
                    source,
                    pos.line().unwrap_or(1),
                    pos.position().unwrap_or(1),
                );
                let alone = rhai::AST::new([rhai::Stmt::Expr(expr.into())], rhai::Module::new());
                let value = engine
                    .eval_ast::<Dynamic>(&alone)
                    .map_err(|e| eval::rhai_error(&e).at(location.clone()))?;
                let value = eval::to_value(&value).map_err(|e| {
                    ConfigError::new(ErrorKind::Evaluation, e.to_string()).at(location.clone())
                })?;
                base_list(value, Some(location))?
            }
        };
        let mut script = rhai::AST::new(kept, ast.shared_lib().clone());
        script.set_source(abs.display().to_string());
        Ok(Prepared {
            bases,
            body: Body::Rhai { script },
            bindings,
        })
    }

    /// The location of top-level name `key`'s binding (or the file's start).
    pub(super) fn binding_location(&self, abs: &Path, source: &str, key: &str) -> Location {
        match (self.bindings.get(key), &self.body) {
            (Some((offset, _)), Body::Python { .. }) => Location::from_offset(abs, source, *offset),
            (Some((line, column)), Body::Rhai { .. }) => {
                Location::from_line_column(abs, source, *line, *column)
            }
            (None, _) => Location::from_line_column(abs, source, 1, 1),
        }
    }

    /// The engine that runs this file: a Rhai script may `import` `.rhai`
    /// files, which `loader` loads (a translated Python file never imports).
    fn engine(&self, abs: &Path, source: &str, loader: &Loader) -> rhai::Engine {
        match &self.body {
            Body::Python { .. } => eval::engine(loader.limits()),
            Body::Rhai { .. } => eval::engine_importing(
                loader.limits(),
                Importer {
                    file: abs.to_path_buf(),
                    source: source.into(),
                    loader: loader.clone(),
                },
            ),
        }
    }

    /// The script, and for a translated Python file the byte offset of the
    /// Python statement behind each Rhai line.
    fn script(&self) -> (&rhai::AST, Option<&[usize]>) {
        match &self.body {
            Body::Python {
                script,
                line_offsets,
            } => (script, Some(line_offsets)),
            Body::Rhai { script } => (script, None),
        }
    }

    /// Places a Rhai failure at its line of the file, unless it already
    /// has a place (a failure inside an imported file).
    fn locate(&self, abs: &Path, source: &str, e: ConfigError, pos: rhai::Position) -> ConfigError {
        if pos.is_none() || e.location.is_some() {
            return e;
        }
        let at = match self.script().1 {
            Some(offsets) => {
                let line = pos.line().unwrap_or(1);
                Location::from_offset(abs, source, offsets.get(line - 1).copied().unwrap_or(0))
            }
            None => Location::from_line_column(
                abs,
                source,
                pos.line().unwrap_or(1),
                pos.position().unwrap_or(1),
            ),
        };
        e.at(at)
    }

    /// Runs the file with `_base_` bound to its merged bases; returns the
    /// file's own names and the (possibly mutated through `_base_`) bases.
    pub(super) fn evaluate(
        &self,
        abs: &Path,
        source: &str,
        base: Dict,
        loader: &Loader,
    ) -> Result<(Dict, Dict), ConfigError> {
        let engine = self.engine(abs, source, loader);
        let mut scope = Scope::new();
        scope.push(BASE_KEY, eval::to_dynamic(&Value::Dict(base)));
        eval::run(&engine, &mut scope, self.script().0)
            .map_err(|(e, pos)| self.locate(abs, source, e, pos))?;
        written::check_scope(&scope, &[BASE_KEY], abs).map_err(|(name, e)| {
            let line = binding_line(source, &name).unwrap_or(1);
            e.at(Location::from_line_column(abs, source, line, 1))
        })?;
        let cfg = eval::collect_scope(&scope, &[BASE_KEY]).map_err(|(name, e)| {
            let line = binding_line(source, &name).unwrap_or(1);
            let kind = if e.is_limit() {
                ErrorKind::Limit
            } else {
                ErrorKind::Evaluation
            };
            ConfigError::new(kind, e.to_string())
                .at(Location::from_line_column(abs, source, line, 1))
        })?;
        let base = scope
            .get(BASE_KEY)
            .map(eval::to_value)
            .transpose()
            .map_err(|e| ConfigError::new(ErrorKind::Evaluation, e.to_string()))?;
        let base = match base {
            Some(Value::Dict(d)) => d,
            _ => {
                return Err(ConfigError::new(
                    ErrorKind::Evaluation,
                    "the config replaced `_base_` with something that is not a dict",
                )
                .at(Location::from_line_column(abs, source, 1, 1)))
            }
        };
        Ok((cfg, base))
    }

    /// Runs a new-style file with the names its bases export already
    /// bound; returns every top-level name it then holds.
    pub(super) fn evaluate_with_globals(
        &self,
        abs: &Path,
        source: &str,
        globals: Dict,
        loader: &Loader,
    ) -> Result<Dict, ConfigError> {
        let engine = self.engine(abs, source, loader);
        let mut scope = Scope::new();
        for (name, value) in &globals {
            scope.push(eval::mangle(name), eval::to_dynamic(value));
        }
        eval::run(&engine, &mut scope, self.script().0)
            .map_err(|(e, pos)| self.locate(abs, source, e, pos))?;
        written::check_scope(&scope, &[], abs).map_err(|(name, e)| {
            let line = binding_line(source, &name).unwrap_or(1);
            e.at(Location::from_line_column(abs, source, line, 1))
        })?;
        eval::collect_scope(&scope, &[]).map_err(|(name, e)| {
            let line = binding_line(source, &name).unwrap_or(1);
            ConfigError::new(ErrorKind::Evaluation, e.to_string())
                .at(Location::from_line_column(abs, source, line, 1))
        })
    }

    /// Runs an imported `.rhai` file as a Rhai module, with `_base_` bound
    /// to its merged bases as in a config; the module holds what it exports.
    pub(super) fn evaluate_module(
        &self,
        abs: &Path,
        source: &str,
        base: Dict,
        loader: &Loader,
    ) -> Result<rhai::Module, ConfigError> {
        let engine = self.engine(abs, source, loader);
        let mut scope = Scope::new();
        scope.push(BASE_KEY, eval::to_dynamic(&Value::Dict(base)));
        rhai::Module::eval_ast_as_new(scope, self.script().0, &engine).map_err(|e| {
            let pos = e.position();
            self.locate(abs, source, eval::rhai_error(&e), pos)
        })
    }
}

/// The first line that binds `name` at the top level (`name = ...` in
/// Python, `let name = ...` or `const name = ...` in Rhai), to point an
/// error about the value of `name` there.
fn binding_line(source: &str, name: &str) -> Option<usize> {
    source
        .lines()
        .position(|line| {
            let rest = line
                .strip_prefix("let ")
                .or_else(|| line.strip_prefix("const "))
                .unwrap_or(line)
                .trim_start();
            rest.strip_prefix(name).is_some_and(|after| {
                after.trim_start().starts_with('=') && !after.trim_start().starts_with("==")
            })
        })
        .map(|i| i + 1)
}

/// `_base_`'s value as paths: MMEngine takes a str or a list of str.
fn base_list(value: Value, location: Option<Location>) -> Result<Bases, ConfigError> {
    let paths = match value {
        Value::Str(s) => vec![s],
        Value::List(items) => items
            .into_iter()
            .map(|v| match v {
                Value::Str(s) => Ok(s),
                other => Err(other),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|other| {
                let e = ConfigError::new(
                    ErrorKind::Evaluation,
                    format!(
                        "`_base_` items must be paths (str), not {}",
                        other.type_name()
                    ),
                );
                match &location {
                    Some(l) => e.at(l.clone()),
                    None => e,
                }
            })?,
        other => {
            let e = ConfigError::new(
                ErrorKind::Evaluation,
                format!(
                    "`_base_` must be a str or a list of str, not {}",
                    other.type_name()
                ),
            )
            .with_help("MMEngine rejects a tuple here too: write `_base_ = [...]`");
            return Err(match location {
                Some(l) => e.at(l),
                None => e,
            });
        }
    };
    Ok(Bases { paths, location })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config of `n` levels of one construct.
    type Nested = Box<dyn Fn(usize) -> String>;

    /// Each way Python nests, as a config of `n` levels of it.
    fn constructs() -> Vec<(&'static str, Nested)> {
        let wrap = |open: &'static str, close: &'static str| -> Nested {
            Box::new(move |n| format!("x = {}1{}\n", open.repeat(n), close.repeat(n)))
        };
        let chain = |sep: &'static str, tail: &'static str| -> Nested {
            Box::new(move |n| format!("x = 1{}{tail}\n", sep.repeat(n)))
        };
        vec![
            ("list", wrap("[", "]")),
            ("tuple", wrap("(", ",)")),
            ("dict display", wrap("{'k': ", "}")),
            ("dict call", wrap("dict(a=", ")")),
            ("computed key", wrap("{'k' + '': ", "}")),
            ("dict unpacking", wrap("dict(a=1, **dict(b=", "))")),
            ("operator", wrap("1 + (", ")")),
            ("unary", wrap("-(", ")")),
            ("not", wrap("not (", ")")),
            ("and", wrap("1 and (", ")")),
            ("or", wrap("0 or (", ")")),
            ("comparison", wrap("1 < (", ")")),
            ("if-else", wrap("(1 if 1 else (", "))")),
            ("if-else test", wrap("(1 if (", ") else 2)")),
            ("builtin call", wrap("abs(", ")")),
            ("subscript", wrap("[(", ")][0]")),
            ("slice", wrap("[(", ")][0:1]")),
            ("attribute", wrap("dict(a=(", ")).a")),
            ("method", wrap("dict(a=(", ")).get('a')")),
            ("list comprehension", wrap("[v for v in [", "]]")),
            ("comprehension element", wrap("[(", ") for v in [1]]")),
            ("dict comprehension", wrap("{'k': (", ") for v in [1]}")),
            ("generator", wrap("list(v for v in [", "])")),
            (
                "f-string",
                Box::new(|n| format!("x = f'{{{}1{}}}'\n", "[".repeat(n), "]".repeat(n))),
            ),
            ("and chain", chain(" and 1", "")),
            ("comparison chain", chain(" < 2", "")),
            (
                "comprehension ifs",
                Box::new(|n| format!("x = [v for v in [1]{}]\n", " if 1".repeat(n))),
            ),
            (
                "comprehension fors",
                Box::new(|n| {
                    let fors: String = (0..n).map(|i| format!(" for v{i} in [1]")).collect();
                    format!("x = [1{fors}]\n")
                }),
            ),
        ]
    }

    /// Rhai's expression-depth limit for translated Python is high enough
    /// for every construct at the deepest nesting the translator allows:
    /// one level deeper is the translator's message, never Rhai's
    /// "maximum complexity".
    #[test]
    fn every_construct_at_the_deepest_nesting_allowed_compiles() {
        let check = || {
            let path = Path::new("nest.py");
            let engine = eval::engine(Limits::default().translated());
            for (name, config) in constructs() {
                let mut n = 1;
                let refused = loop {
                    let source = config(n);
                    let stmts = translate::parse(path, &source).unwrap();
                    match translate::translate_module(path, &source, &stmts) {
                        Ok(t) => {
                            if let Err(e) = engine.compile(&t.script) {
                                panic!("{name}, {n} levels: Rhai refused it: {e}");
                            }
                            n += 1;
                        }
                        Err(e) => break e,
                    }
                    assert!(n < 1000, "{name}: {n} levels were accepted");
                };
                assert!(
                    refused.kind == ErrorKind::Limit
                        && refused.message.contains("nested more than 100 levels deep")
                        && n > 20,
                    "{name}, {n} levels: {refused}"
                );
            }
        };
        // As deep as the evaluation thread's stack allows (`config::resolve`).
        std::thread::Builder::new()
            .stack_size(512 << 20)
            .spawn(check)
            .unwrap()
            .join()
            .unwrap();
    }
}
