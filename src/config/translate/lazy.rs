//! MMEngine's new-style ("lazy import") Python configs, as
//! `Config._is_lazy_import`, `Config._get_base_modules`,
//! `ImportTransformer` and `_gather_abs_import_lazyobj` read them
//! (mmengine 0.10.7, `../shared/mmseg-configs/SPEC.md` §10): which files are
//! new style, the bases named under `with read_base():`, and the
//! statements only they use: imports that become lazy objects, attribute
//! assignment on the `ConfigDict`s the bases give, and `del`.
//!
//! A lazy object (`from mmseg.models import EncoderDecoder`) is carried as
//! a string marked with [`LAZY_MARK`] and its dotted path; the loader turns
//! each one left in the resolved config into the name MMSeg's registries
//! know the class by ([`registered_name`]).

use super::*;

/// Prefix of the string that stands for a lazily imported object.
pub const LAZY_MARK: &str = "\u{1}lazy:";

/// How to turn a new-style config into an old-style one MMEngine loads
/// the same way.
pub const CONVERT_HELP: &str = "or convert the config to the old style with MMEngine: \
     `python -c \"from mmengine import Config; Config.fromfile('CONFIG').dump('old_style.py')\"`";

/// The packages that are OpenMMLab codebases with a registry scope of
/// their own: a class imported from one of them is found from MMSeg's
/// scope as `scope.Name` (as old-style configs write `mmdet.HungarianAssigner`).
const OTHER_SCOPES: &[&str] = &[
    "mmdet",
    "mmpretrain",
    "mmcls",
    "mmdet3d",
    "mmocr",
    "mmpose",
    "mmaction",
    "mmagic",
    "mmedit",
    "mmrotate",
    "mmyolo",
    "mmselfsup",
    "mmrazor",
    "mmtrack",
    "mmflow",
];

/// Standard-library modules a config might import: MMEngine imports them
/// for real (`_is_builtin_module`), which segtune cannot do.
const STDLIB: &[&str] = &[
    "os",
    "sys",
    "math",
    "copy",
    "json",
    "re",
    "random",
    "functools",
    "itertools",
    "collections",
    "pathlib",
    "typing",
    "warnings",
    "platform",
    "datetime",
    "time",
    "string",
    "operator",
];

/// The name a lazily imported class is registered under, seen from MMSeg's
/// registries: the class name, prefixed with its codebase's scope when
/// that is another OpenMMLab codebase (`mmdet.models.losses.FocalLoss` ->
/// `mmdet.FocalLoss`); torch, MMEngine, MMCV and MMSeg classes (and a
/// user's own, registered into MMSeg's registries) by their name alone.
pub fn registered_name(dotted: &str) -> String {
    let root = dotted.split('.').next().unwrap_or(dotted);
    let name = dotted.rsplit('.').next().unwrap_or(dotted);
    if root == dotted {
        return name.to_string();
    }
    if OTHER_SCOPES.contains(&root) {
        return format!("{root}.{name}");
    }
    if root == "mmengine" {
        if let Some((_, registered)) = WEIGHT_INITS.iter().find(|(class, _)| *class == name) {
            return (*registered).to_string();
        }
    }
    if matches!(root, "mmcv" | "mmengine") && SHADOWED_BY_MMSEG.contains(&name) {
        return format!("mmengine.{name}");
    }
    name.to_string()
}

/// MMEngine's weight initialisers, registered under shorter names
/// (`@WEIGHT_INITIALIZERS.register_module(name='Pretrained')`).
const WEIGHT_INITS: &[(&str, &str)] = &[
    ("ConstantInit", "Constant"),
    ("XavierInit", "Xavier"),
    ("NormalInit", "Normal"),
    ("TruncNormalInit", "TruncNormal"),
    ("UniformInit", "Uniform"),
    ("KaimingInit", "Kaiming"),
    ("Caffe2XavierInit", "Caffe2Xavier"),
    ("PretrainedInit", "Pretrained"),
];

