//! The search journal: every finished trial appended to `DIR/trials.jsonl`
//! as it completes (one JSON object per line, written whole and synced),
//! so a re-run resumes without redoing any. One search at a time owns a
//! directory (`DIR/.segtune.lock`, an exclusive lock held while the journal
//! is open).
//!
//! A row is reused only by a search with the same inputs: each carries the
//! [`Inputs`] its verdict depended on (the resolved config, the GPU and its
//! facts, cuDNN's benchmark mode, PyTorch, GPUs, label segments, the
//! allocator, the trace kind, the worker build), readable and hashed into
//! its `key`, so a search with other inputs evaluates the candidate again
//! and says which inputs differ. Each line ends in a checksum of the rest:
//! an edited or damaged line is not trusted, it is counted and run again.

use super::record::TrialRecord;
use super::space::Candidate;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// A journal larger than this is not one segtune wrote (a search writes a
/// few hundred lines of ~500 bytes).
pub const MAX_JOURNAL_BYTES: u64 = 64 << 20;

/// The start of the error a search gets when another holds its `--out`
/// (an atlas tells this failure of the moment from a judgement by it).
pub const ANOTHER_SEARCH: &str = "another segtune search is using";

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
    /// What the verdict depended on, by name (absent in rows of older
    /// segtunes: those are not reused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Inputs>,
    /// The hash of `device` and `inputs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// What a trial's verdict depends on besides its candidate, by a readable
/// name: `compute capability` = `8.6`, `config` = its resolved hash, ...
/// Two searches reuse each other's rows only where these agree.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Inputs(BTreeMap<String, String>);

/// Inputs that enter predictions only: a real trial does not trace.
const PREDICTION_ONLY: &[&str] = &["trace"];
/// Inputs that enter real trials only: the worker's CUDA allocator reads
/// the environment, a prediction does not.
const MEASUREMENT_ONLY: &[&str] = &["PYTORCH_CUDA_ALLOC_CONF"];
/// The order differences are named in (the GPU's own facts last: the
/// named ones say the same more plainly).
const NAMED_FIRST: &[&str] = &[
    "compute capability",
    "VRAM",
    "GPU",
    "margin",
    "cuDNN benchmark",
    "PyTorch",
    "GPUs",
    "label segments",
    "trace",
    "allocator",
    "PYTORCH_CUDA_ALLOC_CONF",
    "mode",
    "config",
    "worker",
];
/// The hash of every preset fact: said only when no named GPU input differs.
const GPU_FACTS: &str = "GPU facts";
const GPU_NAMED: &[&str] = &["compute capability", "VRAM", "GPU", "margin"];

impl Inputs {
    pub fn new() -> Inputs {
        Inputs::default()
    }

