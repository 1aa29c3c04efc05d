//! Python expressions in Rhai: names and constants, operators (each a
//! `py_*` call keeping Python's semantics), displays, comprehensions and
//! f-strings.

// The translator's helpers, imports and error types, as in `mod.rs`.
use super::*;

impl Translator<'_> {
    pub(super) fn expr(&mut self, e: &Expr) -> Result<String> {
        self.enter(e)?;
        let out = self.expr_at_depth(e);
        self.depth -= 1;
        out
    }

    /// One level deeper, at `node`: an expression, or a link of a chain
    /// that Rhai nests (`a and b and ...`, `a < b < ...`, a comprehension's
    /// `for`s and `if`s). Past [`MAX_EXPR_NESTING`] levels it is refused.
    /// The caller takes the level back off ([`Translator::depth`]).
    fn enter(&mut self, node: &impl Ranged) -> Result<()> {
        if self.depth >= MAX_EXPR_NESTING {
            return Err(ConfigError::new(
                ErrorKind::Limit,
                format!("this expression is nested more than {MAX_EXPR_NESTING} levels deep"),
            )
            .at(self.location(node))
            .with_help("split it into several assignments"));
        }
        self.depth += 1;
        Ok(())
    }

    fn expr_at_depth(&mut self, e: &Expr) -> Result<String> {
        if let Some(i) = negative_int_literal(e) {
            // Parsed as one number so that `-9223372036854775808` does not overflow on the way.
            let v: i64 = format!("-{i}").parse().map_err(|_| {
                ConfigError::new(
                    ErrorKind::Limit,
                    format!("integer -{i} does not fit in 64 bits"),
                )
                .at(self.location(e))
            })?;
            return Ok(if v == i64::MIN {
                format!("({} - 1)", i64::MIN + 1)
            } else {
                format!("({v})")
            });
        }
        Ok(match e {
            Expr::Constant(c) => self.constant(e, &c.value)?,
            Expr::Name(n) => mangle(n.id.as_str()),
            Expr::List(l) => format!("[{}]", self.exprs(&l.elts)?),
            Expr::Tuple(t) => format!("tuple([{}])", self.exprs(&t.elts)?),
            Expr::Dict(d) => self.dict_display(d)?,
            Expr::BinOp(b) => {
                let func = binop_fn(&b.op).ok_or_else(|| {
                    self.unsupported(
                        e,
                        &format!("the `{}` operator", binop_symbol(&b.op)),
                        "use + - * / // % **",
                    )
                })?;
                format!("{func}({}, {})", self.expr(&b.left)?, self.expr(&b.right)?)
            }
            Expr::UnaryOp(u) => {
                let func = match u.op {
                    ast::UnaryOp::Not => "py_not",
                    ast::UnaryOp::USub => "py_neg",
                    ast::UnaryOp::UAdd => "py_pos",
                    ast::UnaryOp::Invert => "py_invert",
                };
                format!("{func}({})", self.expr(&u.operand)?)
            }
            Expr::BoolOp(b) => self.bool_op(&b.op, &b.values)?,
            Expr::Compare(c) => self.compare(c)?,
            Expr::IfExp(i) => format!(
                "if py_truthy({}) {{ {} }} else {{ {} }}",
                self.expr(&i.test)?,
                self.expr(&i.body)?,
                self.expr(&i.orelse)?
            ),
            Expr::Call(c) => self.call(e, c)?,
            Expr::Attribute(a) => {
                self.check_attributes(e)?;
                format!(
                    "py_getattr({}, {})",
                    self.expr(&a.value)?,
                    rhai_string(a.attr.as_str())
                )
            }
            Expr::Subscript(s) => match s.slice.as_ref() {
                Expr::Slice(sl) => {
                    let bound = |t: &mut Self, b: &Option<Box<Expr>>| -> Result<String> {
                        b.as_deref().map_or(Ok("()".to_string()), |x| t.expr(x))
                    };
                    let (lo, hi, step) = (
                        bound(self, &sl.lower)?,
                        bound(self, &sl.upper)?,
                        bound(self, &sl.step)?,
                    );
                    format!("py_slice({}, {lo}, {hi}, {step})", self.expr(&s.value)?)
                }
                index => format!(
                    "py_getitem({}, {})",
                    self.expr(&s.value)?,
                    self.expr(index)?
                ),
            },
            Expr::ListComp(c) => {
                let elt = &c.elt;
                self.comprehension(
                    &c.generators,
                    |t, acc| Ok(format!("{acc}.push({});", t.expr(elt)?)),
                    "[]",
                )?
            }
            Expr::GeneratorExp(c) => {
                let elt = &c.elt;
                self.comprehension(
                    &c.generators,
                    |t, acc| Ok(format!("{acc}.push({});", t.expr(elt)?)),
                    "[]",
                )?
            }
            Expr::DictComp(c) => {
                let (key, value) = (&c.key, &c.value);
                self.comprehension(
                    &c.generators,
                    |t, acc| {
                        Ok(format!(
                            "{acc}[py_key({})] = {};",
                            t.expr(key)?,
                            t.expr(value)?
                        ))
                    },
                    "#{}",
                )?
            }
            Expr::JoinedStr(j) => self.fstring(&j.values)?,
            Expr::FormattedValue(f) => self.formatted(f)?,
            Expr::Lambda(_) => {
                return Err(self.unsupported(e, "`lambda`", "configs hold values, not functions"))
            }
            Expr::Set(_) | Expr::SetComp(_) => {
                return Err(self.unsupported(
                    e,
                    "set",
                    "MMEngine configs cannot dump sets; use a list or tuple",
                ))
            }
            Expr::Starred(_) => {
                return Err(self.unsupported(e, "`*` unpacking", "write the items out or use `+`"))
            }
            Expr::NamedExpr(_) => {
                return Err(self.unsupported(e, "`:=`", "bind the value with a plain assignment"))
            }
            Expr::Await(_) | Expr::Yield(_) | Expr::YieldFrom(_) => {
                return Err(self.unsupported(e, "`await`/`yield`", "configs hold values only"))
            }
            Expr::Slice(_) => return Err(self.unsupported(e, "a slice outside `[...]`", "")),
        })
    }

    pub(super) fn exprs(&mut self, items: &[Expr]) -> Result<String> {
        let parts: Vec<String> = items.iter().map(|x| self.expr(x)).collect::<Result<_>>()?;
        Ok(parts.join(", "))
    }

    pub(super) fn constant(&mut self, node: &Expr, c: &Constant) -> Result<String> {
        Ok(match c {
            Constant::None => "()".into(),
            Constant::Bool(b) => b.to_string(),
            Constant::Str(s) => rhai_string(s),
            Constant::Int(i) => {
                let v: i64 = i.to_string().parse().map_err(|_| {
                    ConfigError::new(
                        ErrorKind::Limit,
                        format!("integer {i} does not fit in 64 bits"),
                    )
                    .at(self.location(node))
                })?;
                v.to_string()
            }
            Constant::Float(f) => rhai_float(*f),
            Constant::Tuple(items) => {
                let parts: Vec<String> = items
                    .iter()
                    .map(|x| self.constant(node, x))
                    .collect::<Result<_>>()?;
                format!("tuple([{}])", parts.join(", "))
            }
            Constant::Bytes(_) => return Err(self.unsupported(node, "bytes literal", "use a str")),
            Constant::Complex { .. } => return Err(self.unsupported(node, "complex number", "")),
            Constant::Ellipsis => return Err(self.unsupported(node, "`...`", "")),
        })
    }

    pub(super) fn dict_display(&mut self, d: &ast::ExprDict) -> Result<String> {
        if let Some(value) = d.values.get(MAX_STATEMENTS) {
            return Err(ConfigError::new(
                ErrorKind::Limit,
                format!("this dict has more than {MAX_STATEMENTS} items"),
            )
            .at(self.location(value)));
        }
        let mut parts: Vec<String> = Vec::new();
        let mut literal: Vec<(String, String)> = Vec::new();
        let flush = |literal: &mut Vec<(String, String)>, parts: &mut Vec<String>| {
            if !literal.is_empty() {
                let body: Vec<String> = literal
                    .drain(..)
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect();
                parts.push(format!("#{{{}}}", body.join(", ")));
            }
        };
        for (key, value) in d.keys.iter().zip(&d.values) {
            let v = self.expr(value)?;
            match key {
                Some(Expr::Constant(ast::ExprConstant {
                    value: Constant::Str(k),
                    ..
                })) => {
                    let k = rhai_string(k);
                    // A repeated key: the last value wins, in the first position.
                    if let Some(slot) = literal.iter_mut().find(|(lk, _)| *lk == k) {
                        slot.1 = v;
                    } else {
                        literal.push((k, v));
                    }
                }
                Some(other) => {
                    flush(&mut literal, &mut parts);
                    let k = self.expr(other)?;
                    parts.push(format!(
                        "{{ let __m = #{{}}; __m[py_key({k})] = {v}; __m }}"
                    ));
                }
                None => {
                    flush(&mut literal, &mut parts);
                    parts.push(v);
                }
            }
        }
        flush(&mut literal, &mut parts);
        Ok(match parts.len() {
            0 => "#{}".into(),
            1 if parts[0].starts_with("#{") => parts.pop().unwrap_or_default(),
            _ => format!("py_dict_chain([{}])", parts.join(", ")),
        })
    }

    pub(super) fn bool_op(&mut self, op: &ast::BoolOp, values: &[Expr]) -> Result<String> {
        let (first, rest) = values
            .split_first()
            .expect("a BoolOp has at least two values");
        if rest.is_empty() {
            return self.expr(first);
        }
        let head = self.expr(first)?;
        // The rest goes inside an `if` in Rhai: one level deeper.
        self.enter(&rest[0])?;
        let tail = self.bool_op(op, rest);
        self.depth -= 1;
        let tail = tail?;
        let tmp = self.temp("b");
        Ok(match op {
            ast::BoolOp::And => format!(
                "{{ let {tmp} = {head}; if py_truthy({tmp}) {{ {tail} }} else {{ {tmp} }} }}"
            ),
            ast::BoolOp::Or => format!(
                "{{ let {tmp} = {head}; if py_truthy({tmp}) {{ {tmp} }} else {{ {tail} }} }}"
            ),
        })
    }

    pub(super) fn compare(&mut self, c: &ast::ExprCompare) -> Result<String> {
        let mut out = String::from("{ ");
        let mut left = self.temp("c");
        let _ = write!(out, "let {left} = {}; ", self.expr(&c.left)?);
        let mut closers = 0;
        let outer = self.depth;
        for (i, (op, right)) in c.ops.iter().zip(&c.comparators).enumerate() {
            let r = self.temp("c");
            let _ = write!(out, "let {r} = {}; ", self.expr(right)?);
            let test = format!("py_cmp({}, {left}, {r})", rhai_string(cmp_symbol(op)));
            if i + 1 == c.ops.len() {
                out.push_str(&test);
            } else {
                // The rest of the chain goes inside this `if`.
                self.enter(&c.comparators[i + 1])?;
                let _ = write!(out, "if {test} {{ ");
                closers += 1;
            }
            left = r;
        }
        self.depth = outer;
        for _ in 0..closers {
            out.push_str(" } else { false }");
        }
        out.push_str(" }");
        Ok(out)
    }

    pub(super) fn comprehension(
        &mut self,
        generators: &[ast::Comprehension],
        body: impl FnOnce(&mut Self, &str) -> Result<String>,
        empty: &str,
    ) -> Result<String> {
        let acc = self.temp("acc");
        let mut out = format!("{{ let {acc} = {empty}; ");
        let mut closers = 0;
        let outer = self.depth;
        for g in generators {
            if g.is_async {
                return Err(self.unsupported(&g.iter, "`async for`", ""));
            }
            let iter = self.expr(&g.iter)?;
            // Each `for` and `if` is a Rhai block around what follows.
            self.enter(&g.iter)?;
            match &g.target {
                Expr::Name(n) => {
                    let _ = write!(out, "for {} in py_iter({iter}) {{ ", mangle(n.id.as_str()));
                }
                target @ (Expr::Tuple(_) | Expr::List(_)) => {
                    let item = self.temp("v");
                    let _ = write!(out, "for {item} in py_iter({iter}) {{ ");
                    out.push_str(&self.unpack_into(target, &item, true)?);
                }
                other => return Err(self.unpack_error(other)),
            }
            closers += 1;
            for cond in &g.ifs {
                let _ = write!(out, "if py_truthy({}) {{ ", self.expr(cond)?);
                self.enter(cond)?;
                closers += 1;
            }
        }
        let body = body(self, &acc);
        self.depth = outer;
        out.push_str(&body?);
        out.push_str(&" }".repeat(closers));
        let _ = write!(out, " {acc} }}");
        Ok(out)
    }

    pub(super) fn fstring(&mut self, values: &[Expr]) -> Result<String> {
        let mut parts = Vec::new();
        for v in values {
            parts.push(match v {
                Expr::Constant(ast::ExprConstant {
                    value: Constant::Str(s),
                    ..
                }) => rhai_string(s),
                Expr::FormattedValue(f) => self.formatted(f)?,
                other => self.expr(other)?,
            });
        }
        Ok(format!("py_concat([{}])", parts.join(", ")))
    }

    pub(super) fn formatted(&mut self, f: &ast::ExprFormattedValue) -> Result<String> {
        let conversion = match f.conversion {
            ast::ConversionFlag::None => "",
            ast::ConversionFlag::Str => "s",
            ast::ConversionFlag::Repr => "r",
            ast::ConversionFlag::Ascii => "a",
        };
        let spec = match f.format_spec.as_deref() {
            None => "\"\"".to_string(),
            Some(Expr::JoinedStr(j)) => self.fstring(&j.values)?,
            Some(other) => self.expr(other)?,
        };
        Ok(format!(
            "py_format({}, \"{conversion}\", {spec})",
            self.expr(&f.value)?
        ))
    }
}
