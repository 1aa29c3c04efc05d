//! Why a model cannot be built: an MMSeg `type` segtune has no
//! implementation of, a setting it does not implement, or a config that is
//! malformed.

/// Why a model cannot be built.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelError {
    /// A `type` segtune has no implementation of; `supported` comes from the
    /// role's registry table.
    UnknownType {
        role: &'static str,
        name: String,
        supported: Vec<&'static str>,
    },
    /// Several components of unknown type (each an `UnknownType`), in
    /// MMSeg's build order.
    UnknownTypes(Vec<ModelError>),
    /// A setting segtune does not implement.
    Unsupported(String),
    /// A setting that is missing or of the wrong type.
    Config(String),
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelError::UnknownType {
                role,
                name,
                supported,
            } if supported.is_empty() => write!(
                f,
                "unknown {role} type `{name}`; segtune supports no {role} yet"
            ),
            ModelError::UnknownType {
                role,
                name,
                supported,
            } => write!(
                f,
                "unknown {role} type `{name}`; segtune supports: {}",
                supported.join(", ")
            ),
            ModelError::UnknownTypes(each) => {
                // Each missing type once (a list of auxiliary heads repeats
                // one), then each table's supported names once.
                let mut missing: Vec<(String, usize)> = Vec::new();
                let mut tables: Vec<(&str, &Vec<&'static str>)> = Vec::new();
                for e in each {
                    let ModelError::UnknownType {
                        role,
                        name,
                        supported,
                    } = e
                    else {
                        continue;
                    };
                    let label = format!("{role} `{name}`");
                    match missing.iter_mut().find(|(l, _)| *l == label) {
                        Some((_, n)) => *n += 1,
                        None => missing.push((label, 1)),
                    }
                    let kind = match *role {
                        "decode head" | "auxiliary head" => "heads",
                        "backbone" => "backbones",
                        "neck" => "necks",
                        other => other,
                    };
                    if !tables.iter().any(|(k, _)| *k == kind) {
                        tables.push((kind, supported));
                    }
                }
                let missing: Vec<String> = missing
                    .into_iter()
                    .map(|(l, n)| if n > 1 { format!("{l} (x{n})") } else { l })
                    .collect();
                write!(f, "unknown component types: {}", missing.join(", "))?;
                for (kind, supported) in tables {
                    write!(f, "\n  {kind} segtune supports: {}", supported.join(", "))?;
                }
                Ok(())
            }
            ModelError::Unsupported(what) => write!(f, "not supported yet: {what}"),
            ModelError::Config(what) => write!(f, "bad model config: {what}"),
        }
    }
}

impl std::error::Error for ModelError {}
