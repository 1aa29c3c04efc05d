//! The loader: `Config.fromfile` for one file and everything it inherits.
//! Each file is read, substituted, prepared and evaluated on its own, after
//! its `_base_` files, which are loaded first (once each: a file's value
//! depends only on its path) and merged in order.
//!
//! Files depend on each other in two ways: a `_base_` entry, and a Rhai
//! `import` of a `.rhai` module ([`super::imports`]). Both kinds of edge go
//! into one `petgraph` graph as they are followed, and an edge that would
//! close a cycle is refused with an error naming the whole chain (MMEngine
//! itself, and Rhai's own module loading, recurse until the stack
//! overflows).

use super::error::{ConfigError, ErrorKind, Location};
use super::eval::Limits;
use super::merge;
use super::new_style::{self, NewStyleFile};
use super::prepare::{Bases, FileKind, Prepared};
use super::source;
use super::substitute;
use super::value::Dict;
use super::written;
use petgraph::graph::{DiGraph, NodeIndex};
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Top-level keys MMEngine's `Config` refuses.
pub const RESERVED_KEYS: &[&str] = &["filename", "text", "pretty_text", "env_variables"];
const DEPRECATION_KEY: &str = "_deprecation_";

/// How one file depends on another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// The file names the other in its `_base_`.
    Base,
    /// The file's Rhai script `import`s the other.
    Import,
}

/// Loads config files, sharing evaluated files between loads (a file's
/// value depends only on its own path, so caching is exact).
///
/// Cloning gives another handle on the same caches and graph: the module
/// resolver of every engine the loader starts holds one, so that an
/// `import` met while a file is evaluated is loaded (and checked for
/// cycles) by the same loader. The state sits behind a mutex (Rhai's
/// resolvers must be `Sync`) that is only held for a lookup or an insert,
/// never while a file is evaluated, so re-entering is safe.
#[derive(Clone)]
pub struct Loader {
    limits: Limits,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    files: HashMap<PathBuf, Arc<Dict>>,
    modules: HashMap<PathBuf, rhai::Shared<rhai::Module>>,
    new_style: HashMap<PathBuf, Arc<NewStyleFile>>,
    graph: DiGraph<PathBuf, Link>,
    nodes: HashMap<PathBuf, NodeIndex>,
}

impl State {
    fn node(&mut self, path: &Path) -> NodeIndex {
        if let Some(n) = self.nodes.get(path) {
            return *n;
        }
        let n = self.graph.add_node(path.to_path_buf());
        self.nodes.insert(path.to_path_buf(), n);
        n
    }
}

