//! The search journal: every finished trial appended to `DIR/trials.jsonl`
//! as it completes (one JSON object per line, flushed), keyed by config
//! hash, candidate and device, so a re-run resumes without redoing any.

use super::record::TrialRecord;
use super::space::Candidate;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Line {
    config_hash: String,
    device: String,
    candidate: Candidate,
    record: TrialRecord,
}

/// An append-only journal of trials.
pub struct Journal {
    path: PathBuf,
    config_hash: String,
    device: String,
    done: HashMap<String, TrialRecord>,
}

impl Journal {
    /// Opens (or starts) `dir/trials.jsonl` for this config and device.
    /// Lines that do not parse (a run killed mid-write) are ignored.
    pub fn open(dir: &Path, config_hash: &str, device: &str) -> Result<Journal> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Environment(format!("cannot create {}: {e}", dir.display())))?;
        let path = dir.join("trials.jsonl");
        let mut done = HashMap::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            for line in text.lines() {
                if let Ok(l) = serde_json::from_str::<Line>(line) {
                    if l.config_hash == config_hash && l.device == device {
                        done.insert(l.candidate.key(), l.record);
                    }
                }
            }
        }
        Ok(Journal {
            path,
            config_hash: config_hash.to_string(),
            device: device.to_string(),
            done,
        })
    }

    pub fn get(&self, c: &Candidate) -> Option<&TrialRecord> {
        self.done.get(&c.key())
    }

    /// Appends a finished trial (one write of a whole line, then flush).
    pub fn append(&mut self, c: &Candidate, record: &TrialRecord) -> Result<()> {
        let line = Line {
            config_hash: self.config_hash.clone(),
            device: self.device.clone(),
            candidate: *c,
            record: record.clone(),
        };
        let mut text = serde_json::to_string(&line).expect("journal lines serialise");
        text.push('\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| {
                Error::Environment(format!("cannot write {}: {e}", self.path.display()))
            })?;
        f.write_all(text.as_bytes())
            .and_then(|_| f.flush())
            .map_err(|e| {
                Error::Environment(format!("cannot write {}: {e}", self.path.display()))
            })?;
        self.done.insert(c.key(), record.clone());
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// FNV-1a 64 of a text, in hex: a stable hash of the resolved config.
pub fn hash_text(text: &str) -> String {
    let h = text.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    });
    format!("{h:016x}")
}
