//! The one error type of everything after the config layer (models, trials,
//! predictions, the search, the report), rendered once by the command line.
//! Config errors keep their own `file:line:column` diagnostics and pass
//! through unchanged.

use crate::config::ConfigError;
use crate::models::ModelError;
use crate::status::TrialStatus;
use std::path::PathBuf;

/// Why a command could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config that does not load; renders its own diagnostic.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A model segtune cannot build, in the config at `config`.
    #[error("{source}\n  --> {}", config.display())]
    Model { source: ModelError, config: PathBuf },
    /// A value given on the command line or in the config's `segtune`
    /// settings that cannot be used (an unparsable `--vram`, a budget that
    /// leaves nothing, an unknown objective).
    #[error("{0}")]
    Input(String),
    /// The machine, not the input: a file that cannot be read or written,
    /// a worker binary that is missing or cannot start; with the system's
    /// error where there is one.
    #[error("{what}{}", source.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Environment {
        what: String,
        #[source]
        source: Option<std::io::Error>,
    },
    /// A trial or a traced step that failed (its status and message).
    #[error("{0}")]
    Trial(String),
    /// A worker that gave no answer for a reason of the host or the moment
    /// (killed from outside, out of the host's memory, past its deadline):
    /// no verdict on what it ran, tried again rather than kept.
    #[error("{message}")]
    Unanswered {
        /// `crash`, `host_oom` or `timeout`.
        status: TrialStatus,
        message: String,
    },
    /// A message the `segtune-torch` worker already rendered for the user
    /// (a config or model error found in the worker); printed as it is.
    #[error("{0}")]
    Rendered(String),
}

impl Error {
    /// An environment error caused by `source` (`cannot write PATH: ...`).
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Environment {
            what: what.into(),
            source: Some(source),
        }
    }

    /// An environment error with no system error behind it.
    pub fn environment(what: impl Into<String>) -> Error {
        Error::Environment {
            what: what.into(),
            source: None,
        }
    }

    /// The text the command line prints on stderr: `error: ...` once, with
    /// config diagnostics and worker messages as they were rendered.
    pub fn render(&self) -> String {
        let mut text = match self {
            Error::Config(e) => e.to_string(),
            Error::Rendered(text) => text.clone(),
            Error::Model { source, config } => {
                let modules = crate::config::resolve(config, &[])
                    .map(|cfg| crate::config::custom_imports(&cfg))
                    .unwrap_or_default();
                match source.unknown_type_help(&modules, config) {
                    Some(help) => format!("error: {self}\n  = help: {help}"),
                    None => format!("error: {self}"),
                }
            }
            other => format!("error: {other}"),
        };
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
