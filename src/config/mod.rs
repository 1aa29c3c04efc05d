//! The config engine: loads MMSeg Python configs and native Rhai configs and
//! resolves them exactly as MMEngine 0.10.7's `Config.fromfile` does
//! (`../shared/mmseg-configs/SPEC.md`): every file evaluated eagerly on its
//! own, bases merged by `_merge_a_into_b`, `_delete_`, `{{_base_.x}}` and
//! `_base_.x`, predefined and environment variables, then `--cfg-options`.
//!
//! `_base_` inheritance forms a DAG kept in a `petgraph` graph; a cycle is an
//! error that names it (MMEngine itself overflows its stack).

pub mod dump;
pub mod error;
pub mod eval;
pub mod merge;
pub mod presets;
pub mod pyops;
pub mod translate;
pub mod value;

pub use error::{ConfigError, ErrorKind, Location};
pub use value::{Dict, Value};

use eval::Limits;
use petgraph::graph::{DiGraph, NodeIndex};
use regex::Regex;
use rhai::{Dynamic, Scope};
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};
use translate::BASE_KEY;

/// Top-level keys MMEngine's `Config` refuses.
pub const RESERVED_KEYS: &[&str] = &["filename", "text", "pretty_text", "env_variables"];
const DEPRECATION_KEY: &str = "_deprecation_";

/// Loads `path` and applies `--cfg-options` items: the whole of
/// `Config.fromfile(path)` + `merge_from_dict`.
pub fn resolve(path: &Path, cfg_options: &[String]) -> Result<Dict, ConfigError> {
    let mut loader = Loader::new(Limits::default());
    let cfg = loader.load(path)?;
    if cfg_options.is_empty() {
        Ok(cfg)
    } else {
        merge::apply_cfg_options(cfg, merge::parse_cfg_options(cfg_options)?)
    }
}

/// Evaluates one config's source text on its own (no `_base_` allowed):
/// the entry point for property tests and fuzzing of the translator.
pub fn evaluate_source(path: &Path, source: &str) -> Result<Dict, ConfigError> {
    let limits = Limits::default();
    let prepared = match FileKind::of(path)? {
        FileKind::Python => Prepared::python(path, source, limits)?,
        FileKind::Rhai => Prepared::rhai(path, source, limits)?,
    };
    if !prepared.bases.paths.is_empty() {
        return Err(ConfigError::new(
            ErrorKind::MissingBase,
            "evaluate_source takes configs without `_base_`",
        ));
    }
    let (cfg, _) = prepared.evaluate(path, source, Dict::new(), limits)?;
    Ok(cfg)
}

/// Loads config files, sharing evaluated files between loads (a file's
/// value depends only on its own path, so caching is exact).
pub struct Loader {
    limits: Limits,
    files: HashMap<PathBuf, Arc<Dict>>,
    graph: DiGraph<PathBuf, ()>,
    nodes: HashMap<PathBuf, NodeIndex>,
}

/// How a file names its bases and where that statement is.
struct Bases {
    paths: Vec<String>,
    location: Option<Location>,
}

impl Loader {
    pub fn new(limits: Limits) -> Loader {
        Loader {
            limits,
            files: HashMap::new(),
            graph: DiGraph::new(),
            nodes: HashMap::new(),
        }
    }

    /// `Config.fromfile(path).to_dict()`, with `custom_imports` kept as a
    /// value and never imported.
    pub fn load(&mut self, path: &Path) -> Result<Dict, ConfigError> {
        let abs = absolute(path);
        if !abs.is_file() {
            return Err(ConfigError::new(
                ErrorKind::Io,
                format!("config file not found: {}", path.display()),
            ));
        }
        let cfg = self.load_file(&abs)?;
        if let Some(k) = RESERVED_KEYS.iter().find(|k| cfg.contains_key(**k)) {
            return Err(ConfigError::new(
                ErrorKind::Reserved,
                format!("`{k}` is reserved for config file"),
            )
            .with_help(format!(
                "rename the top-level `{k}`; MMEngine refuses {}",
                RESERVED_KEYS.join(", ")
            )));
        }
        Ok((*cfg).clone())
    }

    /// The inheritance graph of every file loaded so far (edge: file -> base).
    pub fn graph(&self) -> &DiGraph<PathBuf, ()> {
        &self.graph
    }

    fn node(&mut self, path: &Path) -> NodeIndex {
        if let Some(n) = self.nodes.get(path) {
            return *n;
        }
        let n = self.graph.add_node(path.to_path_buf());
        self.nodes.insert(path.to_path_buf(), n);
        n
    }