    /// These inputs with `name` = `value`.
    pub fn with(mut self, name: &str, value: impl ToString) -> Inputs {
        self.0.insert(name.to_string(), value.to_string());
        self
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// The inputs a record of `device` depends on.
    fn for_device(&self, device: &str) -> Inputs {
        let predicted = device.starts_with("predicted");
        let dropped = if predicted {
            MEASUREMENT_ONLY
        } else {
            PREDICTION_ONLY
        };
        Inputs(
            self.0
                .iter()
                .filter(|(k, _)| !dropped.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    }

    /// Whether `row` was recorded under these inputs (its device's share
    /// of them, and its key): a row of this search, not another's.
    pub fn recorded(&self, row: &JournalRow) -> bool {
        let expected = self.for_device(&row.device);
        row.inputs.as_ref() == Some(&expected)
            && row.key.as_deref() == Some(expected.key(&row.device).as_str())
    }

    /// The row key of a record of `device` under these inputs.
    fn key(&self, device: &str) -> String {
        hash_text(&format!(
            "{device}|{}",
            serde_json::to_string(&self.0).expect("inputs serialise")
        ))
    }
}

/// A journal of one config's hash, no other input (tests, and callers
/// that key by the config alone).
impl From<&str> for Inputs {
    fn from(config_hash: &str) -> Inputs {
        Inputs::new().with("config", config_hash)
    }
}

/// Journal rows a search did not reuse, and why (in its result and notes).
#[derive(
    Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct NotReused {
    /// Verdicts recorded with other inputs (another GPU, cuDNN setting,
    /// PyTorch, config, worker build, ...): evaluated again.
    pub other_inputs: usize,
    /// What differed, e.g. `compute capability 6.1, now 8.6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub differences: Option<String>,
    /// Lines whose checksum fails (edited by hand, or damaged): ignored.
    pub checksum_failed: usize,
}

impl NotReused {
    pub fn is_empty(&self) -> bool {
        self.other_inputs == 0 && self.checksum_failed == 0
    }
}

/// What differs between the inputs of rows not reused and `now`, for a
/// note: at most three names, each with the rows' values and the current.
fn differences(theirs: &[Inputs], now: &Inputs, device_of: &[&str]) -> Option<String> {
    let mut differing: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (inputs, device) in theirs.iter().zip(device_of) {
        let now = now.for_device(device);
        let names: BTreeSet<&String> = inputs.0.keys().chain(now.0.keys()).collect();
        for name in names {
            let (was, is) = (inputs.0.get(name), now.0.get(name));
            if was != is {
                differing
                    .entry(name.clone())
                    .or_default()
                    .insert(was.cloned().unwrap_or_else(|| "unset".into()));
            }
        }
    }
    if differing.is_empty() {
        return None;
    }
    if GPU_NAMED.iter().any(|n| differing.contains_key(*n)) {
        differing.remove(GPU_FACTS);
    }
    let rank = |name: &str| {
        NAMED_FIRST
            .iter()
            .position(|n| *n == name)
            .unwrap_or(NAMED_FIRST.len())
    };
    let mut names: Vec<&String> = differing.keys().collect();
    names.sort_by_key(|n| (rank(n), n.to_string()));
    let said: Vec<String> = names
        .iter()
        .take(3)
        .map(|name| {
            let was: Vec<&str> = differing[*name].iter().map(String::as_str).collect();
            format!(
                "{name} {}, now {}",
                was.join(" or "),
                now.get(name).unwrap_or("unset")
            )
        })
        .collect();
    let more = names.len().saturating_sub(3);
    Some(if more > 0 {
        format!("{}; and {more} more", said.join("; "))
    } else {
        said.join("; ")
    })
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

/// Where a line's checksum starts: it is the last field of the object.
const CHECKSUM_FIELD: &str = ",\"checksum\":\"";

/// `json` (one JSON object) with a checksum of it as its last field.
pub(crate) fn sealed(json: &str) -> String {
    let body = json.strip_suffix('}').unwrap_or(json);
    format!("{body}{CHECKSUM_FIELD}{}\"}}", hash_text(json))
}

/// How a line's checksum reads.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Seal {
    /// It holds.
    Holds,
    /// The line has none (written by a segtune before checksums).
    Absent,
    /// It does not hold: the line was edited or damaged.
    Broken,
}

/// Whether `line`'s checksum (see [`sealed`]) holds.
pub(crate) fn seal_of(line: &str) -> Seal {
    let line = line.trim_end();
    let Some(at) = line.rfind(CHECKSUM_FIELD) else {
        return Seal::Absent;
    };
    let Some(sum) = line[at + CHECKSUM_FIELD.len()..].strip_suffix("\"}") else {
        return Seal::Broken;
    };
    if hash_text(&format!("{}}}", &line[..at])) == sum {
        Seal::Holds
    } else {
        Seal::Broken
    }
}

/// Every readable row of `dir/trials.jsonl`, in the order written (torn
/// or foreign lines, and lines whose checksum fails, skipped).
pub fn rows(dir: &Path) -> Result<Vec<JournalRow>> {
    let path = dir.join("trials.jsonl");
    let mut bytes = Vec::new();
    File::open(&path)
        .and_then(|f| f.take(MAX_JOURNAL_BYTES).read_to_end(&mut bytes))
        .map_err(|e| environment(&path, "read", e))?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| seal_of(l) != Seal::Broken)
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
    /// This search's inputs: rows recorded with others are not reused.
    inputs: Inputs,
    /// The device whose records [`Journal::get`] reads and
    /// [`Journal::append`] writes (see [`Journal::set_device`]).
    device: String,
    /// Records of these inputs, by device and candidate key.
    done: HashMap<(String, String), TrialRecord>,
    /// The file ends in a torn line (a run killed mid-write, a full disk):
    /// the next record starts on a line of its own.
    needs_newline: bool,
    skipped_lines: usize,
    /// Lines whose checksum fails.
    checksum_failed: usize,
    /// Verdicts recorded with other inputs, by the kind of device
    /// ([`device_class`]) and candidate key, with the device and inputs.
    others: HashMap<(String, String), (String, Inputs)>,
    /// Of those, the ones this search asked for (and so evaluated again).
    asked_others: std::sync::Mutex<BTreeSet<(String, String)>>,
}

/// The kind of device a record is of (`predicted`, `predicted-infer`,
/// `cuda`): device strings name some inputs too, so a candidate asked for
/// with other inputs is found by this.
fn device_class(device: &str) -> String {
    device.split(':').next().unwrap_or("").to_string()
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

/// The journal's text ("" when there is none yet), refused when it is not
/// a regular file or larger than any journal segtune writes.
fn read_journal(path: &Path) -> Result<String> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(environment(path, "read", e)),
        Ok(meta) if !meta.is_file() => Err(Error::Input(format!(
            "{} is not a regular file (a device, a directory or a link to one); \
             move it away or give another --out",
            path.display()
        ))),
        Ok(meta) if meta.len() > MAX_JOURNAL_BYTES => Err(Error::Input(format!(
            "{} is {} MiB, larger than any journal segtune writes ({} MiB); \
             move it away or give another --out",
            path.display(),
            meta.len() >> 20,
            MAX_JOURNAL_BYTES >> 20
        ))),
        Ok(_) => {
            let mut bytes = Vec::new();
            File::open(path)
                .and_then(|f| f.take(MAX_JOURNAL_BYTES + 1).read_to_end(&mut bytes))
                .map_err(|e| environment(path, "read", e))?;
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }
    }
}

impl Journal {
    /// Opens (or starts) `dir/trials.jsonl` for a search of these inputs
    /// (a config hash alone converts) on this device, after taking `dir`'s
    /// lock. Lines that do not parse (a torn last line, foreign text) are
    /// skipped and counted; a file none of whose lines is a journal line,
    /// or that is not a regular file, is refused. Rows of other inputs and
    /// rows whose checksum fails are kept in the file but not reused
    /// ([`Journal::not_reused`]).
    pub fn open(dir: &Path, inputs: impl Into<Inputs>, device: &str) -> Result<Journal> {
        let inputs = inputs.into();
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
                    "{ANOTHER_SEARCH} {} (it holds {}); wait for it to finish \
                     or give another --out",
                    dir.display(),
                    lock_path.display()
                )))
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(environment(&lock_path, "lock", e)),
        }
        let path = dir.join("trials.jsonl");
        let text = read_journal(&path)?;
        let mut done = HashMap::new();
        let (mut read, mut skipped_lines) = (0usize, 0usize);
        let (mut checksum_failed, mut others) = (0usize, HashMap::new());
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(l) = serde_json::from_str::<Line>(line) else {
                skipped_lines += 1;
                continue;
            };
            read += 1;
            let seal = seal_of(line);
            if seal == Seal::Broken {
                checksum_failed += 1;
                continue;
            }
            let expected = inputs.for_device(&l.device);
            let same = seal == Seal::Holds
                && l.inputs.as_ref() == Some(&expected)
                && l.key.as_deref() == Some(expected.key(&l.device).as_str());
            if same {
                done.insert((l.device, l.candidate.key()), l.record);
            } else if l.record.status.is_verdict() {
                // A failure of the moment is run again anyway: not news.
                let inputs = l.inputs.unwrap_or_else(|| {
                    Inputs::new().with("format", "an older segtune's, without its inputs")
                });
                let key = (device_class(&l.device), l.candidate.key());
                others.insert(key, (l.device, inputs));
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
            config_hash: inputs.get("config").unwrap_or_default().to_string(),
            inputs,
            device: device.to_string(),
            done,
            needs_newline: !text.is_empty() && !text.ends_with('\n'),
            skipped_lines,
            checksum_failed,
            others,
            asked_others: Default::default(),
        })
    }

    /// The candidate's verdict on this device, if a run found one: a
    /// record of a failure of the host or the moment (a crash, a timeout,
    /// the host's refusal) is kept in the file but never reused.
    pub fn get(&self, c: &Candidate) -> Option<&TrialRecord> {
        let found = self
            .done
            .get(&(self.device.clone(), c.key()))
            .filter(|r| r.status.is_verdict());
        let other = (device_class(&self.device), c.key());
        if found.is_none() && self.others.contains_key(&other) {
            if let Ok(mut asked) = self.asked_others.lock() {
                asked.insert(other);
            }
        }
        found
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

    /// Rows that were not reused: the candidates asked for so far that had
    /// a verdict of other inputs only (evaluated again), with what differs;
    /// and the lines failing their checksum.
    pub fn not_reused(&self) -> NotReused {
        let asked = self
            .asked_others
            .lock()
            .map(|a| a.clone())
            .unwrap_or_default();
        let (devices, theirs): (Vec<&str>, Vec<Inputs>) = asked
            .iter()
            .filter_map(|k| self.others.get(k))
            .map(|(d, i)| (d.as_str(), i.clone()))
            .unzip();
        NotReused {
            other_inputs: theirs.len(),
            differences: differences(&theirs, &self.inputs, &devices),
            checksum_failed: self.checksum_failed,
        }
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
        let inputs = self.inputs.for_device(&self.device);
        let line = Line {
            config_hash: self.config_hash.clone(),
            device: self.device.clone(),
            candidate: *c,
            record: record.clone(),
            run: run.cloned(),
            key: Some(inputs.key(&self.device)),
            inputs: Some(inputs),
        };
        let mut text = String::new();
        if self.needs_newline {
            text.push('\n');
        }
        text.push_str(&sealed(
            &serde_json::to_string(&line).expect("journal lines serialise"),
        ));
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

    /// The inputs of this search's rows.
    pub fn inputs(&self) -> &Inputs {
        &self.inputs
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
    use crate::kinds::Amp;
    use crate::search::record::{CandidateStatus, Mode, TrialRecord};

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

    fn gpu(cc: &str, trace: &str) -> Inputs {
        Inputs::from("h")
            .with("compute capability", cc)
            .with("GPU facts", format!("facts-{cc}"))
            .with("trace", trace)
    }

    #[test]
    fn rows_of_other_inputs_are_not_reused_and_what_differs_is_said() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut j = Journal::open(dir.path(), gpu("6.1", "meta"), "predicted").unwrap();
            j.append(&candidate(1), &record()).unwrap();
            j.set_device("cuda:0");
            j.append(&candidate(2), &record()).unwrap();
        }
        let mut j = Journal::open(dir.path(), gpu("8.6", "meta"), "predicted").unwrap();
        assert_eq!(j.not_reused().other_inputs, 0, "nothing asked yet");
        assert!(j.get(&candidate(1)).is_none());
        assert!(j.get(&candidate(3)).is_none());
        assert_eq!(j.not_reused().other_inputs, 1);
        // The preset facts' hash differs too; the named input says it.
        assert_eq!(
            j.not_reused().differences.as_deref(),
            Some("compute capability 6.1, now 8.6")
        );
        j.append(&candidate(1), &record()).unwrap();
        drop(j);
        let j = Journal::open(dir.path(), gpu("6.1", "meta"), "predicted").unwrap();
        assert!(j.get(&candidate(1)).is_some(), "its own rows are kept");
        assert_eq!(j.not_reused().other_inputs, 0);
        drop(j);
        let mut j = Journal::open(dir.path(), gpu("8.6", "meta"), "predicted").unwrap();
        assert!(j.get(&candidate(1)).is_some());
        j.set_device("cuda:1");
        assert!(j.get(&candidate(2)).is_none());
        assert_eq!(j.not_reused().other_inputs, 1, "cuda:0's candidate 2");
        drop(j);
        // A real trial does not trace: another trace kind reuses it.
        let mut j = Journal::open(dir.path(), gpu("6.1", "cpu"), "predicted").unwrap();
        assert!(j.get(&candidate(1)).is_none());
        j.set_device("cuda:0");
        assert!(j.get(&candidate(2)).is_some());
    }

    #[test]
    fn an_edited_row_fails_its_checksum_and_an_unkeyed_one_is_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut j = Journal::open(dir.path(), "h", "d").unwrap();
            j.append(&candidate(1), &record()).unwrap();
        }
        let path = dir.path().join("trials.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(seal_of(text.trim_end()), Seal::Holds);
        std::fs::write(&path, text.replace("\"oom\"", "\"fits\"")).unwrap();
        let j = Journal::open(dir.path(), "h", "d").unwrap();
        assert!(j.get(&candidate(1)).is_none());
        assert_eq!(j.not_reused().checksum_failed, 1);
        assert!(rows(dir.path()).unwrap().is_empty());
        drop(j);
        // A row of an older segtune: no inputs, no checksum.
        let mut row: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        for field in ["inputs", "key", "checksum"] {
            row.as_object_mut().unwrap().remove(field);
        }
        std::fs::write(&path, format!("{row}\n")).unwrap();
        let j = Journal::open(dir.path(), "h", "d").unwrap();
        assert!(j.get(&candidate(1)).is_none());
        assert_eq!(j.not_reused().other_inputs, 1);
        assert!(j
            .not_reused()
            .differences
            .as_deref()
            .unwrap()
            .contains("older segtune"));
    }
}
