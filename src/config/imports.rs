//! Rhai `import` in a `.rhai` config: `import "name" as m;` loads
//! `name.rhai` next to the importing file, else the shipped GPU preset of
//! that name ([`super::presets`]).
//!
//! A `.rhai` module is a file like a config, loaded by the same
//! [`Loader`]: its `_base_` files are loaded and bound as `_base_`, it is
//! evaluated once (cached by path), and the edge importer -> module goes
//! into the loader's dependency graph with the `_base_` edges. So a cycle
//! through any mix of `import` and `_base_` (a module importing itself, two
//! modules importing each other, a module whose bases come back to the
//! importer) is the loader's cycle error at the `import` line. Without it
//! Rhai recursed until the stack overflowed: every import evaluates its
//! module on a fresh runtime state, so Rhai's module limit never sees the
//! loop.

use super::error::{ConfigError, Location};
use super::loader::{Link, Loader};
use super::presets;
use rhai::{Dynamic, Engine, EvalAltResult, Module, Position, Shared};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file whose script an engine runs, for the `import`s in it.
#[derive(Clone)]
pub(super) struct Importer {
    pub(super) file: PathBuf,
    /// The file's text, to show the line of a failing `import`.
    pub(super) source: Arc<str>,
    pub(super) loader: Loader,
}

impl Importer {
    fn location(&self, pos: Position) -> Location {
        Location::from_line_column(
            &self.file,
            &self.source,
            pos.line().unwrap_or(1),
            pos.position().unwrap_or(1),
        )
    }

    /// `import` of `.rhai` file `module` at `pos` of the importer.
    fn import(&self, module: &Path, pos: Position) -> Result<Shared<Module>, ConfigError> {
        self.loader
            .link(&self.file, module, Link::Import)
            .map_err(|e| e.at(self.location(pos)))?;
        self.loader.module(module).map_err(|e| {
            let e = e.included_from(&self.file);
            if e.location.is_some() {
                e
            } else {
                e.at(self.location(pos))
            }
        })
    }

    /// `path.rhai` (or `path` if it ends in `.rhai`) next to the importer,
    /// if there is something by that name (a directory or a FIFO there is
    /// then refused by the loader, not mistaken for a missing module).
    fn local_file(&self, path: &str) -> Option<PathBuf> {
        let dir = self.file.parent().unwrap_or(Path::new("."));
        let file = if path.ends_with(".rhai") {
            dir.join(path)
        } else {
            dir.join(format!("{path}.rhai"))
        };
        let file = super::loader::normalize(&file);
        std::fs::symlink_metadata(&file).is_ok().then_some(file)
    }
}

/// Resolves `import` paths for config scripts.
pub struct ModuleResolver {
    importer: Option<Importer>,
}

impl ModuleResolver {
    /// A resolver for `importer`'s script: local `.rhai` files, then presets.
    pub(super) fn new(importer: Importer) -> ModuleResolver {
        ModuleResolver {
            importer: Some(importer),
        }
    }

    /// A resolver that knows only the shipped presets (for scripts that are
    /// not a config file's body, such as a `_base_` expression).
    pub fn presets_only() -> ModuleResolver {
        ModuleResolver { importer: None }
    }
}

impl rhai::ModuleResolver for ModuleResolver {
    fn resolve(
        &self,
        engine: &Engine,
        _source: Option<&str>,
        path: &str,
        pos: Position,
    ) -> Result<Shared<Module>, Box<EvalAltResult>> {
        if let Some(importer) = &self.importer {
            if let Some(file) = importer.local_file(path) {
                return importer
                    .import(&file, pos)
                    .map_err(|e| Box::new(EvalAltResult::ErrorRuntime(Dynamic::from(e), pos)));
            }
        }
        match presets::source_of(path) {
            Some((name, source)) => presets::compile_module(engine, source, name)
                .map(Shared::new)
                .map_err(|e| Box::new(EvalAltResult::ErrorInModule(path.to_string(), e, pos))),
            None => Err(Box::new(EvalAltResult::ErrorModuleNotFound(
                path.to_string(),
                pos,
            ))),
        }
    }
}
