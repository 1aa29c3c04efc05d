//! Translation of Python config files into Rhai.
//!
//! The file is parsed by a real Python parser (`rustpython-parser`); its
//! statements are translated one Rhai line each (so an evaluation error maps
//! back to the Python statement) and every operator becomes a `py_*` call that
//! keeps Python's semantics (see [`super::pyops`]). Python is never executed.
//!
//! Supported: what MMSeg configs use and what `SYNTAX.md` lists: assignments,
//! `dict(...)`, list/tuple/dict literals, list/dict comprehensions (nested
//! `for`, tuple targets, `if`), f-strings, arithmetic, comparisons, `and`/`or`/
//! `not`, conditional expressions, subscripts and slices, `.update(...)`, the
//! builtins in [`super::pyops::BUILTINS`]. New-style (`with read_base():`)
//! files also take lazy imports, attribute and item assignment and `del`
//! ([`lazy`]). Anything else (imports in old-style files, `def`, `lambda`,
//! `if`/`for` statements, ...) is an error that names the construct and its
//! line.
//!
//! This file holds the module level and the statements; `expressions.rs`
//! the expressions, `calls.rs` the calls and methods.

use super::error::{ConfigError, ErrorKind, Location, Result};
use super::eval::mangle;
use super::pyops::BUILTINS;
use rustpython_parser::ast::{self, Constant, Expr, Ranged, Stmt};
use rustpython_parser::Parse;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;

mod calls;
mod expressions;
pub mod lazy;

/// The Python name through which a config reads its bases.
pub const BASE_KEY: &str = "_base_";

/// A translated Python config: one Rhai line per kept Python statement.
#[derive(Debug, Clone)]
pub struct Translation {
    pub script: String,
    /// Byte offset in the Python source of the statement on each Rhai line.
    pub line_offsets: Vec<usize>,
}

/// Parses Python source, reporting syntax errors at `file:line:column`.
pub fn parse(path: &Path, source: &str) -> Result<Vec<Stmt>> {
    ast::Suite::parse(source, &path.display().to_string()).map_err(|e| {
        let offset = usize::from(e.offset);
        let message = e.error.to_string();
        ConfigError::new(ErrorKind::Syntax, format!("Python syntax error: {message}"))
            .at(Location::from_offset(path, source, offset))
    })
}

/// The value expression of the first top-level `_base_ = ...`, as MMEngine
/// finds it (`_get_base_files`).
pub fn base_expression(stmts: &[Stmt]) -> Option<&Expr> {
    stmts.iter().find_map(|s| match s {
        Stmt::Assign(a) if is_base_target(&a.targets[0]) => Some(a.value.as_ref()),
        _ => None,
    })
}

fn is_base_target(e: &Expr) -> bool {
    matches!(e, Expr::Name(n) if n.id.as_str() == BASE_KEY)
}

/// Translates a whole module (every `_base_ = ...` statement dropped, as
/// MMEngine's `RemoveAssignFromAST` does).
pub fn translate_module(path: &Path, source: &str, stmts: &[Stmt]) -> Result<Translation> {
    translate_statements(Translator::new(path, source), stmts)
}

/// Translates a new-style (`with read_base():`) module whose bases bound
/// `prebound` (every one a `ConfigDict` or a lazy object) before it runs.
pub fn translate_new_style(
    path: &Path,
    source: &str,
    stmts: &[Stmt],
    prebound: &[String],
) -> Result<(Translation, lazy::NewStyleNames)> {
    let mut t = Translator::new(path, source);
    t.bound.extend(prebound.iter().cloned());
    t.new_style = Some(lazy::NewStyle {
        config_dicts: prebound.iter().cloned().collect(),
        ..lazy::NewStyle::default()
    });
    let mut names = lazy::NewStyleNames::default();
    let translation = translate_statements_with(&mut t, stmts)?;
    if let Some(state) = t.new_style.take() {
        names = state.names;
    }
    Ok((translation, names))
}

fn translate_statements(mut t: Translator<'_>, stmts: &[Stmt]) -> Result<Translation> {
    translate_statements_with(&mut t, stmts)
}

