//! The search journal: every finished trial appended to `DIR/trials.jsonl`
//! as it completes (one JSON object per line, written whole and synced),
//! keyed by config hash, candidate and device, so a re-run resumes without
//! redoing any. One search at a time owns a directory (`DIR/.segtune.lock`,
//! an exclusive lock held while the journal is open).

use super::record::TrialRecord;
use super::space::Candidate;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// A journal larger than this is not one segtune wrote (a search writes a
/// few hundred lines of ~500 bytes).
pub const MAX_JOURNAL_BYTES: u64 = 64 << 20;

/// One line of the journal.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JournalRow {
    pub config_hash: String,
    /// `predicted:...` or `cuda:N`, with the GPUs and segments settings.
    pub device: String,
    pub candidate: Candidate,
    pub record: TrialRecord,
    /// Where and when it ran (absent for records of older segtunes and of
    /// the confirmation's single device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunInfo>,
}

/// Where and when a candidate was evaluated: the evaluator's slot (a
/// device of `--devices`, a Slurm slot of `--max-parallel`), its start
/// and end, and the Slurm job steps its workers ran as.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunInfo {
    pub slot: usize,
    /// Milliseconds since the Unix epoch.
    pub started_ms: u64,
    pub ended_ms: u64,
    /// `<job>.<step>` of each `srun` (a retried trial has two).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slurm_jobs: Vec<String>,
    /// A first try that gave no verdict (then tried again): its status and
    /// reason, e.g. a Slurm job cancelled with `scancel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
}

type Line = JournalRow;

/// Every readable row of `dir/trials.jsonl`, in the order written (torn
/// or foreign lines skipped).
pub fn rows(dir: &Path) -> Result<Vec<JournalRow>> {
    let path = dir.join("trials.jsonl");
    let mut bytes = Vec::new();
    File::open(&path)
        .and_then(|f| f.take(MAX_JOURNAL_BYTES).read_to_end(&mut bytes))
        .map_err(|e| environment(&path, "read", e))?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// An append-only journal of trials.
pub struct Journal {
    path: PathBuf,
    file: File,
    /// Held for the journal's life: the directory's exclusive lock.
    _lock: File,
    config_hash: String,
    /// The device whose records [`Journal::get`] reads and
    /// [`Journal::append`] writes (see [`Journal::set_device`]).
    device: String,
    /// Records of this config, by device and candidate key.
    done: HashMap<(String, String), TrialRecord>,
    /// The file ends in a torn line (a run killed mid-write, a full disk):
    /// the next record starts on a line of its own.
    needs_newline: bool,
    skipped_lines: usize,
}

/// Creates the search's `--out` directory (and its parents), after
/// [`check_out_dir`].
pub fn create_out_dir(dir: &Path) -> Result<()> {
    check_out_dir(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| environment(dir, "create", e))
}

/// Refuses an `--out` that exists as something else than a directory, or
/// lies under such a thing: the user's mistake, said as such rather than as
/// the OS's "File exists". Creates nothing.
pub fn check_out_dir(dir: &Path) -> Result<()> {
    for ancestor in dir.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        let Ok(meta) = std::fs::metadata(ancestor) else {
            continue;
        };
        if meta.is_dir() {
            break;
        }
        let what = if meta.is_file() {
            "a file"
        } else {
            "not a directory (a device, a pipe or a socket)"
        };
        return Err(Error::Input(if ancestor == dir {
            format!(
                "--out {} is {what}; --out must be a directory (segtune creates it if missing)",
                dir.display()
            )
        } else {
            format!(
                "--out {}: {} is {what}, so the directory cannot be made under it; \
                 --out must be a directory",
                dir.display(),
                ancestor.display()
            )
        }));
    }
    Ok(())
}

fn environment(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::io(format!("cannot {what} {}", path.display()), e)
}