/// MMCV transforms whose names MMSeg 1.2.2 registers again for classes of
/// its own: MMCV's class is found from MMSeg's scope only as
/// `mmengine.Name` (the registry MMCV registers its transforms in).
const SHADOWED_BY_MMSEG: &[&str] = &["LoadAnnotations", "RandomFlip", "Resize"];

fn is_builtin_module(module: &str) -> bool {
    if module.starts_with('.') {
        return false;
    }
    module.starts_with("mmengine.config")
        || STDLIB.contains(&module.split('.').next().unwrap_or(module))
}

/// `Config._is_lazy_import`: the first of these met walking the statements
/// breadth first decides: `_base_ = ...` (old style), a `with` (new style;
/// it must be `read_base()`), a relative `from . import` or an import of a
/// module outside the standard library (new style).
pub fn is_new_style(path: &Path, source: &str, stmts: &[Stmt]) -> Result<bool> {
    let mut queue: std::collections::VecDeque<&Stmt> = stmts.iter().collect();
    while let Some(stmt) = queue.pop_front() {
        match stmt {
            Stmt::Assign(a) if is_base_target(&a.targets[0]) => return Ok(false),
            Stmt::With(w) => {
                if !is_read_base(w) {
                    return Err(with_error(path, source, stmt));
                }
                return Ok(true);
            }
            Stmt::ImportFrom(i) => {
                let level = i.level.map_or(0, |l| l.to_u32());
                if level > 0 {
                    return Ok(true);
                }
                let Some(module) = &i.module else { continue };
                let only_config = module.as_str() == "mmengine"
                    && i.names.len() == 1
                    && i.names[0].name.as_str() == "Config";
                if !only_config && !is_builtin_module(module) {
                    return Ok(true);
                }
            }
            Stmt::Import(i) if i.names.iter().any(|a| !is_builtin_module(&a.name)) => {
                return Ok(true);
            }
            _ => {}
        }
        queue.extend(child_statements(stmt));
    }
    Ok(false)
}

fn child_statements(stmt: &Stmt) -> Vec<&Stmt> {
    match stmt {
        Stmt::If(s) => s.body.iter().chain(&s.orelse).collect(),
        Stmt::For(s) => s.body.iter().chain(&s.orelse).collect(),
        Stmt::While(s) => s.body.iter().chain(&s.orelse).collect(),
        Stmt::With(s) => s.body.iter().collect(),
        Stmt::FunctionDef(s) => s.body.iter().collect(),
        Stmt::ClassDef(s) => s.body.iter().collect(),
        Stmt::Try(s) => s.body.iter().chain(&s.orelse).chain(&s.finalbody).collect(),
        _ => Vec::new(),
    }
}

fn is_read_base(w: &ast::StmtWith) -> bool {
    w.items.len() == 1
        && matches!(&w.items[0].context_expr, Expr::Call(c)
            if matches!(c.func.as_ref(), Expr::Name(n) if n.id.as_str() == "read_base"))
}

fn with_error(path: &Path, source: &str, stmt: &Stmt) -> ConfigError {
    ConfigError::new(
        ErrorKind::Syntax,
        "ConfigParsingError: Only `read_base` context manager can be used in the config",
    )
    .at(Location::from_offset(
        path,
        source,
        usize::from(stmt.start()),
    ))
}

/// One `from <module> import ...` under `with read_base():`.
#[derive(Debug, Clone)]
pub struct BaseImport {
    /// As written: leading dots for a relative module.
    pub module: String,
    /// `(name, as)`; `("*", None)` imports every name.
    pub names: Vec<(String, Option<String>)>,
    pub location: Location,
}