    fn load_file(&mut self, abs: &Path) -> Result<Arc<Dict>, ConfigError> {
        if let Some(done) = self.files.get(abs) {
            return Ok(done.clone());
        }
        let kind = FileKind::of(abs)?;
        let raw = eval::read_source(abs)?;
        let (source, placeholders) = match kind {
            FileKind::Python => {
                let text = substitute_predefined_vars(&raw, abs);
                let text = substitute_env_vars(&text, abs)?;
                pre_substitute_base_vars(&text)
            }
            FileKind::Rhai => (raw, Vec::new()),
        };
        let prepared = match kind {
            FileKind::Python => Prepared::python(abs, &source, self.limits)?,
            FileKind::Rhai => Prepared::rhai(abs, &source, self.limits)?,
        };

        let me = self.node(abs);
        let mut base = Dict::new();
        let mut owner: HashMap<String, PathBuf> = HashMap::new();
        for rel in &prepared.bases.paths {
            let at = |e: ConfigError| match &prepared.bases.location {
                Some(loc) if e.location.is_none() => e.at(loc.clone()),
                _ => e,
            };
            if rel.contains("::") {
                return Err(at(ConfigError::new(
                    ErrorKind::MissingBase,
                    format!("package-scoped base `{rel}` needs the Python package installed"),
                )
                .with_help(
                    "copy the base config next to yours and use a relative path",
                )));
            }
            let base_path = normalize(&eval::config_dir(abs).join(rel));
            if !base_path.is_file() {
                return Err(at(ConfigError::new(
                    ErrorKind::MissingBase,
                    format!(
                        "base config `{rel}` not found (looked for {})",
                        base_path.display()
                    ),
                )
                .with_help("`_base_` paths are relative to the file that names them")));
            }
            let child = self.node(&base_path);
            if let Some(cycle) = self.cycle_through(me, child) {
                return Err(at(ConfigError::new(
                    ErrorKind::BaseCycle,
                    format!("`_base_` cycle: {cycle}"),
                )
                .with_help(
                    "a config cannot inherit from itself, directly or through its bases",
                )));
            }
            self.graph.update_edge(me, child, ());
            let loaded = self
                .load_file(&base_path)
                .map_err(|e| e.included_from(abs))?;
            let mut dups: Vec<&String> = loaded.keys().filter(|k| base.contains_key(*k)).collect();
            if !dups.is_empty() {
                dups.sort();
                let names: Vec<String> = dups
                    .iter()
                    .map(|k| {
                        format!(
                            "`{k}` ({} and {})",
                            owner[*k].display(),
                            base_path.display()
                        )
                    })
                    .collect();
                return Err(at(ConfigError::new(
                    ErrorKind::DuplicateBaseKeys,
                    format!("Duplicate key is not allowed among bases. Duplicate keys: {}", names.join(", ")),
                )
                .with_help("sibling bases must not bind the same top-level name; move it into one of them or into this file")));
            }
            for (k, v) in loaded.iter() {
                owner.insert(k.clone(), base_path.clone());
                base.insert(k.clone(), v.clone());
            }
        }

        let (mut cfg, base) = prepared.evaluate(abs, &source, base, self.limits)?;
        cfg.shift_remove(DEPRECATION_KEY);
        if !placeholders.is_empty() {
            cfg = substitute_base_vars(cfg, &placeholders, &base).map_err(|e| {
                e.at(Location {
                    file: abs.to_path_buf(),
                    line: 1,
                    column: 1,
                    source_line: None,
                })
            })?;
        }
        let mut merged = base;
        for (k, v) in cfg {
            let at = prepared.binding_location(abs, &source, &k);
            merge::merge_entry(&mut merged, k, v, false).map_err(|e| e.at(at))?;
        }
        let merged: Dict = merged
            .into_iter()
            .filter(|(k, _)| !k.starts_with("__"))
            .collect();
        let merged = Arc::new(merged);
        self.files.insert(abs.to_path_buf(), merged.clone());
        Ok(merged)
    }

    /// If adding edge `from -> to` closes a cycle, the cycle as text.
    fn cycle_through(&self, from: NodeIndex, to: NodeIndex) -> Option<String> {
        if from == to {
            let p = self.graph[from].display().to_string();
            return Some(format!("{p} -> {p}"));
        }
        if !petgraph::algo::has_path_connecting(&self.graph, to, from, None) {
            return None;
        }
        // `to ... from`: closing it with the new edge `from -> to` makes the cycle.
        let mut cycle: Vec<NodeIndex> = petgraph::algo::all_simple_paths::<
            Vec<_>,
            _,
            std::hash::RandomState,
        >(&self.graph, to, from, 0, None)
        .next()?;
        // Start at the file loaded first (usually the one the user named).
        let first = (0..cycle.len())
            .min_by_key(|i| cycle[*i].index())
            .unwrap_or(0);
        cycle.rotate_left(first);
        cycle.push(cycle[0]);
        let names: Vec<String> = cycle
            .iter()
            .map(|n| self.graph[*n].display().to_string())
            .collect();
        Some(names.join(" -> "))
    }
}