impl Loader {
    pub fn new(limits: Limits) -> Loader {
        Loader {
            limits,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// `Config.fromfile(path).to_dict()`, with `custom_imports` kept as a
    /// value and never imported.
    pub fn load(&mut self, path: &Path) -> Result<Dict, ConfigError> {
        let abs = absolute(path);
        if let Some(what) = source::not_a_regular_file(&abs) {
            return Err(ConfigError::new(
                ErrorKind::Io,
                format!("config file {} {what}", path.display()),
            ));
        }
        let cfg = if new_style::is_new_style(&abs, &source::read_source(&abs)?)? {
            Arc::new(self.load_new_style_config(&abs)?)
        } else {
            self.load_file(&abs)?
        };
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
        written::check(&cfg, &abs, "")?;
        Ok((*cfg).clone())
    }

    /// Every file this loader read or linked (configs, their bases, Rhai
    /// modules, new-style imports).
    pub(super) fn sources(&self) -> Vec<PathBuf> {
        let state = self.state();
        let mut all: Vec<PathBuf> = state
            .nodes
            .keys()
            .chain(state.files.keys())
            .chain(state.modules.keys())
            .chain(state.new_style.keys())
            .cloned()
            .collect();
        all.sort();
        all.dedup();
        all
    }

    pub(super) fn limits(&self) -> Limits {
        self.limits
    }

    pub(super) fn cached_new_style(&self, abs: &Path) -> Option<Arc<NewStyleFile>> {
        self.state().new_style.get(abs).cloned()
    }

    pub(super) fn cache_new_style(&self, abs: &Path, file: Arc<NewStyleFile>) {
        self.state().new_style.insert(abs.to_path_buf(), file);
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held left no half-made entry behind
        // (each update is one insert), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that `from` depends on `to`, or refuses the edge if it
    /// would close a cycle (the error names the chain; the caller adds the
    /// location of the `_base_` entry or the `import`).
    pub(super) fn link(&self, from: &Path, to: &Path, link: Link) -> Result<(), ConfigError> {
        let mut state = self.state();
        let (a, b) = (state.node(from), state.node(to));
        if let Some(error) = cycle_through(&state.graph, a, b, link) {
            return Err(error);
        }
        state.graph.update_edge(a, b, link);
        Ok(())
    }

    /// One file merged over its bases, `__`-names dropped; cached by path.
    fn load_file(&self, abs: &Path) -> Result<Arc<Dict>, ConfigError> {
        let cached = self.state().files.get(abs).cloned();
        if let Some(done) = cached {
            return Ok(done);
        }
        let kind = FileKind::of(abs)?;
        let raw = source::read_source(abs)?;
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
        if matches!(kind, FileKind::Python) && new_style::is_new_style(abs, &raw)? {
            return Err(new_style::mixed_styles(abs));
        }
        let (source, placeholders) = match kind {
            FileKind::Python => substitute::before_parsing(&raw, abs)?,
            FileKind::Rhai => (raw.clone(), Vec::new()),
        };
        let prepared = Prepared::new(kind, abs, &source, self.limits)?;
        let base = self.load_bases(abs, &prepared.bases)?;

        let (mut cfg, base) = prepared.evaluate(abs, &source, base, self)?;
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
        self.state().files.insert(abs.to_path_buf(), merged.clone());
        Ok(merged)
    }

    /// The Rhai module `abs` (a `.rhai` file some script imports), its
    /// `_base_` loaded and bound as in a config; cached by path.
    pub(super) fn module(&self, abs: &Path) -> Result<rhai::Shared<rhai::Module>, ConfigError> {
        let cached = self.state().modules.get(abs).cloned();
        if let Some(done) = cached {
            return Ok(done);
        }
        let source = source::read_source(abs)?;
        let prepared = Prepared::new(FileKind::Rhai, abs, &source, self.limits)?;
        let base = self.load_bases(abs, &prepared.bases)?;
        let module = rhai::Shared::new(prepared.evaluate_module(abs, &source, base, self)?);
        self.state()
            .modules
            .insert(abs.to_path_buf(), module.clone());
        Ok(module)
    }

    /// Loads `abs`'s bases, in order, into one dict. Sibling bases must not
    /// bind the same top-level name: MMEngine refuses that too.
    pub(super) fn load_bases(&self, abs: &Path, bases: &Bases) -> Result<Dict, ConfigError> {
        let mut base = Dict::new();
        let mut owner: HashMap<String, PathBuf> = HashMap::new();
        for rel in &bases.paths {
            let at = |e: ConfigError| match &bases.location {
                Some(loc) if e.location.is_none() => e.at(loc.clone()),
                _ => e,
            };
            let base_path = base_file(abs, rel).map_err(at)?;
            self.link(abs, &base_path, Link::Base).map_err(at)?;
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
    let base_path = normalize(&source::config_dir(abs).join(rel));
    match source::not_a_regular_file(&base_path) {
        None => Ok(base_path),
        Some(problem) => {
            // "not found" for a missing file: the words users know.
            let what = if problem.missing {
                "not found"
            } else {
                "is not a config file"
            };
            let help = match mmseg_own_base(rel) {
                Some(own) if problem.missing => format!(
                    "`_base_` paths are relative to the file that names them; `{own}` is one of \
                     MMSeg's own configs: point `_base_` at it in an MMSeg checkout or wheel \
                     (`mmseg/.mim/configs/{own}`), e.g. `_base_ = '/path/to/mmsegmentation/configs/{own}'`, \
                     or copy it and the bases it names next to your config"
                ),
                _ => "`_base_` paths are relative to the file that names them".to_string(),
            };
            Err(ConfigError::new(
                ErrorKind::MissingBase,
                format!(
                    "base config `{rel}` {what}: {} {problem}",
                    base_path.display()
                ),
            )
            .with_help(help))
        }
    }
}

/// The path under MMSeg's `configs/` that a relative `_base_` names, where
/// it has the shape of one of MMSeg's own (`../_base_/models/...`,
/// `../pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py`).
fn mmseg_own_base(rel: &str) -> Option<String> {
    let tail: Vec<&str> = rel
        .split('/')
        .skip_while(|part| *part == ".." || *part == ".")
        .collect();
    let own = tail.join("/");
    let shaped = own.starts_with("_base_/")
        || (tail.len() == 2 && tail[1].ends_with(".py") && tail[1].contains("xb"));
    (rel.starts_with("..") && shaped).then_some(own)
}

/// If adding edge `from -> to` (a `link`) closes a cycle, the error that
/// names it.
fn cycle_through(
    graph: &DiGraph<PathBuf, Link>,
    from: NodeIndex,
    to: NodeIndex,
    link: Link,
) -> Option<ConfigError> {
    let mut cycle: Vec<NodeIndex> = if from == to {
        vec![from]
    } else if petgraph::algo::has_path_connecting(graph, to, from, None) {
        // `to ... from`: closing it with the new edge `from -> to` makes the cycle.
        petgraph::algo::all_simple_paths::<Vec<_>, _, std::hash::RandomState>(
            graph, to, from, 0, None,
        )
        .next()?
    } else {
        return None;
    };
    // Start at the file loaded first (usually the one the user named).
    let first = (0..cycle.len())
        .min_by_key(|i| cycle[*i].index())
        .unwrap_or(0);
    cycle.rotate_left(first);
    cycle.push(cycle[0]);
    let kinds: Vec<Link> = cycle
        .windows(2)
        .map(|pair| match graph.find_edge(pair[0], pair[1]) {
            Some(e) if (pair[0], pair[1]) != (from, to) => graph[e],
            _ => link,
        })
        .collect();
    let names: Vec<String> = cycle
        .iter()
        .map(|n| graph[*n].display().to_string())
        .collect();
    let (what, help) = if kinds.iter().all(|k| *k == Link::Base) {
        (
            "`_base_` cycle",
            "a config cannot inherit from itself, directly or through its bases",
        )
    } else if kinds.iter().all(|k| *k == Link::Import) {
        (
            "`import` cycle",
            "a Rhai module cannot import itself, directly or through the modules it imports",
        )
    } else {
        (
            "`_base_`/`import` cycle",
            "a config cannot depend on itself through the files it inherits from (`_base_`) or imports",
        )
    };
    Some(
        ConfigError::new(
            ErrorKind::BaseCycle,
            format!("{what}: {}", names.join(" -> ")),
        )
        .with_help(help),
    )
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

pub(super) fn normalize(path: &Path) -> PathBuf {
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
