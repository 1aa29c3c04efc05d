//! Python calls in Rhai: builtins, `dict(...)` with keywords, and the
//! methods configs use (`.update(...)` and the like), with the places they
//! mutate.

// The translator's helpers, imports and error types, as in `mod.rs`.
use super::*;

impl Translator<'_> {
    pub(super) fn call(&mut self, node: &Expr, c: &ast::ExprCall) -> Result<String> {
        if c.args.len() + c.keywords.len() > MAX_STATEMENTS {
            return Err(ConfigError::new(
                ErrorKind::Limit,
                format!("this call has more than {MAX_STATEMENTS} arguments"),
            )
            .at(self.location(node)));
        }
        match c.func.as_ref() {
            Expr::Name(n) if n.id.as_str() == "dict" && !self.bound.contains("dict") => {
                self.dict_call(c)
            }
            Expr::Name(n)
                if BUILTINS.contains(&n.id.as_str()) && !self.bound.contains(n.id.as_str()) =>
            {
                let name = n.id.as_str();
                let mut args: Vec<String> =
                    c.args.iter().map(|a| self.expr(a)).collect::<Result<_>>()?;
                for kw in &c.keywords {
                    let allowed = matches!(
                        (name, kw.arg.as_ref().map(|a| a.as_str())),
                        ("enumerate" | "sum", Some("start")) | ("round", Some("ndigits"))
                    );
                    if !allowed || args.len() != 1 {
                        return Err(self.unsupported(
                            kw,
                            &format!("this keyword argument of `{name}()`"),
                            "pass it positionally",
                        ));
                    }
                    args.push(self.expr(&kw.value)?);
                }
                Ok(format!(
                    "py_call({}, [{}])",
                    rhai_string(name),
                    args.join(", ")
                ))
            }
            Expr::Attribute(a) => self.method_call(node, a, c),
            Expr::Name(n) => Err(self.unsupported(
                node,
                &format!("call of `{}`", n.id),
                &format!(
                    "configs may call dict() and the builtins {}",
                    BUILTINS.join(", ")
                ),
            )),
            _ => Err(self.unsupported(
                node,
                "this call",
                "configs may call dict(), builtins and dict/list/str methods",
            )),
        }
    }

    pub(super) fn keyword_map(
        &mut self,
        keywords: &[ast::Keyword],
    ) -> Result<(String, Vec<String>)> {
        let mut named: Vec<(String, String)> = Vec::new();
        let mut spread = Vec::new();
        for kw in keywords {
            let v = self.expr(&kw.value)?;
            match &kw.arg {
                Some(name) => {
                    let k = rhai_string(name.as_str());
                    if named.iter().any(|(n, _)| *n == k) {
                        return Err(ConfigError::new(
                            ErrorKind::Syntax,
                            format!("Python syntax error: keyword argument repeated: {name}"),
                        )
                        .at(self.location(kw)));
                    }
                    named.push((k, v));
                }
                None => spread.push(v),
            }
        }
        let body: Vec<String> = named
            .into_iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        Ok((format!("#{{{}}}", body.join(", ")), spread))
    }

    pub(super) fn dict_call(&mut self, c: &ast::ExprCall) -> Result<String> {
        let positional = self.exprs(&c.args)?;
        let (map, spread) = self.keyword_map(&c.keywords)?;
        Ok(match (c.args.is_empty(), spread.is_empty()) {
            (true, true) => map,
            (_, true) => format!("py_dict([{positional}], {map})"),
            _ => format!(
                "py_dict_chain([py_dict([{positional}], #{{}}), {}, {map}])",
                spread.join(", ")
            ),
        })
    }

    pub(super) fn method_call(
        &mut self,
        node: &Expr,
        a: &ast::ExprAttribute,
        c: &ast::ExprCall,
    ) -> Result<String> {
        let method = a.attr.as_str();
        let mutating = match method {
            "update" => Some("py_update"),
            "append" => Some("py_append"),
            "extend" => Some("py_extend"),
            _ => None,
        };
        let Some(func) = mutating else {
            if !c.keywords.is_empty() {
                return Err(self.unsupported(
                    &c.keywords[0],
                    &format!("keyword arguments to `.{method}()`"),
                    "",
                ));
            }
            let recv = self.expr(&a.value)?;
            return Ok(format!(
                "py_method({recv}, {}, [{}])",
                rhai_string(method),
                self.exprs(&c.args)?
            ));
        };
        let (place, root, depth) = self.place(&a.value)?;
        if self.stored.contains(root) || (depth > 0 && self.holders.contains(root)) {
            return Err(self.unsupported(
                node,
                &format!("`.{method}(...)` on `{root}`, whose object another name also refers to"),
                "Python would change both names; segtune evaluates configs with value semantics. \
                 Finish building the value before it is used elsewhere",
            ));
        }
        if !self.bound.contains(root) && root != BASE_KEY {
            return Err(ConfigError::new(
                ErrorKind::Evaluation,
                format!("NameError: name '{root}' is not defined"),
            )
            .at(self.location(node)));
        }
        if method == "update" {
            let func = if self.is_config_dict(&a.value) {
                "py_update_deep"
            } else {
                func
            };
            if self.new_style.is_some() {
                // A `ConfigDict` keeps a `ConfigDict` argument by reference.
                let mut roots = Vec::new();
                c.args.iter().for_each(|x| stored_roots(x, &mut roots));
                c.keywords
                    .iter()
                    .for_each(|k| stored_roots(&k.value, &mut roots));
                roots.retain(|r| !self.is_imported(r));
                self.stored.extend(roots.into_iter().map(str::to_string));
            }
            let positional = self.exprs(&c.args)?;
            let (map, spread) = self.keyword_map(&c.keywords)?;
            let positional = if spread.is_empty() {
                positional
            } else {
                let pos = if positional.is_empty() {
                    String::new()
                } else {
                    format!("py_dict([{positional}], #{{}}), ")
                };
                format!("py_dict_chain([{pos}{}])", spread.join(", "))
            };
            Ok(format!("{place}.{func}([{positional}], {map})"))
        } else {
            if c.args.len() != 1 || !c.keywords.is_empty() {
                return Err(self.unsupported(
                    node,
                    &format!("`.{method}()` with other than one argument"),
                    "",
                ));
            }
            Ok(format!("{place}.{func}({})", self.expr(&c.args[0])?))
        }
    }

    /// A Rhai place expression (something Rhai can mutate in place) for a
    /// chain of names, attributes and constant subscripts; also returns the
    /// chain's root name and its depth.
    pub(super) fn place<'e>(&mut self, e: &'e Expr) -> Result<(String, &'e str, usize)> {
        match e {
            Expr::Name(n) => Ok((mangle(n.id.as_str()), n.id.as_str(), 0)),
            Expr::Attribute(a) => {
                let (inner, root, depth) = self.place(&a.value)?;
                Ok((
                    format!("{inner}[{}]", rhai_string(a.attr.as_str())),
                    root,
                    depth + 1,
                ))
            }
            Expr::Subscript(s) => {
                let index = match s.slice.as_ref() {
                    Expr::Constant(ast::ExprConstant {
                        value: Constant::Str(k),
                        ..
                    }) => rhai_string(k),
                    Expr::Constant(ast::ExprConstant {
                        value: Constant::Int(i),
                        ..
                    }) => i.to_string(),
                    other if negative_int_literal(other).is_some() => {
                        format!("-{}", negative_int_literal(other).expect("checked"))
                    }
                    other => {
                        return Err(self.unsupported(
                            other,
                            "a computed index in front of a mutating method",
                            "",
                        ))
                    }
                };
                let (inner, root, depth) = self.place(&s.value)?;
                Ok((format!("{inner}[{index}]"), root, depth + 1))
            }
            other => Err(self.unsupported(other, "a mutating method on a temporary value", "")),
        }
    }
}
