//! Config errors as one-screen diagnostics that point at `file:line:column`,
//! show the offending line and say how to fix it (in the style of ruff/uv).

use std::fmt;
use std::path::{Path, PathBuf};

/// Where in a config file something went wrong (1-based line and column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    /// The text of that line, shown under the message.
    pub source_line: Option<String>,
}

impl Location {
    /// The location of byte `offset` in `source`.
    pub fn from_offset(file: &Path, source: &str, offset: usize) -> Location {
        let offset = offset.min(source.len());
        let before = &source[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let line = before.matches('\n').count() + 1;
        let column = source[line_start..offset].chars().count() + 1;
        let line_end = source[line_start..]
            .find('\n')
            .map_or(source.len(), |i| line_start + i);
        Location {
            file: file.to_path_buf(),
            line,
            column,
            source_line: Some(
                source[line_start..line_end]
                    .trim_end_matches('\r')
                    .to_string(),
            ),
        }
    }

    /// The location of a 1-based line and column in `source`.
    pub fn from_line_column(file: &Path, source: &str, line: usize, column: usize) -> Location {
        Location {
            file: file.to_path_buf(),
            line,
            column,
            source_line: source
                .lines()
                .nth(line.saturating_sub(1))
                .map(str::to_string),
        }
    }
}

/// What kind of failure, so callers and tests can tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Io,
    Syntax,
    Unsupported,
    MissingBase,
    BaseCycle,
    DuplicateBaseKeys,
    MergeType,
    Evaluation,
    Limit,
    CfgOption,
    Reserved,
}

/// A config error: message, optional location, and a hint on the fix.
/// Boxed, so that `Result<_, ConfigError>` stays small on the happy path.
#[derive(Debug, Clone)]
pub struct ConfigError(Box<Details>);

/// What a [`ConfigError`] says (reachable through `Deref`).
#[derive(Debug, Clone)]
pub struct Details {
    pub kind: ErrorKind,
    pub message: String,
    pub location: Option<Location>,
    pub help: Option<String>,
    /// Files that included the failing one, innermost first.
    pub included_from: Vec<PathBuf>,
}

impl ConfigError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ConfigError {
        ConfigError(Box::new(Details {
            kind,
            message: message.into(),
            location: None,
            help: None,
            included_from: Vec::new(),
        }))
    }

    pub fn at(mut self, location: Location) -> ConfigError {
        self.location = Some(location);
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> ConfigError {
        self.help = Some(help.into());
        self
    }

    /// Records that the failing file was reached through `parent`'s `_base_`.
    pub fn included_from(mut self, parent: &Path) -> ConfigError {
        self.included_from.push(parent.to_path_buf());
        self
    }
}

impl std::ops::Deref for ConfigError {
    type Target = Details;
    fn deref(&self) -> &Details {
        &self.0
    }
}

impl std::ops::DerefMut for ConfigError {
    fn deref_mut(&mut self) -> &mut Details {
        &mut self.0
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        if let Some(loc) = &self.location {
            writeln!(
                f,
                "  --> {}:{}:{}",
                loc.file.display(),
                loc.line,
                loc.column
            )?;
            if let Some(text) = &loc.source_line {
                // A window of the line around the column: one screen, even
                // for a generated line of a megabyte.
                const WIDTH: usize = 100;
                let chars: Vec<char> = text.chars().collect();
                let column = loc.column.saturating_sub(1).min(chars.len());
                let start = column.saturating_sub(WIDTH / 2);
                let end = (start + WIDTH).min(chars.len());
                let lead = if start > 0 { "..." } else { "" };
                let tail = if end < chars.len() { "..." } else { "" };
                let shown: String = chars[start..end].iter().collect();
                let gutter = " ".repeat(loc.line.to_string().len());
                writeln!(f, "{gutter} |")?;
                writeln!(f, "{} | {lead}{shown}{tail}", loc.line)?;
                let pad: String = lead
                    .chars()
                    .map(|_| ' ')
                    .chain(
                        chars[start..column]
                            .iter()
                            .map(|&c| if c == '\t' { '\t' } else { ' ' }),
                    )
                    .collect();
                writeln!(f, "{gutter} | {pad}^")?;
            }
        }
        for parent in &self.included_from {
            writeln!(f, "  = included from {}", parent.display())?;
        }
        if let Some(help) = &self.help {
            writeln!(f, "  = help: {help}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

pub type Result<T> = std::result::Result<T, ConfigError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_maps_to_line_and_column() {
        let src = "a = 1\nbb = (2,\n";
        let loc = Location::from_offset(Path::new("x.py"), src, 11);
        assert_eq!((loc.line, loc.column), (2, 6));
        assert_eq!(loc.source_line.as_deref(), Some("bb = (2,"));
    }

    #[test]
    fn rendering_names_file_line_and_caret() {
        let src = "x = lambda: 1\n";
        let err = ConfigError::new(
            ErrorKind::Unsupported,
            "unsupported Python construct `lambda`",
        )
        .at(Location::from_offset(Path::new("cfg.py"), src, 4))
        .with_help("write the value out");
        let text = err.to_string();
        assert!(text.contains("cfg.py:1:5"), "{text}");
        assert!(text.contains("1 | x = lambda: 1"), "{text}");
        assert!(text.contains("|     ^"), "{text}");
    }
}