fn translate_statements_with(t: &mut Translator<'_>, stmts: &[Stmt]) -> Result<Translation> {
    if let Some(stmt) = stmts.get(MAX_STATEMENTS) {
        return Err(ConfigError::new(
            ErrorKind::Limit,
            format!(
                "the config has more than {MAX_STATEMENTS} top-level statements \
                 (MMSeg's configs have a few dozen)"
            ),
        )
        .at(t.location(stmt)));
    }
    let mut script = String::new();
    let mut line_offsets = Vec::new();
    for stmt in stmts {
        if let Some(line) = t.statement(stmt)? {
            debug_assert!(!line.contains('\n'));
            script.push_str(&line);
            script.push('\n');
            line_offsets.push(usize::from(stmt.start()));
        }
    }
    Ok(Translation {
        script,
        line_offsets,
    })
}

/// Translates one expression on its own (MMEngine evaluates the `_base_`
/// value with no names in scope).
pub fn translate_expression(path: &Path, source: &str, expr: &Expr) -> Result<String> {
    Translator::new(path, source).expr(expr)
}

struct Translator<'a> {
    path: &'a Path,
    source: &'a str,
    /// Top-level names bound so far (first binding uses `let`).
    bound: HashSet<String>,
    /// Names whose object is also reachable from another binding.
    stored: HashSet<String>,
    /// Names whose value holds objects of other bindings.
    holders: HashSet<String>,
    next_temp: usize,
    /// How deep [`Translator::expr`] is nested now.
    depth: usize,
    /// Set for a new-style (`with read_base():`) file.
    new_style: Option<lazy::NewStyle>,
}

/// Expressions nested deeper than this (`1 + 1 + ...` of 200 terms, a list
/// in a list 200 times) are refused: no config needs them, and each level
/// costs stack in the translator and in Rhai.
pub const MAX_EXPR_NESTING: usize = 100;

/// Rhai nesting levels that one level of Python nesting may become once
/// translated: a comprehension's element sits in a block, a `for`, a block,
/// a statement and a call; an `and` in a block, a `let` and an `if`. A
/// translated file is compiled with Rhai's expression-depth limit at
/// [`TRANSLATED_EXPR_DEPTH`], so that a config meets the translator's
/// bound (a clear message naming the nesting) and never Rhai's (a unit test
/// in `prepare.rs` compiles every construct at the deepest nesting the
/// translator allows; 6 levels suffice today, 16 leave room for new
/// constructs, and cost nothing until a config nests that deep).
pub const RHAI_LEVELS_PER_NESTING: usize = 16;

/// Rhai's expression-depth limit for translated Python (see
/// [`RHAI_LEVELS_PER_NESTING`]); the statement around the expression
/// takes a few levels too.
pub const TRANSLATED_EXPR_DEPTH: usize = RHAI_LEVELS_PER_NESTING * (MAX_EXPR_NESTING + 2);

/// Top-level statements and items of one dict or list display beyond this
/// are refused: the evaluator looks names up in a scope that grows with
/// each binding, so a generated config of 100 000 assignments would take
/// minutes; MMSeg's largest has under 100.
pub const MAX_STATEMENTS: usize = 5_000;

/// Rhai string literal for `s`.
pub fn rhai_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Rhai literal for a float (Rhai has no literal for inf/nan).
pub fn rhai_float(f: f64) -> String {
    if f.is_finite() {
        format!("{f:?}")
    } else {
        let text = if f.is_nan() {
            "nan"
        } else if f > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        format!("py_call(\"float\", [\"{text}\"])")
    }
}