#[derive(Clone, Copy)]
enum FileKind {
    Python,
    Rhai,
}

impl FileKind {
    fn of(path: &Path) -> Result<FileKind, ConfigError> {
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

/// A parsed file, ready to be evaluated once its bases are known.
struct Prepared {
    bases: Bases,
    body: Body,
    /// Where each top-level name is first bound: a byte offset (Python) or
    /// a 1-based line and column (Rhai).
    bindings: HashMap<String, (usize, usize)>,
}

enum Body {
    Python {
        script: rhai::AST,
        line_offsets: Vec<usize>,
    },
    Rhai {
        script: rhai::AST,
    },
}

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

impl Prepared {
    fn python(abs: &Path, source: &str, limits: Limits) -> Result<Prepared, ConfigError> {
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
                let engine = eval::engine(limits, None);
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
        let engine = eval::engine(limits, Some(&eval::config_dir(abs)));
        let script = engine.compile(&translation.script).map_err(|e| {
            let line = e.position().line().unwrap_or(1);
            let offset = translation.line_offsets.get(line - 1).copied().unwrap_or(0);
            ConfigError::new(
                ErrorKind::Unsupported,
                format!("segtune could not translate this statement to Rhai ({e})"),
            )
            .at(Location::from_offset(abs, source, offset))
            .with_help(
                "please report this config to segtune; meanwhile rewrite the statement more simply",
            )
        })?;
        let mut bindings = HashMap::new();
        for stmt in &stmts {
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
            bases,
            body: Body::Python {
                script,
                line_offsets: translation.line_offsets,
            },
            bindings,
        })
    }

    fn rhai(abs: &Path, source: &str, limits: Limits) -> Result<Prepared, ConfigError> {
        let engine = eval::engine(limits, Some(&eval::config_dir(abs)));
        let ast = engine.compile(source).map_err(|e| {
            let (line, column) = (
                e.position().line().unwrap_or(1),
                e.position().position().unwrap_or(1),
            );
            ConfigError::new(
                ErrorKind::Syntax,
                format!("Rhai syntax error: {}", e.err_type()),
            )
            .at(Location::from_line_column(abs, source, line, column))
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
    fn binding_location(&self, abs: &Path, source: &str, key: &str) -> Location {
        match (self.bindings.get(key), &self.body) {
            (Some((offset, _)), Body::Python { .. }) => Location::from_offset(abs, source, *offset),
            (Some((line, column)), Body::Rhai { .. }) => {
                Location::from_line_column(abs, source, *line, *column)
            }
            (None, _) => Location::from_line_column(abs, source, 1, 1),
        }
    }

    /// Runs the file with `_base_` bound to its merged bases; returns the
    /// file's own names and the (possibly mutated through `_base_`) bases.
    fn evaluate(
        &self,
        abs: &Path,
        source: &str,
        base: Dict,
        limits: Limits,
    ) -> Result<(Dict, Dict), ConfigError> {
        let engine = eval::engine(limits, Some(&eval::config_dir(abs)));
        let mut scope = Scope::new();
        scope.push(BASE_KEY, eval::to_dynamic(&Value::Dict(base)));
        let (ast, line_offsets) = match &self.body {
            Body::Python {
                script,
                line_offsets,
            } => (script, Some(line_offsets)),
            Body::Rhai { script } => (script, None),
        };
        let locate = |pos: rhai::Position| match line_offsets {
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
        eval::run(&engine, &mut scope, ast).map_err(|(e, pos)| {
            if pos.is_none() {
                e
            } else {
                e.at(locate(pos))
            }
        })?;
        let cfg = eval::collect_scope(&scope, &[BASE_KEY]).map_err(|e| {
            ConfigError::new(ErrorKind::Evaluation, e.to_string())
                .at(Location::from_line_column(abs, source, 1, 1))
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
}

/// `osp.abspath`: absolute and lexically normalised (symlinks kept).
pub fn absolute(path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    normalize(&joined)
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("static regex"))
}

/// `_substitute_predefined_vars`: `{{ fileDirname }}` and friends.
fn substitute_predefined_vars(text: &str, abs: &Path) -> String {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !text.contains("{{") {
        return text.to_string();
    }
    let dir = abs
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let base = abs
        .file_name()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let stem = abs
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let ext = abs
        .extension()
        .map(|s| format!(".{}", s.to_string_lossy()))
        .unwrap_or_default();
    let re = regex(
        &RE,
        r"\{\{\s*(fileDirname|fileBasename|fileBasenameNoExtension|fileExtname)\s*\}\}",
    );
    re.replace_all(text, |c: &regex::Captures| {
        match &c[1] {
            "fileDirname" => dir.clone(),
            "fileBasename" => base.clone(),
            "fileBasenameNoExtension" => stem.clone(),
            _ => ext.clone(),
        }
        .replace('\\', "/")
    })
    .into_owned()
}

/// `_substitute_env_variables`: `{{'$NAME:default'}}`.
fn substitute_env_vars(text: &str, abs: &Path) -> Result<String, ConfigError> {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !text.contains("{{") {
        return Ok(text.to_string());
    }
    let re = regex(&RE, r#"\{\{['"]?\s*\$(\w+)\s*:\s*(\S*?)\s*['"]?\}\}"#);
    let mut failure = None;
    let out = re.replace_all(text, |c: &regex::Captures| match std::env::var(&c[1]) {
        Ok(v) => v,
        Err(_) if !c[2].is_empty() => c[2].to_string(),
        Err(_) => {
            failure.get_or_insert_with(|| c[1].to_string());
            String::new()
        }
    });
    match failure {
        Some(name) => Err(ConfigError::new(
            ErrorKind::Evaluation,
            format!("environment variable `{name}` is not set and has no default"),
        )
        .at(Location::from_offset(
            abs,
            text,
            text.find(&format!("${name}")).unwrap_or(0),
        ))
        .with_help(format!(
            "set {name} or write a default: {{{{'${name}:value'}}}}"
        ))),
        None => Ok(out.into_owned()),
    }
}

/// `_pre_substitute_base_vars`: each `{{_base_.a.b}}` becomes a quoted
/// placeholder string, replaced by the base's value after evaluation.
fn pre_substitute_base_vars(text: &str) -> (String, Vec<(String, String)>) {
    static RE: OnceLock<Regex> = OnceLock::new();
    if !text.contains("{{") {
        return (text.to_string(), Vec::new());
    }
    let re = regex(&RE, r"\{\{\s*_base_\.([\w\.]+)\s*\}\}");
    let mut placeholders: Vec<(String, String)> = Vec::new();
    let out = re.replace_all(text, |c: &regex::Captures| {
        let path = c[1].to_string();
        let token = match placeholders.iter().find(|(_, p)| *p == path) {
            Some((t, _)) => t.clone(),
            None => {
                let digest = path.bytes().fold(0xcbf29ce484222325u64, |h, b| {
                    (h ^ b as u64).wrapping_mul(0x100000001b3)
                });
                let t = format!("_{path}_{:06x}", digest & 0xffffff);
                placeholders.push((t.clone(), path));
                t
            }
        };
        format!("\"{token}\"")
    });
    (out.into_owned(), placeholders)
}

/// `_substitute_base_vars`: replaces placeholder strings (dict values and
/// list/tuple items, never keys) by the bases' values.
fn substitute_base_vars(
    cfg: Dict,
    placeholders: &[(String, String)],
    base: &Dict,
) -> Result<Dict, ConfigError> {
    fn lookup(path: &str, base: &Dict) -> Result<Value, ConfigError> {
        let mut cur: Option<&Value> = None;
        for (i, key) in path.split('.').enumerate() {
            let next = if i == 0 {
                base.get(key)
            } else {
                cur.and_then(|v| v.as_dict()).and_then(|d| d.get(key))
            };
            cur = Some(next.ok_or_else(|| {
                ConfigError::new(
                    ErrorKind::Evaluation,
                    format!("KeyError: `{{{{_base_.{path}}}}}`: the bases have no `{key}` there"),
                )
            })?);
        }
        Ok(cur.cloned().unwrap_or(Value::None))
    }
    fn walk(
        v: Value,
        placeholders: &[(String, String)],
        base: &Dict,
    ) -> Result<Value, ConfigError> {
        Ok(match v {
            Value::Str(s) => match placeholders.iter().find(|(t, _)| *t == s) {
                Some((_, path)) => lookup(path, base)?,
                None => Value::Str(s),
            },
            Value::List(items) => Value::List(
                items
                    .into_iter()
                    .map(|x| walk(x, placeholders, base))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Tuple(items) => Value::Tuple(
                items
                    .into_iter()
                    .map(|x| walk(x, placeholders, base))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Dict(d) => Value::Dict(
                d.into_iter()
                    .map(|(k, x)| Ok((k, walk(x, placeholders, base)?)))
                    .collect::<Result<_, ConfigError>>()?,
            ),
            other => other,
        })
    }
    match walk(Value::Dict(cfg), placeholders, base)? {
        Value::Dict(d) => Ok(d),
        _ => unreachable!("walking a dict gives a dict"),
    }
}