impl Journal {
    /// Opens (or starts) `dir/trials.jsonl` for this config and device,
    /// after taking `dir`'s lock. Lines that do not parse (a torn last line,
    /// foreign text) are skipped and counted; a file none of whose lines is
    /// a journal line, or that is not a regular file, is refused.
    pub fn open(dir: &Path, config_hash: &str, device: &str) -> Result<Journal> {
        create_out_dir(dir)?;
        let lock_path = dir.join(".segtune.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| environment(dir, "write into", e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Input(format!(
                    "another segtune search is using {} (it holds {}); wait for it to finish \
                     or give another --out",
                    dir.display(),
                    lock_path.display()
                )))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(environment(&lock_path, "lock", e)),
        }
        let path = dir.join("trials.jsonl");
        let mut text = String::new();
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(environment(&path, "read", e)),
            Ok(meta) if !meta.is_file() => {
                return Err(Error::Input(format!(
                    "{} is not a regular file (a device, a directory or a link to one); \
                     move it away or give another --out",
                    path.display()
                )))
            }
            Ok(meta) if meta.len() > MAX_JOURNAL_BYTES => {
                return Err(Error::Input(format!(
                    "{} is {} MiB, larger than any journal segtune writes ({} MiB); \
                     move it away or give another --out",
                    path.display(),
                    meta.len() >> 20,
                    MAX_JOURNAL_BYTES >> 20
                )))
            }
            Ok(_) => {
                let mut bytes = Vec::new();
                File::open(&path)
                    .and_then(|f| f.take(MAX_JOURNAL_BYTES + 1).read_to_end(&mut bytes))
                    .map_err(|e| environment(&path, "read", e))?;
                text = String::from_utf8_lossy(&bytes).into_owned();
            }
        }
        let mut done = HashMap::new();
        let (mut read, mut skipped_lines) = (0usize, 0usize);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match serde_json::from_str::<Line>(line) {
                Ok(l) => {
                    read += 1;
                    if l.config_hash == config_hash {
                        done.insert((l.device, l.candidate.key()), l.record);
                    }
                }
                Err(_) => skipped_lines += 1,
            }
        }
        if read == 0 && skipped_lines > 0 {
            return Err(Error::Input(format!(
                "{} is not a segtune journal (none of its {skipped_lines} lines is a trial \
                 record); move it away or give another --out",
                path.display()
            )));
        }
        // Opened now, so that an unwritable --out is found before any trial.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| environment(&path, "write", e))?;
        Ok(Journal {
            path,
            file,
            _lock: lock,
            config_hash: config_hash.to_string(),
            device: device.to_string(),
            done,
            needs_newline: !text.is_empty() && !text.ends_with('\n'),
            skipped_lines,
        })
    }

    /// The candidate's verdict on this device, if a run found one: a
    /// record of a failure of the host or the moment (a crash, a timeout,
    /// the host's refusal) is kept in the file but never reused.
    pub fn get(&self, c: &Candidate) -> Option<&TrialRecord> {
        self.done
            .get(&(self.device.clone(), c.key()))
            .filter(|r| r.status.is_verdict())
    }

    /// Reads and writes the records of another device from now on (a
    /// search that predicts, then measures, keeps both in one journal).
    pub fn set_device(&mut self, device: &str) {
        self.device = device.to_string();
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    /// Lines of the file that were not trial records (torn or foreign).
    pub fn skipped_lines(&self) -> usize {
        self.skipped_lines
    }

    /// Appends a finished trial: one write of a whole line (after a newline
    /// if the file ended in a torn one), then synced to the disk.
    pub fn append(&mut self, c: &Candidate, record: &TrialRecord) -> Result<()> {
        self.append_run(c, record, None)
    }

    /// [`Journal::append`], with where and when it ran.
    pub fn append_run(
        &mut self,
        c: &Candidate,
        record: &TrialRecord,
        run: Option<&RunInfo>,
    ) -> Result<()> {
        let line = Line {
            config_hash: self.config_hash.clone(),
            device: self.device.clone(),
            candidate: *c,
            record: record.clone(),
            run: run.cloned(),
        };
        let mut text = String::new();
        if self.needs_newline {
            text.push('\n');
        }
        text.push_str(&serde_json::to_string(&line).expect("journal lines serialise"));
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|_| self.file.sync_data())
            .map_err(|e| environment(&self.path, "write", e))?;
        self.needs_newline = false;
        self.done
            .insert((self.device.clone(), c.key()), record.clone());
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// FNV-1a 64 of a text, in hex: a stable hash of the resolved config.
pub fn hash_text(text: &str) -> String {
    crate::config::dump::hash_text(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::record::{CandidateStatus, Mode, TrialRecord};
    use crate::trial::Amp;

    fn candidate(batch_size: i64) -> Candidate {
        Candidate {
            batch_size,
            crop: (128, 128),
            amp: Amp::Off,
            accumulation: 1,
            checkpoint: false,
            num_points: None,
            test_mode: None,
        }
    }

    fn record() -> TrialRecord {
        TrialRecord::failed(CandidateStatus::Oom, "test".into(), Mode::Predicted)
    }

    #[test]
    fn a_torn_last_line_does_not_swallow_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut j = Journal::open(dir.path(), "h", "d").unwrap();
            j.append(&candidate(1), &record()).unwrap();
        }
        let path = dir.path().join("trials.jsonl");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"{\"config_hash\":\"h\",\"dev").unwrap();
        drop(f);
        {
            let mut j = Journal::open(dir.path(), "h", "d").unwrap();
            assert_eq!(j.skipped_lines(), 1);
            j.append(&candidate(2), &record()).unwrap();
        }
        let j = Journal::open(dir.path(), "h", "d").unwrap();
        assert!(j.get(&candidate(1)).is_some() && j.get(&candidate(2)).is_some());
        assert_eq!(j.skipped_lines(), 1);
    }

    #[test]
    fn foreign_files_and_a_second_search_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trials.jsonl");
        std::fs::write(&path, [0x9fu8, 0x00, 0x41, b'\n', 0xff, 0xfe]).unwrap();
        let err = Journal::open(dir.path(), "h", "d")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("is not a segtune journal"), "{err}");
        std::fs::remove_file(&path).unwrap();

        let _first = Journal::open(dir.path(), "h", "d").unwrap();
        let err = Journal::open(dir.path(), "h", "d")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("another segtune search is using"), "{err}");
    }

    #[test]
    fn a_journal_that_is_a_device_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("trials.jsonl")).unwrap();
        let err = Journal::open(dir.path(), "h", "d")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("is not a regular file"), "{err}");
    }

    #[test]
    fn one_journal_keeps_each_devices_records_apart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut j = Journal::open(dir.path(), "h", "predicted").unwrap();
            j.append(&candidate(1), &record()).unwrap();
            j.set_device("cuda:0");
            assert!(j.get(&candidate(1)).is_none());
            j.append(&candidate(2), &record()).unwrap();
        }
        let mut j = Journal::open(dir.path(), "h", "cuda:0").unwrap();
        assert!(j.get(&candidate(2)).is_some() && j.get(&candidate(1)).is_none());
        j.set_device("predicted");
        assert!(j.get(&candidate(1)).is_some() && j.get(&candidate(2)).is_none());
    }
}
