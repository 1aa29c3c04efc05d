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
            ModelError::Unsupported(what) => write!(f, "not supported yet: {what}"),
            ModelError::Config(what) => write!(f, "bad model config: {what}"),
        }
    }
}

impl std::error::Error for ModelError {}