impl<'a> Translator<'a> {
    fn new(path: &'a Path, source: &'a str) -> Translator<'a> {
        Translator {
            path,
            source,
            bound: HashSet::new(),
            stored: HashSet::new(),
            holders: HashSet::new(),
            next_temp: 0,
            depth: 0,
            new_style: None,
        }
    }

    fn temp(&mut self, prefix: &str) -> String {
        self.next_temp += 1;
        format!("__{prefix}{}", self.next_temp)
    }

    fn unsupported(&self, node: &impl Ranged, what: &str, help: &str) -> ConfigError {
        ConfigError::new(
            ErrorKind::Unsupported,
            format!("unsupported Python construct: {what}"),
        )
        .at(Location::from_offset(
            self.path,
            self.source,
            usize::from(node.start()),
        ))
        .with_help(help.to_string())
    }

    fn statement(&mut self, stmt: &Stmt) -> Result<Option<String>> {
        if let Some(done) = self.new_style_statement(stmt) {
            return done;
        }
        const NO_EXEC: &str = "segtune reads configs without executing Python: a config may only \
             bind names to values (`x = ...`) and call `.update(...)` on a dict";
        match stmt {
            Stmt::Assign(a) => {
                if is_base_target(&a.targets[0]) {
                    return Ok(None);
                }
                if let Some(t) = a.targets.iter().find(|t| is_base_target(t)) {
                    return Err(self.unsupported(t, "`_base_` as a second assignment target", "bind `_base_` in a statement of its own"));
                }
                self.assignment(&a.targets, &a.value).map(Some)
            }
            Stmt::AnnAssign(a) => match &a.value {
                Some(v) => self.assignment(std::slice::from_ref(&*a.target), v).map(Some),
                None => Ok(None),
            },
            Stmt::AugAssign(a) => {
                let Expr::Name(name) = a.target.as_ref() else {
                    return Err(self.unsupported(&*a.target, "augmented assignment to an attribute or item", NO_EXEC));
                };
                let func = binop_fn(&a.op).ok_or_else(|| self.unsupported(stmt, "this augmented operator", NO_EXEC))?;
                let var = mangle(name.id.as_str());
                let value = self.expr(&a.value)?;
                if !self.bound.contains(name.id.as_str()) {
                    return Err(ConfigError::new(
                        ErrorKind::Evaluation,
                        format!("NameError: name '{}' is not defined", name.id),
                    )
                    .at(self.location(stmt)));
                }
                Ok(Some(format!("{var} = {func}({var}, {value});")))
            }
            Stmt::Expr(e) => {
                if matches!(e.value.as_ref(), Expr::Constant(_)) {
                    return Ok(None); // a docstring
                }
                let code = self.expr(&e.value)?;
                Ok(Some(format!("{code};")))
            }
            Stmt::Pass(_) => Ok(None),
            Stmt::Import(_) | Stmt::ImportFrom(_) => Err(self.unsupported(
                stmt,
                "`import`",
                "segtune never executes Python, so imports cannot run; name plugin modules with \
                 `custom_imports = dict(imports=[...])`, which is kept as a value",
            )),
            Stmt::With(_) => Err(self.unsupported(
                stmt,
                "`with` (new-style `with read_base():` configs)",
                "write the config in the old style: `_base_ = [...]` and plain assignments",
            )),
            Stmt::FunctionDef(_) | Stmt::AsyncFunctionDef(_) => Err(self.unsupported(stmt, "`def`", NO_EXEC)),
            Stmt::ClassDef(_) => Err(self.unsupported(stmt, "`class`", NO_EXEC)),
            Stmt::If(_) => Err(self.unsupported(stmt, "`if` statement", "use a conditional expression `a if cond else b`")),
            Stmt::For(_) | Stmt::AsyncFor(_) => Err(self.unsupported(stmt, "`for` statement", "build the value with a comprehension")),
            Stmt::While(_) => Err(self.unsupported(stmt, "`while` statement", NO_EXEC)),
            Stmt::Delete(_) => Err(self.unsupported(stmt, "`del`", "MMEngine cannot delete an inherited key either; replace a dict with `_delete_=True`")),
            _ => Err(self.unsupported(stmt, &format!("`{}` statement", stmt_name(stmt)), NO_EXEC)),
        }
    }

    fn location(&self, node: &impl Ranged) -> Location {
        Location::from_offset(self.path, self.source, usize::from(node.start()))
    }

    fn assignment(&mut self, targets: &[Expr], value: &Expr) -> Result<String> {
        let code = self.expr(value)?;
        let mut names = Vec::new();
        for target in targets {
            self.target_names(target, &mut names)?;
        }
        self.note_aliases(&names, value);
        for name in &names {
            self.note_new_style_binding(name, value);
        }
        if let [Expr::Name(n)] = targets {
            return Ok(self.bind(n.id.as_str(), &code));
        }
        // Several targets or unpacking: declare new names first (their
        // namespace position is this statement), then assign in a block.
        let mut out = String::new();
        for name in &names {
            if self.bound.insert(name.clone()) {
                let _ = write!(out, "let {} = ();", mangle(name));
            }
        }
        let tmp = self.temp("t");
        let _ = write!(out, "{{ let {tmp} = {code};");
        for target in targets {
            out.push_str(&self.unpack_into(target, &tmp, false)?);
        }
        out.push('}');
        Ok(out)
    }

    fn bind(&mut self, name: &str, code: &str) -> String {
        let var = mangle(name);
        if self.bound.insert(name.to_string()) {
            format!("let {var} = {code};")
        } else {
            format!("{var} = {code};")
        }
    }

    fn target_names(&self, target: &Expr, out: &mut Vec<String>) -> Result<()> {
        match target {
            Expr::Name(n) => {
                out.push(n.id.to_string());
                Ok(())
            }
            Expr::Tuple(t) => t.elts.iter().try_for_each(|e| self.target_names(e, out)),
            Expr::List(l) => l.elts.iter().try_for_each(|e| self.target_names(e, out)),
            Expr::Attribute(_) | Expr::Subscript(_) => Err(self.unsupported(
                target,
                "assignment to an attribute or item",
                "segtune evaluates configs with value semantics; write the dict with its final \
                 values, or override the key in a child config with `key=dict(...)`; or let \
                 MMEngine write the config resolved and search that: `python -c \"from \
                 mmengine.config import Config; Config.fromfile('CONFIG').dump('resolved.py')\"`",
            )),
            _ => Err(self.unsupported(target, "this assignment target", "assign to a plain name")),
        }
    }

    /// Emits assignments of `source` (a Rhai variable) to `target`; inside
    /// comprehensions (`local`) names are declared with `let`.
    fn unpack_into(&mut self, target: &Expr, source: &str, local: bool) -> Result<String> {
        match target {
            Expr::Name(n) => Ok(if local {
                format!("let {} = {source};", mangle(n.id.as_str()))
            } else {
                format!("{} = {source};", mangle(n.id.as_str()))
            }),
            Expr::Tuple(ast::ExprTuple { elts, .. }) | Expr::List(ast::ExprList { elts, .. }) => {
                let tmp = self.temp("u");
                let mut out = format!("let {tmp} = py_unpack({source}, {});", elts.len());
                for (i, e) in elts.iter().enumerate() {
                    out.push_str(&self.unpack_into(e, &format!("{tmp}[{i}]"), local)?);
                }
                Ok(out)
            }
            _ => Err(self.unpack_error(target)),
        }
    }

    fn unpack_error(&self, target: &Expr) -> ConfigError {
        self.unsupported(
            target,
            "this loop or assignment target",
            "use plain names or tuples of names",
        )
    }

    /// Records which names now share objects, so that a later in-place
    /// `.update(...)` that Python would make visible through another name is
    /// refused rather than silently evaluated differently.
    fn note_aliases(&mut self, targets: &[String], value: &Expr) {
        if let Some(root) = reference_root(value).filter(|r| !self.is_imported(r)) {
            self.stored.insert(root.to_string());
            self.stored.extend(targets.iter().cloned());
            return;
        }
        let mut roots = Vec::new();
        stored_roots(value, &mut roots);
        // A lazily imported class is never changed in place: sharing it is safe.
        roots.retain(|r| !self.is_imported(r));
        if !roots.is_empty() {
            self.holders.extend(targets.iter().cloned());
            self.stored.extend(roots.into_iter().map(str::to_string));
        }
    }
}

