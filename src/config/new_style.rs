//! Loading MMEngine's new-style configs (`with read_base(): from .x import
//! *`, classes imported for `type=`), as `Config._parse_lazy_import` does:
//! each base is loaded on its own (new style too, cached by path, cycles
//! refused), the names it exports are bound before the file runs (`import
//! *` all of them, named imports those), the file runs as plain Python over
//! them (`model.backbone.depth = 101`, a `ConfigDict`'s recursive
//! `.update`, `del`), and at the top the names bound to imported objects
//! are left out, as `Config.to_dict()` leaves them; each imported class
//! left in a value becomes the name MMSeg's registries know it by
//! ([`lazy::registered_name`]).

use super::error::{ConfigError, ErrorKind};
use super::loader::{Link, Loader};
use super::prepare::Prepared;
use super::source;
use super::translate::{self, lazy};
use super::value::{Dict, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One new-style file, evaluated: every top-level name it binds (imported
/// objects included: a child that imports `*` sees them), and the names
/// that stand for imported objects (its own and its bases').
#[derive(Debug)]
pub(super) struct NewStyleFile {
    globals: Dict,
    imported: Vec<String>,
}

/// Whether `source` is a new-style config (`Config._is_lazy_import`); a
/// file that does not parse is left to the old-style path, which reports
/// the syntax error after MMEngine's substitutions.
pub(super) fn is_new_style(abs: &Path, source: &str) -> Result<bool, ConfigError> {
    if abs.extension().and_then(|e| e.to_str()) != Some("py") {
        return Ok(false);
    }
    match translate::parse(abs, source) {
        Ok(stmts) => lazy::is_new_style(abs, source, &stmts),
        Err(_) => Ok(false),
    }
}

impl Loader {
    /// `Config.fromfile(abs).to_dict()` for a new-style file.
    pub(super) fn load_new_style_config(&self, abs: &Path) -> Result<Dict, ConfigError> {
        let file = self.new_style_file(abs)?;
        Ok(file
            .globals
            .iter()
            .filter(|(k, _)| !file.imported.contains(k))
            .map(|(k, v)| (k.clone(), registered_names(v)))
            .collect())
    }

    /// One new-style file over its bases; cached by path.
    pub(super) fn new_style_file(&self, abs: &Path) -> Result<Arc<NewStyleFile>, ConfigError> {
        if let Some(done) = self.cached_new_style(abs) {
            return Ok(done);
        }
        let source = source::read_source(abs)?;
        let stmts = translate::parse(abs, &source)?;
        let mut globals = Dict::new();
        let mut imported: Vec<String> = Vec::new();
        for base in lazy::base_imports(abs, &source, &stmts)? {
            let at = |e: ConfigError| {
                if e.location.is_none() {
                    e.at(base.location.clone())
                } else {
                    e
                }
            };
            let path = base_module_path(abs, &base.module).map_err(at)?;
            self.link(abs, &path, Link::Base).map_err(at)?;
            let loaded = self
                .new_style_file(&path)
                .map_err(|e| e.included_from(abs))?;
            for name in &loaded.imported {
                if !imported.contains(name) {
                    imported.push(name.clone());
                }
            }
            for (name, as_name) in &base.names {
                if name == "*" {
                    globals.extend(loaded.globals.iter().map(|(k, v)| (k.clone(), v.clone())));
                    continue;
                }
                let value = loaded.globals.get(name).ok_or_else(|| {
                    at(ConfigError::new(
                        ErrorKind::Evaluation,
                        format!("KeyError: '{name}': {} binds no `{name}`", path.display()),
                    ))
                })?;
                globals.insert(as_name.clone().unwrap_or(name.clone()), value.clone());
            }
        }
        let prebound: Vec<String> = globals.keys().cloned().collect();
        let (translation, names) = translate::translate_new_style(abs, &source, &stmts, &prebound)?;
        let prepared = Prepared::translated(abs, &source, translation, &stmts, self.limits())?;
        let mut cfg = prepared.evaluate_with_globals(abs, &source, globals, self)?;
        cfg.retain(|k, _| !names.deleted.contains(k));
        for name in names.imported {
            if !imported.contains(&name) {
                imported.push(name);
            }
        }
        let file = Arc::new(NewStyleFile {
            globals: cfg,
            imported,
        });
        self.cache_new_style(abs, file.clone());
        Ok(file)
    }
}

/// Where `from <module> import ...` under `with read_base():` points:
/// `.x.y` is `x/y.py` beside the file, each further dot one directory up;
/// an absolute module lives in an installed package, which segtune does
/// not import.
fn base_module_path(abs: &Path, module: &str) -> Result<PathBuf, ConfigError> {
    let level = module.chars().take_while(|c| *c == '.').count();
    if level == 0 {
        return Err(ConfigError::new(
            ErrorKind::MissingBase,
            format!("base config module `{module}` is in an installed package"),
        )
        .with_help(format!(
            "segtune reads files, not installed packages: copy the base next to your config and \
             import it relatively (`from .{} import *`), {}",
            module.rsplit('.').next().unwrap_or(module),
            lazy::CONVERT_HELP
        )));
    }
    let mut dir = source::config_dir(abs);
    for _ in 1..level {
        dir = dir.join("..");
    }
    let rel: PathBuf = module[level..].split('.').collect();
    let path = super::loader::normalize(&dir.join(rel).with_extension("py"));
    match source::not_a_regular_file(&path) {
        None => Ok(path),
        Some(problem) => Err(ConfigError::new(
            ErrorKind::MissingBase,
            format!(
                "ConfigParsingError: {} not found! It means that incorrect module is defined in \
                 `with read_base(): = from {module} import ...` ({problem})",
                path.display()
            ),
        )
        .with_help("relative base modules are read from files beside the config: `.x` is `x.py`, `..x` one directory up")),
    }
}

/// A value with each imported class (a lazy object's marked string)
/// replaced by its registered name.
fn registered_names(v: &Value) -> Value {
    match v {
        Value::Str(s) => match s.strip_prefix(lazy::LAZY_MARK) {
            Some(dotted) => Value::Str(lazy::registered_name(dotted)),
            None => v.clone(),
        },
        Value::List(items) => Value::List(items.iter().map(registered_names).collect()),
        Value::Tuple(items) => Value::Tuple(items.iter().map(registered_names).collect()),
        Value::Dict(d) => Value::Dict(
            d.iter()
                .map(|(k, v)| (k.clone(), registered_names(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The error for an old-style file whose `_base_` names a new-style one
/// (MMEngine requires one style through an inheritance chain).
pub(super) fn mixed_styles(base: &Path) -> ConfigError {
    ConfigError::new(
        ErrorKind::Syntax,
        format!(
            "ConfigParsingError: the configuration file type in the inheritance chain must match: \
             `_base_` names {}, a new-style (`with read_base():`) config",
            base.display()
        ),
    )
    .with_help(lazy::CONVERT_HELP.replacen("or convert", "convert", 1))
}
