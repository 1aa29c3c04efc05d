//! The atlas's row cache: `OUT/rows.jsonl`, each finished row under its key.
//!
//! Only judgements are kept: a setting fits, nothing fits, or the config
//! cannot be searched (its model unsupported, its settings wrong). A row
//! that failed for a reason of the host or the moment (a killed worker,
//! the host's memory, a lock another search held) is never written, so a
//! re-run searches it again. Each line ends in a checksum (as the journal's
//! do); a file with lines that do not read is kept aside whole
//! (`rows.jsonl.damaged-<unix time>`) and a fresh one holds what did read,
//! with a note saying so.

use super::AtlasRow;
use crate::error::{Error, Result};
use crate::search::journal::{seal_of, sealed, Seal, MAX_JOURNAL_BYTES};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The row cache: `OUT/rows.jsonl`, one `{key, row}` per line, appended as
/// rows finish (a killed atlas keeps what it finished).
pub(super) struct RowCache {
    path: PathBuf,
    rows: HashMap<String, CachedRow>,
    /// What became of a damaged file, for the atlas's notes.
    note: Option<String>,
}

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct CachedRow {
    key: String,
    row: AtlasRow,
    /// The row is a judgement (set by every segtune that writes only
    /// judgements; a failed row of an older one may be a failure of the
    /// moment, and is searched again).
    #[serde(default)]
    judged: bool,
}

impl CachedRow {
    /// Whether the row may stand for a search: a verdict on the config.
    fn reusable(&self) -> bool {
        self.judged || self.row.status != super::AtlasStatus::Failed
    }
}

impl RowCache {
    /// The cache under `out`; a damaged file is moved aside (and said so in
    /// [`RowCache::note`]), one that is not a regular file is refused.
    pub(super) fn open(out: &Path) -> Result<RowCache> {
        let path = out.join("rows.jsonl");
        let text = match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(Error::io(format!("cannot read {}", path.display()), e)),
            Ok(meta) if !meta.is_file() => {
                return Err(Error::Input(format!(
                    "{} is not a regular file (a device, a directory or a link to one); \
                     move it away or give another --out",
                    path.display()
                )))
            }
            Ok(_) => {
                let mut bytes = Vec::new();
                std::fs::File::open(&path)
                    .and_then(|f| f.take(MAX_JOURNAL_BYTES).read_to_end(&mut bytes))
                    .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
                String::from_utf8_lossy(&bytes).into_owned()
            }
        };
        let (mut rows, mut lines, mut unreadable) = (HashMap::new(), 0usize, 0usize);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            lines += 1;
            let read = (seal_of(line) != Seal::Broken)
                .then(|| serde_json::from_str::<CachedRow>(line).ok())
                .flatten();
            match read {
                Some(c) => {
                    rows.insert(c.key.clone(), c);
                }
                None => unreadable += 1,
            }
        }
        let mut cache = RowCache {
            path,
            rows,
            note: None,
        };
        if unreadable > 0 {
            cache.note = Some(cache.set_aside(lines, unreadable)?);
        }
        Ok(cache)
    }

    /// Moves a damaged file aside and writes the rows that read into a
    /// fresh one; says what was done.
    fn set_aside(&self, lines: usize, unreadable: usize) -> Result<String> {
        let seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let aside = self
            .path
            .with_file_name(format!("rows.jsonl.damaged-{seconds}"));
        std::fs::rename(&self.path, &aside)
            .map_err(|e| Error::io(format!("cannot move {} aside", self.path.display()), e))?;
        let mut text = String::new();
        for c in self.rows.values() {
            text.push_str(&sealed(&serde_json::to_string(c).expect("rows serialise")));
            text.push('\n');
        }
        crate::search::saved::write_atomically(&self.path, text.as_bytes())?;
        Ok(format!(
            "the row cache {} was damaged ({unreadable} of its {lines} lines do not read as rows, \
             or fail their checksum): kept aside as {}; its {} readable rows are reused, \
             the rest are searched again",
            self.path.display(),
            aside.display(),
            self.rows.len()
        ))
    }

    /// What was done with a damaged file, if it was.
    pub(super) fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// The judgement kept under `key`.
    pub(super) fn get(&self, key: &str) -> Option<&AtlasRow> {
        self.rows.get(key).filter(|c| c.reusable()).map(|c| &c.row)
    }

    /// Keeps `row`, a judgement, under `key` (appended, with its checksum).
    pub(super) fn put(&mut self, key: String, row: &AtlasRow) -> Result<()> {
        let cached = CachedRow {
            key: key.clone(),
            row: row.clone(),
            judged: true,
        };
        let line = sealed(&serde_json::to_string(&cached).expect("rows serialise"));
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| writeln!(f, "{line}"))
            .map_err(|e| Error::io(format!("cannot write {}", self.path.display()), e))?;
        self.rows.insert(key, cached);
        Ok(())
    }
}

#[cfg(test)]
#[path = "row_cache_tests.rs"]
mod tests;