/// `Config._get_base_modules`: the bases, in order, with MMEngine's
/// refusals (`_base_ = ...` in a new-style file, a `with` other than
/// `read_base()`, anything but `from ... import ...` inside it).
pub fn base_imports(path: &Path, source: &str, stmts: &[Stmt]) -> Result<Vec<BaseImport>> {
    let at = |node: &dyn Ranged| Location::from_offset(path, source, usize::from(node.start()));
    let mut out = Vec::new();
    for stmt in stmts {
        match stmt {
            Stmt::Assign(a) if is_base_target(&a.targets[0]) => {
                return Err(ConfigError::new(
                    ErrorKind::Syntax,
                    "ConfigParsingError: the configuration file type in the inheritance chain \
                     must match: this file uses `with read_base():` (new style) and `_base_ = ...` \
                     (old style)",
                )
                .at(at(stmt))
                .with_help(
                    "mark the inherited files with `with read_base(): from ... import *` only",
                ));
            }
            Stmt::With(w) => {
                if !is_read_base(w) {
                    return Err(with_error(path, source, stmt));
                }
                for inner in &w.body {
                    let Stmt::ImportFrom(i) = inner else {
                        return Err(ConfigError::new(
                            ErrorKind::Syntax,
                            "Illegal syntax in config file! Only `from ... import ...` could be \
                             implemented in `with read_base()`",
                        )
                        .at(at(inner)));
                    };
                    let Some(module) = &i.module else {
                        return Err(ConfigError::new(
                            ErrorKind::Syntax,
                            "Illegal syntax in config file! Syntax like `from . import xxx` is \
                             not allowed in `with read_base()`",
                        )
                        .at(at(inner)));
                    };
                    let level = i.level.map_or(0, |l| l.to_u32()) as usize;
                    out.push(BaseImport {
                        module: format!("{}{module}", ".".repeat(level)),
                        names: i
                            .names
                            .iter()
                            .map(|a| (a.name.to_string(), a.asname.as_ref().map(|s| s.to_string())))
                            .collect(),
                        location: at(inner),
                    });
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// What a translated new-style file leaves for the loader besides its
/// script.
#[derive(Debug, Clone, Default)]
pub struct NewStyleNames {
    /// Names bound to lazily imported objects (left out of the resolved
    /// config, as `Config.to_dict()` leaves them out).
    pub imported: Vec<String>,
    /// Names the file `del`eted and did not bind again.
    pub deleted: Vec<String>,
}

/// What the translator knows of the names of a new-style file.
#[derive(Debug, Default)]
pub(super) struct NewStyle {
    pub(super) names: NewStyleNames,
    /// Names bound to a `ConfigDict` (every dict a base gives is one; so is
    /// every dict reached through one): `.update` merges recursively, and
    /// attributes read and set its keys.
    pub(super) config_dicts: HashSet<String>,
    /// Names bound in this file to a plain `dict` (a display or `dict()`):
    /// attributes on it are an AttributeError, as in Python.
    pub(super) plain_dicts: HashSet<String>,
}

impl Translator<'_> {
    /// A statement only new-style files have; `None` when `stmt` is an
    /// ordinary one.
    pub(super) fn new_style_statement(&mut self, stmt: &Stmt) -> Option<Result<Option<String>>> {
        self.new_style.as_ref()?;
        Some(match stmt {
            // The bases are bound before the file runs (the loader reads them).
            Stmt::With(_) => Ok(None),
            Stmt::ImportFrom(i) => self.lazy_import_from(stmt, i),
            Stmt::Import(i) => self.lazy_import(stmt, i),
            Stmt::Delete(d) => self.delete(stmt, d),
            Stmt::Assign(a)
                if a.targets.len() == 1
                    && matches!(&a.targets[0], Expr::Attribute(_) | Expr::Subscript(_)) =>
            {
                self.item_assignment(stmt, &a.targets[0], &a.value)
            }
            _ => return None,
        })
    }

    fn lazy_import_from(&mut self, stmt: &Stmt, i: &ast::StmtImportFrom) -> Result<Option<String>> {
        let level = i.level.map_or(0, |l| l.to_u32()) as usize;
        let module = format!("{}{}", ".".repeat(level), i.module.as_deref().unwrap_or(""));
        if module.starts_with("mmengine.config") {
            return Ok(None); // `read_base`, `Config`: MMEngine's own, never values
        }
        if level > 0 {
            return Err(self.unsupported(
                stmt,
                "a relative import outside `with read_base():`",
                "import base configs inside `with read_base():`",
            ));
        }
        if is_builtin_module(&module) {
            return Err(self.unsupported(
                stmt,
                &format!("importing the standard library (`{module}`)"),
                &format!("MMEngine runs this import; segtune never executes Python: write the values themselves, {CONVERT_HELP}"),
            ));
        }
        let mut out = String::new();
        for alias in &i.names {
            if alias.name.as_str() == "*" {
                return Err(ConfigError::new(
                    ErrorKind::Syntax,
                    "ConfigParsingError: Illegal syntax in config! `from xxx import *` is not \
                     allowed to appear outside the `if base:` statement",
                )
                .at(self.location(stmt)));
            }
            let name = alias.asname.as_ref().unwrap_or(&alias.name).to_string();
            let dotted = format!("{module}.{}", alias.name);
            out.push_str(&self.bind_lazy(&name, &dotted));
        }
        Ok(Some(out))
    }

    fn lazy_import(&mut self, stmt: &Stmt, i: &ast::StmtImport) -> Result<Option<String>> {
        if i.names.len() != 1 {
            return Err(ConfigError::new(
                ErrorKind::Syntax,
                "Illegal syntax in config! import multiple modules in one line is not supported",
            )
            .at(self.location(stmt)));
        }
        let alias = &i.names[0];
        if is_builtin_module(&alias.name) {
            return Err(self.unsupported(
                stmt,
                &format!("importing the standard library (`{}`)", alias.name),
                &format!("MMEngine runs this import; segtune never executes Python: write the values themselves, {CONVERT_HELP}"),
            ));
        }
        Ok(Some(match &alias.asname {
            Some(as_name) => self.bind_lazy(as_name, &alias.name),
            // `import a.b` binds `a`; `a.b.C` then reads through it.
            None => {
                let root = alias.name.split('.').next().unwrap_or(&alias.name);
                self.bind_lazy(root, root)
            }
        }))
    }

    fn bind_lazy(&mut self, name: &str, dotted: &str) -> String {
        let state = self.new_style.as_mut().expect("new style");
        if !state.names.imported.iter().any(|n| n == name) {
            state.names.imported.push(name.to_string());
        }
        state.names.deleted.retain(|n| n != name);
        state.config_dicts.remove(name);
        state.plain_dicts.remove(name);
        self.bind(name, &rhai_string(&format!("{LAZY_MARK}{dotted}")))
    }

    fn delete(&mut self, stmt: &Stmt, d: &ast::StmtDelete) -> Result<Option<String>> {
        let mut out = String::new();
        for target in &d.targets {
            let Expr::Name(n) = target else {
                return Err(self.unsupported(
                    target,
                    "`del` of an item or attribute",
                    &format!("delete whole top-level names only, {CONVERT_HELP}"),
                ));
            };
            let name = n.id.to_string();
            if !self.bound.remove(&name) {
                return Err(ConfigError::new(
                    ErrorKind::Evaluation,
                    format!("NameError: name '{name}' is not defined"),
                )
                .at(self.location(stmt)));
            }
            let state = self.new_style.as_mut().expect("new style");
            state.names.deleted.push(name.clone());
            state.config_dicts.remove(&name);
            state.plain_dicts.remove(&name);
            // Rebinding later starts a new `let`; until then the name holds nothing.
            let _ = write!(out, "{} = ();", mangle(&name));
        }
        Ok(Some(out))
    }

    /// `a.b.c = v` or `a['b'] = v`: sets the key in place, as Python does
    /// on the `ConfigDict` `a`.
    fn item_assignment(
        &mut self,
        stmt: &Stmt,
        target: &Expr,
        value: &Expr,
    ) -> Result<Option<String>> {
        let code = self.expr(value)?;
        let (place, root, _) = self.place(target)?;
        let root = root.to_string();
        if !self.bound.contains(&root) {
            return Err(ConfigError::new(
                ErrorKind::Evaluation,
                format!("NameError: name '{root}' is not defined"),
            )
            .at(self.location(stmt)));
        }
        if self.stored.contains(&root) || self.holders.contains(&root) {
            return Err(self.unsupported(
                stmt,
                &format!("assignment into `{root}`, whose object another name also refers to"),
                &format!(
                    "Python would change both names; segtune evaluates configs with value \
                     semantics. Finish building the value before it is used elsewhere, {CONVERT_HELP}"
                ),
            ));
        }
        self.check_attributes(target)?;
        let mut roots = Vec::new();
        stored_roots(value, &mut roots);
        roots.retain(|r| !self.is_imported(r));
        self.stored.extend(roots.into_iter().map(str::to_string));
        Ok(Some(format!("{place} = {code};")))
    }

    /// An attribute read or set on a plain `dict` is an AttributeError in
    /// Python (only a `ConfigDict` has its keys as attributes).
    pub(super) fn check_attributes(&self, e: &Expr) -> Result<()> {
        let Some(state) = &self.new_style else {
            return Ok(());
        };
        let mut node = e;
        let mut first_attr = None;
        loop {
            match node {
                Expr::Attribute(a) => {
                    first_attr = Some(a);
                    node = &a.value;
                }
                Expr::Subscript(s) => {
                    first_attr = None;
                    node = &s.value;
                }
                Expr::Name(n) => {
                    if let Some(a) = first_attr {
                        if state.plain_dicts.contains(n.id.as_str()) {
                            return Err(ConfigError::new(
                                ErrorKind::Evaluation,
                                format!(
                                    "AttributeError: 'dict' object has no attribute '{}'",
                                    a.attr
                                ),
                            )
                            .at(self.location(a))
                            .with_help(format!(
                                "`{}` is a plain dict built in this file; write `{}['{}']`",
                                n.id, n.id, a.attr
                            )));
                        }
                    }
                    return Ok(());
                }
                _ => return Ok(()),
            }
        }
    }

    /// Whether `name` is bound to a lazily imported object in this file.
    pub(super) fn is_imported(&self, name: &str) -> bool {
        self.new_style
            .as_ref()
            .is_some_and(|s| s.names.imported.iter().any(|n| n == name))
    }

    /// Records what kind of object an assignment binds `name` to.
    pub(super) fn note_new_style_binding(&mut self, name: &str, value: &Expr) {
        let Some(state) = self.new_style.as_mut() else {
            return;
        };
        // A name imported once stays out of `to_dict()` even when rebound.
        state.names.deleted.retain(|n| n != name);
        state.config_dicts.remove(name);
        state.plain_dicts.remove(name);
        let through_config_dict =
            reference_root(value).is_some_and(|root| state.config_dicts.contains(root));
        let plain = match value {
            Expr::Dict(_) => true,
            Expr::Call(c) => matches!(c.func.as_ref(), Expr::Name(n) if n.id.as_str() == "dict"),
            _ => false,
        };
        if through_config_dict {
            state.config_dicts.insert(name.to_string());
        } else if plain {
            state.plain_dicts.insert(name.to_string());
        }
    }

    /// Whether `.update` on `e` merges recursively: `e` is a `ConfigDict`
    /// (addict's `update`).
    pub(super) fn is_config_dict(&self, e: &Expr) -> bool {
        self.new_style
            .as_ref()
            .is_some_and(|s| reference_root(e).is_some_and(|r| s.config_dicts.contains(r)))
    }
}
