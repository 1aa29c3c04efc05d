//! A worker process run to its end or its deadline: its own process group,
//! killed whole (`killpg`) at its end, its deadline or a signal, its pipes
//! drained for [`DRAIN_GRACE`] more at most; the registry of the workers and
//! temporary directories alive now ([`stop_all_workers`] on Ctrl-C); how a
//! worker that left no report died ([`WorkerDeath`]).

use super::launcher;
use super::process::{Finished, DRAIN_GRACE};
use crate::error::{Error, Result};
use crate::trial::TrialStatus;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `command` (the program at `program`) to its end or its `timeout`,
/// killed with this process, its pipes drained: a worker of either kind.
pub(super) fn run_child(
    command: Command,
    program: &Path,
    timeout: Option<Duration>,
) -> Result<Finished> {
    run_watched(command, program, timeout, &mut |_, _| None)
}

/// [`run_child`], with `watch` asked a few times a second (with its stderr
/// so far and how long it has run) whether to stop it before its deadline
/// (`Some(why)`). The child leads a process group of its own: when it
/// ends, is stopped or misses its deadline, the group is killed, and its
/// pipes are read for [`DRAIN_GRACE`] more at most.
pub(super) fn run_watched(
    mut command: Command,
    program: &Path,
    timeout: Option<Duration>,
    watch: &mut dyn FnMut(&[u8], Duration) -> Option<String>,
) -> Result<Finished> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The worker dies with the thread that waits for it: a killed segtune
    // leaves no worker computing on.
    own_group_dying_with_parent(&mut command);
    let mut child = command
        .spawn()
        .map_err(|e| Error::io(format!("cannot run {}", program.display()), e))?;
    let pid = child.id();
    let _registered = LiveWorker::register(pid);
    let stdout = Drain::start(child.stdout.take());
    let stderr = Drain::start(child.stderr.take());
    let started = Instant::now();
    let mut timed_out = false;
    let mut stopped = None;
    let mut watched = started;
    // Until it ends (or cannot be waited for).
    while let Ok(false) = ended(pid) {
        if timeout.is_some_and(|t| started.elapsed() > t) {
            timed_out = true;
            break;
        }
        if watched.elapsed() >= Duration::from_millis(250) {
            watched = Instant::now();
            let so_far = stderr.so_far();
            if let Some(why) = watch(&so_far, started.elapsed()) {
                stopped = Some(why);
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The group, not the child alone: whatever the worker started (a
    // grandchild holding the pipes) goes too. The child is not reaped yet,
    // so its group's id is still its own.
    kill_group(pid);
    let status = child.wait().ok();
    let until = Instant::now() + DRAIN_GRACE;
    Ok(Finished {
        status,
        stdout: stdout.take(until),
        stderr: stderr.take(until),
        timed_out,
        stopped,
        srun: None,
    })
}

/// Whether the child `pid` has ended, without reaping it (`waitid` with
/// `WNOWAIT`): its process group's id stays its own until it is reaped.
fn ended(pid: u32) -> std::io::Result<bool> {
    // SAFETY: waitid(2) on our own child with a zeroed siginfo_t that it
    // fills; WNOHANG leaves `si_pid` 0 while the child runs.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(info.si_pid() != 0)
    }
}

/// SIGKILL to the process group `pid` leads and to `pid` itself (a pid
/// that leads no group: a fork server's child before its `setsid`).
pub(super) fn kill_group(pid: u32) {
    // SAFETY: kill(2)/killpg(2) of a process this one started and has not
    // reaped, and of the group it leads.
    unsafe {
        libc::killpg(pid as libc::pid_t, libc::SIGKILL);
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

/// A pipe read to its end on a thread of its own (a chatty worker never
/// blocks on a full pipe), its bytes readable so far and given up on after
/// a bound (a process outside the worker's group may hold it open).
struct Drain {
    bytes: Arc<std::sync::Mutex<Vec<u8>>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl Drain {
    fn start(pipe: Option<impl Read + Send + 'static>) -> Drain {
        let bytes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, done) = std::sync::mpsc::channel();
        let into = bytes.clone();
        std::thread::spawn(move || {
            if let Some(mut p) = pipe {
                let mut chunk = [0u8; 65536];
                while let Ok(n @ 1..) = p.read(&mut chunk) {
                    if let Ok(mut b) = into.lock() {
                        b.extend_from_slice(&chunk[..n]);
                    }
                }
            }
            let _ = tx.send(());
        });
        Drain { bytes, done }
    }

    fn so_far(&self) -> Vec<u8> {
        self.bytes.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// The bytes read once the pipe closed, or at `until` (the reading
    /// thread then abandoned, left to end when the pipe does).
    fn take(self, until: Instant) -> Vec<u8> {
        let _ = self
            .done
            .recv_timeout(until.saturating_duration_since(Instant::now()));
        self.so_far()
    }
}

/// Workers running now and temporary files in use, so that a segtune
/// stopped by SIGINT or SIGTERM can stop the one and remove the other
/// ([`stop_all_workers`]).
static LIVE: std::sync::Mutex<(Vec<u32>, Vec<std::path::PathBuf>)> =
    std::sync::Mutex::new((Vec::new(), Vec::new()));

/// A worker's pid in [`LIVE`] for as long as this lives.
pub(super) struct LiveWorker(u32);

impl LiveWorker {
    pub(super) fn register(pid: u32) -> LiveWorker {
        if let Ok(mut live) = LIVE.lock() {
            live.0.push(pid);
        }
        LiveWorker(pid)
    }
}

impl Drop for LiveWorker {
    fn drop(&mut self) {
        if let Ok(mut live) = LIVE.lock() {
            live.0.retain(|p| *p != self.0);
        }
    }
}

/// Temporary directories are `segtune-<pid>-<random>`: the pid says whose.
const TEMP_PREFIX: &str = "segtune-";

/// Where temporary directories go when not the system's: a directory the
/// Slurm nodes share (`--launcher slurm`), as a traced step's file is
/// written on the node and read here.
static TEMP_ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Puts this process's temporary directories under `dir` (created), from
/// now on; the first call wins.
pub fn set_temp_root(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let _ = TEMP_ROOT.set(dir.to_path_buf());
    Ok(())
}

fn temp_root() -> PathBuf {
    TEMP_ROOT.get().cloned().unwrap_or_else(std::env::temp_dir)
}

/// Removes the temporary directories of segtune processes that no longer
/// exist: a segtune killed with SIGKILL cannot clean up after itself, so
/// the next one does.
fn remove_stale_temp_dirs() {
    let Ok(entries) = std::fs::read_dir(temp_root()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(TEMP_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: kill(2) with signal 0 only asks whether the pid exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A temporary directory in [`LIVE`] for as long as this lives (removed by
/// its owner when dropped, by [`stop_all_workers`] on a signal).
pub struct LiveTempDir(pub tempfile::TempDir);

impl LiveTempDir {
    pub fn new() -> std::io::Result<LiveTempDir> {
        // Created under the lock: a signal handler holding it sees every
        // directory there is.
        let mut live = LIVE
            .lock()
            .map_err(|_| std::io::Error::other("segtune is stopping"))?;
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(remove_stale_temp_dirs);
        let prefix = format!("{TEMP_PREFIX}{}-", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix(&prefix)
            .tempdir_in(temp_root())?;
        live.1.push(dir.path().to_path_buf());
        Ok(LiveTempDir(dir))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for LiveTempDir {
    fn drop(&mut self) {
        if let Ok(mut live) = LIVE.lock() {
            live.1.retain(|p| p != self.0.path());
        }
    }
}

/// Kills every running worker and removes every temporary directory in
/// use: what a signal handler calls before segtune exits.
pub fn stop_all_workers() {
    launcher::cancel_live_jobs();
    let Ok(live) = LIVE.lock() else {
        return;
    };
    kill_workers(&live.0);
    for dir in &live.1 {
        let _ = std::fs::remove_dir_all(dir);
    }
    // Held until the process exits: no new directory after this.
    std::mem::forget(live);
}

/// Stops every worker running now (killed here, `scancel`led on Slurm),
/// leaving temporary directories to their owners: what a search that fails
/// calls so that none of its trials runs on.
pub fn stop_running_workers() {
    launcher::cancel_live_jobs();
    if let Ok(live) = LIVE.lock() {
        kill_workers(&live.0);
    }
}

/// SIGKILL to each worker and the process group it leads.
fn kill_workers(pids: &[u32]) {
    for pid in pids {
        kill_group(*pid);
    }
}

/// How a worker that left no report ended: its exit code or signal, the
/// likely cause, and the last line it wrote on stderr. Displayed as the
/// report's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerDeath {
    /// The exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    pub cause: DeathCause,
    /// The last non-empty line of its stderr, trimmed.
    pub last_line: Option<String>,
}

/// The likely cause of a worker's death, from how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeathCause {
    /// SIGKILL: most likely the kernel's out-of-memory killer.
    Killed,
    /// SIGABRT after a failed allocation: Rust's allocator aborts when the
    /// worker's data-memory limit refuses one (see `trial::run::run`).
    HostOutOfMemory,
    /// SIGABRT for another reason.
    Aborted,
    /// SIGSEGV.
    Segfault,
    /// Any other signal.
    OtherSignal,
    /// An exit without a report.
    Exited,
    /// Neither an exit code nor a signal.
    Ended,
    /// The wait for it failed.
    Unobserved,
}

impl DeathCause {
    /// The trial's status: `host_oom` for the host's memory, else `crash`.
    pub fn status(self) -> TrialStatus {
        match self {
            DeathCause::HostOutOfMemory => TrialStatus::HostOom,
            _ => TrialStatus::Crash,
        }
    }
}

impl WorkerDeath {
    /// How the worker ended with `status` (`None`: not observed), having
    /// written `stderr`.
    pub fn of(status: Option<std::process::ExitStatus>, stderr: &[u8]) -> WorkerDeath {
        use std::os::unix::process::ExitStatusExt;
        let last_line = String::from_utf8_lossy(stderr)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_string());
        let (code, signal) = status.map_or((None, None), |s| (s.code(), s.signal()));
        let cause = match (status, code, signal) {
            (None, _, _) => DeathCause::Unobserved,
            (_, _, Some(9)) => DeathCause::Killed,
            (_, _, Some(6))
                if last_line
                    .as_deref()
                    .is_some_and(|l| l.contains("memory allocation of")) =>
            {
                DeathCause::HostOutOfMemory
            }
            (_, _, Some(6)) => DeathCause::Aborted,
            (_, _, Some(11)) => DeathCause::Segfault,
            (_, _, Some(_)) => DeathCause::OtherSignal,
            (_, Some(_), None) => DeathCause::Exited,
            (_, None, None) => DeathCause::Ended,
        };
        WorkerDeath {
            code,
            signal,
            cause,
            last_line,
        }
    }
}

impl std::fmt::Display for WorkerDeath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.cause, self.code, self.signal) {
            (DeathCause::Killed, ..) => f.write_str(
                "the worker was killed (SIGKILL), most likely by the kernel's out-of-memory killer: the host ran out of RAM",
            )?,
            (DeathCause::HostOutOfMemory, ..) => f.write_str(
                "host out of memory: the worker reached its memory limit (this host's available RAM) and aborted",
            )?,
            (DeathCause::Aborted, ..) => f.write_str("the worker aborted (SIGABRT)")?,
            (DeathCause::Segfault, ..) => f.write_str("the worker crashed (SIGSEGV)")?,
            (DeathCause::OtherSignal, _, Some(sig)) => {
                write!(f, "the worker was stopped by signal {sig}")?
            }
            (DeathCause::Exited, Some(code), _) => {
                write!(f, "the worker exited with code {code} without a report")?
            }
            (DeathCause::Unobserved, ..) => f.write_str("the worker's end could not be observed")?,
            _ => f.write_str("the worker ended without a report")?,
        }
        match &self.last_line {
            Some(line) => write!(f, ": {line}"),
            None => Ok(()),
        }
    }
}

/// Makes the process `command` starts lead a session and process group of
/// its own (`setsid`: killed whole with `killpg`, and a Ctrl-C on the
/// terminal reaches segtune alone, which then stops it) and receive
/// SIGKILL when the thread that started it ends (`PR_SET_PDEATHSIG`).
pub(super) fn own_group_dying_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}
