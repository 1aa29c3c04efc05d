//! The loader: `Config.fromfile` for one file and everything it inherits.
//! Each file is read, substituted, prepared and evaluated on its own, after
//! its `_base_` files, which are loaded first (once each: a file's value
//! depends only on its path) and merged in order. `_base_` inheritance forms
//! a DAG kept in a `petgraph` graph; a cycle is an error that names it
//! (MMEngine itself overflows its stack).

use super::error::{ConfigError, ErrorKind, Location};
use super::eval::{self, Limits};
use super::merge;
use super::prepare::{Bases, FileKind, Prepared};
use super::substitute;
use super::value::Dict;
use petgraph::graph::{DiGraph, NodeIndex};
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Top-level keys MMEngine's `Config` refuses.
pub const RESERVED_KEYS: &[&str] = &["filename", "text", "pretty_text", "env_variables"];
const DEPRECATION_KEY: &str = "_deprecation_";

/// Loads config files, sharing evaluated files between loads (a file's
/// value depends only on its own path, so caching is exact).
pub struct Loader {
    limits: Limits,
    files: HashMap<PathBuf, Arc<Dict>>,
    graph: DiGraph<PathBuf, ()>,
    nodes: HashMap<PathBuf, NodeIndex>,
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
        if let Some(what) = eval::not_a_regular_file(&abs) {
            return Err(ConfigError::new(
                ErrorKind::Io,
                format!("config file {} {what}", path.display()),
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

    /// One file merged over its bases, `__`-names dropped; cached by path.
    fn load_file(&mut self, abs: &Path) -> Result<Arc<Dict>, ConfigError> {
        if let Some(done) = self.files.get(abs) {
            return Ok(done.clone());
        }
        let kind = FileKind::of(abs)?;
        let raw = eval::read_source(abs)?;
        if matches!(kind, FileKind::Python) && raw.starts_with('\u{feff}') {
            // MMEngine reads the file as text and ast.parse refuses the mark.
            return Err(ConfigError::new(
                ErrorKind::Syntax,
                "Python syntax error: invalid non-printable character U+FEFF (the file starts \
                 with a UTF-8 byte-order mark, which MMEngine refuses too)",
            )
            .at(Location {
                file: abs.to_path_buf(),
                line: 1,
                column: 1,
                source_line: None,
            })
            .with_help("save the file as UTF-8 without a byte-order mark"));
        }
        let (source, placeholders) = match kind {
            FileKind::Python => substitute::before_parsing(&raw, abs)?,
            FileKind::Rhai => (raw.clone(), Vec::new()),
        };
        let prepared = Prepared::new(kind, abs, &source, self.limits)?;
        let base = self.load_bases(abs, &prepared.bases)?;

        let (mut cfg, base) = prepared.evaluate(abs, &source, base, self.limits)?;
        cfg.shift_remove(DEPRECATION_KEY);
        if !placeholders.is_empty() {
            cfg = substitute::substitute_base_vars(cfg, &placeholders, &base).map_err(|e| {
                // The `{{_base_.x}}` the message names, where it is written.
                let offset = placeholders
                    .iter()
                    .filter(|(_, path)| e.message.contains(&format!("_base_.{path}}}")))
                    .find_map(|(_, path)| raw.find(&format!("_base_.{path}")))
                    .map(|at| raw[..at].rfind("{{").unwrap_or(at))
                    .unwrap_or(0);
                e.at(Location::from_offset(abs, &raw, offset))
            })?;
        }
        let mut merged = base;
        for (k, v) in cfg {
            // Located only on an error: finding a line is a scan of the file.
            let at = |k: &str| prepared.binding_location(abs, &source, k);
            let key = k.clone();
            merge::merge_entry(&mut merged, k, v, false).map_err(|e| e.at(at(&key)))?;
        }
        let merged: Dict = merged
            .into_iter()
            .filter(|(k, _)| !k.starts_with("__"))
            .collect();
        let merged = Arc::new(merged);
        self.files.insert(abs.to_path_buf(), merged.clone());
        Ok(merged)
    }

    /// Loads `abs`'s bases, in order, into one dict. Sibling bases must not
    /// bind the same top-level name: MMEngine refuses that too.
    fn load_bases(&mut self, abs: &Path, bases: &Bases) -> Result<Dict, ConfigError> {
        let me = self.node(abs);
        let mut base = Dict::new();
        let mut owner: HashMap<String, PathBuf> = HashMap::new();
        for rel in &bases.paths {
            let at = |e: ConfigError| match &bases.location {
                Some(loc) if e.location.is_none() => e.at(loc.clone()),
                _ => e,
            };
            let base_path = base_file(abs, rel).map_err(at)?;
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
        Ok(base)
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

/// Where `_base_` entry `rel` of `abs` points, if that is a regular file.
/// Its type is read before anything opens it: opening a FIFO for reading
/// would wait for a writer forever.
fn base_file(abs: &Path, rel: &str) -> Result<PathBuf, ConfigError> {
    if rel.contains("::") {
        return Err(ConfigError::new(
            ErrorKind::MissingBase,
            format!("package-scoped base `{rel}` needs the Python package installed"),
        )
        .with_help("copy the base config next to yours and use a relative path"));
    }
    let base_path = normalize(&eval::config_dir(abs).join(rel));
    match eval::not_a_regular_file(&base_path) {
        None => Ok(base_path),
        Some(problem) => {
            // "not found" for a missing file: the words users know.
            let what = if problem.missing {
                "not found"
            } else {
                "is not a config file"
            };
            Err(ConfigError::new(
                ErrorKind::MissingBase,
                format!(
                    "base config `{rel}` {what}: {} {problem}",
                    base_path.display()
                ),
            )
            .with_help("`_base_` paths are relative to the file that names them"))
        }
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