/// The `N` of a literal `-N` (an int).
fn negative_int_literal(e: &Expr) -> Option<&ast::bigint::BigInt> {
    match e {
        Expr::UnaryOp(ast::ExprUnaryOp {
            op: ast::UnaryOp::USub,
            operand,
            ..
        }) => match operand.as_ref() {
            Expr::Constant(ast::ExprConstant {
                value: Constant::Int(i),
                ..
            }) => Some(i),
            _ => None,
        },
        _ => None,
    }
}

fn reference_root(e: &Expr) -> Option<&str> {
    match e {
        Expr::Name(n) => Some(n.id.as_str()),
        Expr::Attribute(a) => reference_root(&a.value),
        Expr::Subscript(s) => reference_root(&s.value),
        _ => None,
    }
}

/// Names whose objects end up inside the value of `e` (not copies).
fn stored_roots<'e>(e: &'e Expr, out: &mut Vec<&'e str>) {
    match e {
        Expr::Name(_) | Expr::Attribute(_) | Expr::Subscript(_) => out.extend(reference_root(e)),
        Expr::List(l) => l.elts.iter().for_each(|x| stored_roots(x, out)),
        Expr::Tuple(t) => t.elts.iter().for_each(|x| stored_roots(x, out)),
        Expr::Dict(d) => d.values.iter().for_each(|x| stored_roots(x, out)),
        Expr::IfExp(i) => {
            stored_roots(&i.body, out);
            stored_roots(&i.orelse, out);
        }
        Expr::BoolOp(b) => b.values.iter().for_each(|x| stored_roots(x, out)),
        Expr::Call(c) => {
            if matches!(c.func.as_ref(), Expr::Name(n) if n.id.as_str() == "dict") {
                c.args.iter().for_each(|x| stored_roots(x, out));
                c.keywords.iter().for_each(|k| stored_roots(&k.value, out));
            }
        }
        _ => {}
    }
}

