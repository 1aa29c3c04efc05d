//! The atlas's row cache: `OUT/rows.jsonl`, each finished row under its key.

use super::AtlasRow;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The row cache: `OUT/rows.jsonl`, one `{key, row}` per line, appended as
/// rows finish (a killed atlas keeps what it finished).
pub(super) struct RowCache {
    path: PathBuf,
    rows: HashMap<String, AtlasRow>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CachedRow {
    key: String,
    row: AtlasRow,
}

impl RowCache {
    pub(super) fn open(out: &Path) -> RowCache {
        let path = out.join("rows.jsonl");
        let rows = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<CachedRow>(l).ok())
            .map(|c| (c.key, c.row))
            .collect();
        RowCache { path, rows }
    }

    pub(super) fn get(&self, key: &str) -> Option<&AtlasRow> {
        self.rows.get(key)
    }

    pub(super) fn put(&mut self, key: String, row: &AtlasRow) -> Result<()> {
        let line = serde_json::to_string(&CachedRow {
            key: key.clone(),
            row: row.clone(),
        })
        .expect("rows serialise");
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| writeln!(f, "{line}"))
            .map_err(|e| Error::io(format!("cannot write {}", self.path.display()), e))?;
        self.rows.insert(key, row.clone());
        Ok(())
    }
}
