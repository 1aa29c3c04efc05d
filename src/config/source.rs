//! Reading a config file from disk: what a path is when it is not a
//! regular file (said without opening it), the size limit, UTF-8, and the
//! directory its relative references resolve against.

use super::error::{ConfigError, ErrorKind};
use std::path::{Path, PathBuf};

/// A config file larger than this is refused before it is read: MMSeg's
/// largest config is under 20 KB, and evaluating a generated file of many
/// megabytes would take minutes.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Why `path` cannot be read as a config file, if it cannot: it does not
/// exist, or it is not a regular file (said what it is). Only metadata is
/// read, never the file: opening a FIFO for reading would block until a
/// writer comes, and a device can be endless.
pub fn not_a_regular_file(path: &Path) -> Option<FileProblem> {
    use std::os::unix::fs::FileTypeExt;
    let problem = |missing: bool, what: String| Some(FileProblem { missing, what });
    match std::fs::metadata(path) {
        Ok(meta) => {
            let t = meta.file_type();
            let what = if t.is_file() {
                return None;
            } else if t.is_dir() {
                "a directory"
            } else if t.is_fifo() {
                "a FIFO (named pipe)"
            } else if t.is_char_device() || t.is_block_device() {
                "a device"
            } else if t.is_socket() {
                "a socket"
            } else {
                "something other than a file"
            };
            problem(false, format!("is {what}, not a regular file"))
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            problem(false, "is a symbolic link loop".to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::read_link(path) {
                // The link itself is there; what it points to is not.
                Ok(target) => problem(
                    true,
                    format!(
                        "is a symbolic link to {}, which does not exist",
                        target.display()
                    ),
                ),
                Err(_) => problem(true, "does not exist".to_string()),
            }
        }
        Err(e) => problem(false, format!("cannot be read: {e}")),
    }
}

/// What [`not_a_regular_file`] found.
#[derive(Debug, Clone)]
pub struct FileProblem {
    /// Nothing is there (or a symbolic link points nowhere).
    pub missing: bool,
    /// What it is, as the end of a sentence about the path
    /// ("is a directory, not a regular file", "does not exist").
    pub what: String,
}

impl std::fmt::Display for FileProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

/// Reads a config file (a regular file of at most [`MAX_CONFIG_BYTES`]) or
/// returns a config error naming it.
pub fn read_source(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let io_error = |e: std::io::Error| {
        ConfigError::new(
            ErrorKind::Io,
            format!("cannot read config {}: {e}", path.display()),
        )
    };
    if let Some(problem) = not_a_regular_file(path) {
        return Err(ConfigError::new(
            ErrorKind::Io,
            format!("cannot read config {}: it {problem}", path.display()),
        ));
    }
    let meta = std::fs::metadata(path).map_err(io_error)?;
    let too_big = |len: u64| {
        ConfigError::new(
            ErrorKind::Limit,
            format!(
                "config {} is {:.1} MiB, more than the limit of {} MiB for a config file",
                path.display(),
                len as f64 / (1u64 << 20) as f64,
                MAX_CONFIG_BYTES >> 20
            ),
        )
    };
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_big(meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
        .map_err(io_error)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        ConfigError::new(
            ErrorKind::Io,
            format!(
                "cannot read config {}: not UTF-8 text (byte {} is invalid)",
                path.display(),
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// The directory a config file's relative references resolve against.
pub fn config_dir(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}