fn binop_fn(op: &ast::Operator) -> Option<&'static str> {
    Some(match op {
        ast::Operator::Add => "py_add",
        ast::Operator::Sub => "py_sub",
        ast::Operator::Mult => "py_mul",
        ast::Operator::Div => "py_truediv",
        ast::Operator::FloorDiv => "py_floordiv",
        ast::Operator::Mod => "py_mod",
        ast::Operator::Pow => "py_pow",
        _ => return None,
    })
}

fn binop_symbol(op: &ast::Operator) -> &'static str {
    match op {
        ast::Operator::MatMult => "@",
        ast::Operator::LShift => "<<",
        ast::Operator::RShift => ">>",
        ast::Operator::BitOr => "|",
        ast::Operator::BitXor => "^",
        ast::Operator::BitAnd => "&",
        _ => "?",
    }
}

fn cmp_symbol(op: &ast::CmpOp) -> &'static str {
    match op {
        ast::CmpOp::Eq => "==",
        ast::CmpOp::NotEq => "!=",
        ast::CmpOp::Lt => "<",
        ast::CmpOp::LtE => "<=",
        ast::CmpOp::Gt => ">",
        ast::CmpOp::GtE => ">=",
        ast::CmpOp::Is => "is",
        ast::CmpOp::IsNot => "is not",
        ast::CmpOp::In => "in",
        ast::CmpOp::NotIn => "not in",
    }
}

fn stmt_name(s: &Stmt) -> &'static str {
    match s {
        Stmt::Return(_) => "return",
        Stmt::Raise(_) => "raise",
        Stmt::Try(_) | Stmt::TryStar(_) => "try",
        Stmt::Assert(_) => "assert",
        Stmt::Global(_) => "global",
        Stmt::Nonlocal(_) => "nonlocal",
        Stmt::Break(_) => "break",
        Stmt::Continue(_) => "continue",
        Stmt::Match(_) => "match",
        Stmt::TypeAlias(_) => "type",
        Stmt::AsyncWith(_) => "async with",
        _ => "this",
    }
}
