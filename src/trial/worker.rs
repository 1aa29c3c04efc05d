//! The parent side of the protocol: runs the `segtune-torch` worker next to
//! the running executable on a [`TrialRequest`] and reads its
//! [`TrialReport`] back. A worker's end is classified from what the worker
//! itself reported: its report on stdout, or its refusal (a
//! [`WorkerRefusal`] line on stdout with exit code 2: an input error,
//! passed on as the worker rendered it). Exit code 2 alone is no input
//! error: `srun` and slurmstepd exit 2 too (a `chdir` or `execve` that
//! failed). A worker that dies, hangs past its time or answers nothing
//! readable becomes a report with status `crash` or `timeout` that says
//! how; an `srun` that could not run it at all is an environment error
//! with `srun`'s own words.
//!
//! Every worker process (spawned here, `srun`, the Python worker) leads a
//! process group of its own, dying with segtune (`PR_SET_PDEATHSIG`): at
//! its deadline, on a signal to segtune, and when it ends, the whole group
//! is killed (a grandchild holding its pipes included), and its pipes are
//! read for [`DRAIN_GRACE`] more at most, so that nothing outlives its
//! deadline by more than that.

use super::launcher::{self, LiveJob, SlurmLauncher, SrunOutcome};
use super::{ModelSummary, TrialReport, TrialRequest, TrialStatus};
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The worker's exit code for input errors (as `segtune`'s).
pub const EXIT_INPUT_ERROR: i32 = 2;

/// How long `inspect` (a model built, nothing run) may take.
const INSPECT_DEADLINE: Duration = Duration::from_secs(600);

/// How long the worker may take to count the CUDA devices.
const DEVICES_DEADLINE: Duration = Duration::from_secs(120);

/// How long a worker's pipes are read after its group was killed: a
/// process that left the group (its own `setsid`) and keeps them open is
/// abandoned then, its output so far kept.
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// What the worker prints on stdout, one JSON line, when it exits with
/// [`EXIT_INPUT_ERROR`] without a report: the only exit 2 taken for the
/// worker's own refusal.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkerRefusal {
    pub segtune_worker_error: RefusalBody,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefusalBody {
    pub kind: RefusalKind,
    /// The message, rendered for the user as segtune would print it.
    pub message: String,
}

/// Why the worker refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// The request's config or model (`Error::Rendered` here).
    Input,
    /// The worker's machine (a file it cannot write, a library).
    Environment,
    /// Its command line: a `segtune-torch` of another build than segtune.
    Usage,
}

impl WorkerRefusal {
    /// The line the worker prints (with its newline).
    pub fn line(kind: RefusalKind, message: &str) -> String {
        let refusal = WorkerRefusal {
            segtune_worker_error: RefusalBody {
                kind,
                message: message.to_string(),
            },
        };
        serde_json::to_string(&refusal).unwrap_or_default() + "\n"
    }

    fn error(self, worker: &Path) -> Error {
        let RefusalBody { kind, message } = self.segtune_worker_error;
        match kind {
            RefusalKind::Input => Error::Rendered(message),
            RefusalKind::Environment => Error::environment(message),
            RefusalKind::Usage => Error::environment(format!(
                "the worker {} refused the command line segtune gave it (a segtune-torch of \
                 another build?); build both with `cargo build --release`: {}",
                worker.display(),
                message.trim()
            )),
        }
    }
}

/// The `segtune-torch` worker binary, run here or, with a launcher, as a
/// Slurm job step (`--launcher slurm`).
#[derive(Debug, Clone)]
pub struct Worker {
    path: PathBuf,
    launcher: Option<Arc<SlurmLauncher>>,
}

/// What a finished worker process left.
pub(super) struct Finished {
    pub(super) status: Option<std::process::ExitStatus>,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: Vec<u8>,
    pub(super) timed_out: bool,
    /// Stopped before its deadline, and why (`srun` waiting on a Slurm
    /// controller that does not answer).
    pub(super) stopped: Option<String>,
    /// Run through `srun`: what its stderr said of the job.
    pub(super) srun: Option<SrunOutcome>,
}

impl Finished {
    /// The worker's own refusal: exit code 2 with its [`WorkerRefusal`]
    /// line on stdout (never exit 2 alone, which `srun` gives too).
    fn refusal(&self, worker: &Path) -> Option<Error> {
        if self.status.and_then(|s| s.code()) != Some(EXIT_INPUT_ERROR) {
            return None;
        }
        String::from_utf8_lossy(&self.stdout)
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<WorkerRefusal>(l.trim()).ok())
            .map(|r| r.error(worker))
    }

    /// The worker's own stderr (without `srun`'s lines).
    fn worker_stderr(&self) -> String {
        let text = String::from_utf8_lossy(&self.stderr);
        if self.srun.is_none() {
            return text.into_owned();
        }
        text.lines()
            .filter(|l| !launcher::is_srun_line(l))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// How the worker ended when it left no report.
    fn death(&self) -> WorkerDeath {
        WorkerDeath::of(self.status, self.worker_stderr().as_bytes())
    }
}

impl Worker {
    /// The worker next to the running executable (`cargo build` puts both
    /// binaries in one directory).
    pub fn locate() -> Result<Worker> {
        let exe = std::env::current_exe().ok();
        let path = exe
            .as_ref()
            .and_then(|e| e.parent())
            .map(|d| d.join("segtune-torch"))
            .filter(|w| w.is_file())
            .ok_or_else(|| {
                Error::environment(
                    "segtune-torch (the libtorch worker) is not next to segtune; build both with `cargo build --release`",
                )
            })?;
        Ok(Worker {
            path,
            launcher: None,
        })
    }

    /// A worker binary at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Worker {
        Worker {
            path: path.into(),
            launcher: None,
        }
    }

    /// This worker, its trials run as Slurm job steps by `launcher` (the
    /// binary on a path the nodes share).
    pub fn launched_by(mut self, launcher: Arc<SlurmLauncher>) -> Worker {
        self.launcher = Some(launcher);
        self
    }

    pub fn launcher(&self) -> Option<&SlurmLauncher> {
        self.launcher.as_deref()
    }

    /// The binary's identity in a cache key (its path, size and
    /// modification time): what a rebuilt segtune computes anew.
    pub fn stamp(&self) -> String {
        std::fs::metadata(&self.path)
            .ok()
            .map(|m| {
                let modified = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                format!("{}:{}:{modified}", self.path.display(), m.len())
            })
            .unwrap_or_default()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Starts `n` fork servers for this worker's CPU requests now (their
    /// libtorch loads while segtune does other work); none on Slurm.
    pub fn prestart_servers(&self, n: usize) {
        if self.launcher.is_none() && super::fork_server::enabled() {
            super::fork_server::prestart(&self.path, n);
        }
    }

    /// Runs one trial and returns its report. `Err` only for input errors
    /// the worker found before any step (its message is already rendered)
    /// and for a worker that cannot start.
    pub fn trial(&self, request: &TrialRequest, timeout: Option<Duration>) -> Result<TrialReport> {
        // A CPU trial (a traced step) is forked; CUDA gets a spawned worker.
        let forkable = request.device == super::DeviceChoice::Cpu;
        let run = self.run_launched(&request.to_argv(), timeout, forkable)?;
        // The worker's own refusal first: Slurm did not end that job.
        if let Some(e) = run.refusal(&self.path) {
            return Err(e);
        }
        if let Some(srun) = &run.srun {
            if let Some(report) = slurm_report(request, srun, &run)? {
                return Ok(report);
            }
        }
        if run.timed_out {
            let secs = timeout.map_or(0, |t| t.as_secs());
            return Ok(TrialReport::unanswered(
                request,
                TrialStatus::Timeout,
                format!("no result within {secs} s (its deadline); the trial was stopped"),
            ));
        }
        match serde_json::from_slice::<TrialReport>(&run.stdout) {
            Ok(report) => Ok(report),
            Err(_) => {
                if let Some(srun) = &run.srun {
                    if let Some(e) = launcher_failure(srun, &run) {
                        return Err(e);
                    }
                }
                let death = run.death();
                Ok(TrialReport::unanswered(
                    request,
                    death.cause.status(),
                    death.to_string(),
                ))
            }
        }
    }

    /// `segtune inspect`: the model's types and parameter counts.
    pub fn inspect(&self, config: &Path, cfg_options: &[String]) -> Result<ModelSummary> {
        let mut argv: Vec<OsString> = vec!["inspect".into(), config.into(), "--json".into()];
        if !cfg_options.is_empty() {
            argv.push("--cfg-options".into());
            argv.extend(cfg_options.iter().map(OsString::from));
        }
        let run = self.run(&argv, Some(INSPECT_DEADLINE), true)?;
        if let Some(e) = run.refusal(&self.path) {
            return Err(e);
        }
        if run.timed_out {
            return Err(Error::environment(format!(
                "the inspection gave no answer within {} s; its worker was stopped",
                INSPECT_DEADLINE.as_secs()
            )));
        }
        serde_json::from_slice(&run.stdout).map_err(|_| {
            Error::Trial(format!(
                "the inspection failed: {}",
                WorkerDeath::of(run.status, &run.stderr)
            ))
        })
    }

    /// The number of CUDA devices libtorch sees (0 when the worker cannot
    /// tell). Asked once per worker and process: the first call asks, any
    /// other (an atlas's next search) takes its answer.
    pub fn cuda_devices(&self) -> usize {
        type Counts = std::collections::HashMap<String, Arc<std::sync::OnceLock<usize>>>;
        static COUNTS: std::sync::Mutex<Option<Counts>> = std::sync::Mutex::new(None);
        let slurm = self
            .launcher
            .as_ref()
            .map(|l| (&l.partition, l.gpus_per_trial, &l.extra_args));
        let key = format!("{}|{slurm:?}", self.stamp());
        let once = match COUNTS.lock() {
            Ok(mut counts) => counts
                .get_or_insert_with(Default::default)
                .entry(key)
                .or_default()
                .clone(),
            Err(_) => Arc::new(std::sync::OnceLock::new()),
        };
        *once.get_or_init(|| self.count_cuda_devices())
    }

    /// Starts [`Worker::cuda_devices`] on a thread, so that libtorch's load
    /// overlaps other work.
    pub fn prefetch_cuda_devices(&self) {
        let worker = self.clone();
        std::thread::spawn(move || worker.cuda_devices());
    }

    fn count_cuda_devices(&self) -> usize {
        self.run_launched(&["devices".into()], Some(DEVICES_DEADLINE), false)
            .ok()
            .filter(|r| !r.timed_out)
            .and_then(|r| String::from_utf8(r.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Runs the worker here: through a fork server where `forkable` (no
    /// CUDA in the request) and one can be had, else spawned.
    fn run(
        &self,
        argv: &[OsString],
        timeout: Option<Duration>,
        forkable: bool,
    ) -> Result<Finished> {
        if forkable && super::fork_server::enabled() {
            if let Some(run) = super::fork_server::run_forked(&self.path, argv, timeout)? {
                return Ok(run);
            }
        }
        let mut command = Command::new(&self.path);
        command.args(argv);
        run_child(command, &self.path, timeout)
    }

    /// Runs the worker where its launcher says: here, or as a Slurm job
    /// step (cancelled with `scancel` when it misses its deadline, as
    /// killing `srun` alone may leave the step running).
    fn run_launched(
        &self,
        argv: &[OsString],
        timeout: Option<Duration>,
        forkable: bool,
    ) -> Result<Finished> {
        let Some(slurm) = &self.launcher else {
            return self.run(argv, timeout, forkable);
        };
        let name = slurm.next_job_name();
        if let Some(why) = launcher::controller_lost() {
            return Err(Error::environment(format!(
                "{why}; job {name} was not started"
            )));
        }
        let _live = LiveJob::register(slurm, &name);
        let command = slurm.command(&name, &self.path, argv);
        let mut run = run_watched(
            command,
            Path::new(&slurm.srun),
            timeout,
            &mut |stderr, ran| controller_gone(slurm, stderr, ran),
        )?;
        if run.timed_out || run.stopped.is_some() {
            slurm.cancel(&name);
        }
        let mut srun = SrunOutcome::parse(&String::from_utf8_lossy(&run.stderr));
        if let Some(step) = &srun.step_id {
            launcher::note_launched_job(step);
        }
        if let Some(why) = &run.stopped {
            srun.end = Some(launcher::SlurmEnd::Unreachable);
            srun.line = Some(why.clone());
        }
        let failed = !run.status.is_some_and(|s| s.success());
        if srun.end.is_none() && failed && !run.timed_out {
            srun.end_from_slurm(slurm, run.status);
        }
        if srun.end == Some(launcher::SlurmEnd::Unreachable) {
            launcher::note_controller_lost(&format!(
                "the Slurm controller (slurmctld) does not answer ({}); start it again, or \
                 search without --launcher slurm",
                srun.line.as_deref().unwrap_or("")
            ));
        }
        run.srun = Some(srun);
        Ok(run)
    }
}

/// Whether an `srun` that has run for `ran`, having written `stderr` so
/// far, should be stopped because the Slurm controller is gone: `srun` said
/// so, another trial found it so, or the job still has no allocation after
/// [`SlurmLauncher::check_after`] and the controller does not answer
/// `scontrol ping` (a queued `srun` would otherwise wait for ever).
fn controller_gone(slurm: &SlurmLauncher, stderr: &[u8], ran: Duration) -> Option<String> {
    let text = String::from_utf8_lossy(stderr);
    if let Some(line) = text
        .lines()
        .find(|l| l.contains("Unable to contact slurm controller"))
    {
        return Some(line.trim().to_string());
    }
    if launcher::controller_lost().is_some() {
        return Some("another trial found the Slurm controller gone".into());
    }
    if ran < slurm.check_after || SrunOutcome::parse(&text).allocated {
        return None;
    }
    slurm.controller_answers().err().map(|why| {
        format!(
            "the job had no allocation after {} s and {why}",
            ran.as_secs()
        )
    })
}

/// An `srun` that failed without a report and without Slurm saying it
/// ended the job: `srun` or slurmstepd could not run the worker (a usage
/// error of `--srun-args`, a `chdir` or `execve` that failed), said in its
/// own words; or the step never started. `None`: the worker ran and died
/// (its death says how).
fn launcher_failure(srun: &SrunOutcome, run: &Finished) -> Option<Error> {
    if run.status.is_some_and(|s| s.success()) {
        return None;
    }
    let how = match run.status.and_then(|s| s.code()) {
        Some(code) => format!("srun exited with code {code}"),
        None => "srun ended by a signal".to_string(),
    };
    if !srun.complaints.is_empty() {
        return Some(Error::environment(format!(
            "srun could not run the worker ({how}): {}; check --srun-args and the cluster",
            srun.complaints.join(" | ")
        )));
    }
    if srun.step_id.is_none() {
        let said = String::from_utf8_lossy(&run.stderr)
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .map(|l| format!(": {}", l.chars().take(300).collect::<String>()))
            .unwrap_or_default();
        return Some(Error::environment(format!(
            "srun ended before the worker's job step started ({how}){said}; check --srun-args and the cluster"
        )));
    }
    None
}

/// The report of a Slurm job that Slurm ended (cancelled, out of time,
/// preempted, its node failed): a typed failure, never a verdict on the
/// candidate. A job Slurm refused is the environment's error. `None` when
/// Slurm let the worker end on its own.
fn slurm_report(
    request: &TrialRequest,
    srun: &SrunOutcome,
    run: &Finished,
) -> Result<Option<TrialReport>> {
    use launcher::SlurmEnd;
    let Some(end) = srun.end else {
        return Ok(None);
    };
    let said = srun.line.as_deref().unwrap_or("");
    let job = srun
        .step_id
        .as_deref()
        .map_or(String::new(), |s| format!(" (job step {s})"));
    if end == SlurmEnd::Refused {
        return Err(Error::environment(format!("{}: {said}", end.describe())));
    }
    // A report printed before the end still stands (the step was cancelled
    // after its worker answered, or srun lost the controller after it).
    if let Ok(report) = serde_json::from_slice::<TrialReport>(&run.stdout) {
        return Ok(Some(report));
    }
    if end == SlurmEnd::Unreachable {
        return Err(Error::environment(format!(
            "{}{job}: {said}; start slurmctld again (or search without --launcher slurm)",
            end.describe()
        )));
    }
    let status = match end {
        SlurmEnd::TimeLimit => TrialStatus::Timeout,
        _ => TrialStatus::Crash,
    };
    Ok(Some(TrialReport::unanswered(
        request,
        status,
        format!("{}{job}: {said}", end.describe()),
    )))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_is_named_with_its_likely_cause() {
        use std::os::unix::process::ExitStatusExt;
        let death = |raw, stderr: &[u8]| {
            WorkerDeath::of(Some(std::process::ExitStatus::from_raw(raw)), stderr)
        };
        let killed = death(9, b"");
        assert_eq!(killed.cause, DeathCause::Killed);
        assert!(killed.to_string().contains("out-of-memory killer"));
        let host_oom = death(6, b"memory allocation of 4096 bytes failed\n");
        assert_eq!(host_oom.cause.status(), TrialStatus::HostOom);
        let text = host_oom.to_string();
        assert!(text.starts_with("host out of memory: "), "{text}");
        assert!(
            text.ends_with(": memory allocation of 4096 bytes failed"),
            "{text}"
        );
        let aborted = death(6, b"");
        assert_eq!(aborted.cause.status(), TrialStatus::Crash);
        assert!(aborted.to_string().contains("SIGABRT"));
        let exited = death(101 << 8, b"thread 'main' panicked\n");
        assert_eq!(exited.code, Some(101));
        let text = exited.to_string();
        assert!(
            text.contains("code 101") && text.contains("panicked"),
            "{text}"
        );
        let unobserved = WorkerDeath::of(None, b"");
        assert_eq!(
            unobserved.to_string(),
            "the worker's end could not be observed"
        );
    }

    #[test]
    fn a_missing_worker_is_an_environment_error() {
        let worker = Worker::at("/nonexistent/segtune-torch");
        let err = worker.trial(&TrialRequest::new("x.py"), None).unwrap_err();
        assert!(matches!(err, Error::Environment { .. }), "{err}");
    }

    /// A stand-in for `srun` that writes `stderr` and exits with `code`.
    fn fake_srun(dir: &Path, stderr: &str, code: i32) -> Arc<SlurmLauncher> {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("srun");
        std::fs::write(
            &script,
            format!("#!/bin/sh\ncat >&2 <<'EOF'\n{stderr}\nEOF\nexit {code}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut launcher = SlurmLauncher::new("test");
        launcher.srun = script.into_os_string();
        launcher.scancel = "true".into();
        launcher.scontrol = "true".into();
        Arc::new(launcher)
    }

    #[test]
    fn a_job_slurm_ended_is_a_typed_failure_that_names_its_step() {
        let dir = tempfile::tempdir().unwrap();
        let request = TrialRequest::new("x.py");
        let run = |stderr: &str, code: i32| {
            let _ = launcher::take_launched_jobs();
            let worker = Worker::at("/nonexistent/segtune-torch").launched_by(fake_srun(
                dir.path(),
                stderr,
                code,
            ));
            let report = worker.trial(&request, None);
            (report, launcher::take_launched_jobs())
        };
        let (report, jobs) = run(
            "srun: launching StepId=9.0 on host n1, 1 tasks: 0\n\
             slurmstepd-n1: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-12-05T00:15:59 DUE TO TIME LIMIT ***",
            143,
        );
        let report = report.unwrap();
        assert_eq!(report.status, TrialStatus::Timeout);
        let message = report.message.unwrap();
        assert!(
            message.contains("time limit") && message.contains("9.0"),
            "{message}"
        );
        assert_eq!(jobs, vec!["9.0".to_string()]);
        let (report, _) = run(
            "srun: launching StepId=4.0 on host n1, 1 tasks: 0\n\
             slurmstepd-n1: error: *** STEP 4.0 ON n1 CANCELLED AT 2026-12-05T00:14:41 ***",
            143,
        );
        let report = report.unwrap();
        assert_eq!(report.status, TrialStatus::Crash);
        assert!(report.message.unwrap().contains("Slurm cancelled"));
        let (refused, jobs) = run(
            "srun: error: Unable to allocate resources: Invalid partition name specified",
            1,
        );
        let err = refused.unwrap_err();
        assert!(matches!(err, Error::Environment { .. }), "{err}");
        assert!(err.to_string().contains("Invalid partition"), "{err}");
        assert!(jobs.is_empty());
        // A worker that exits on its own through srun: its own last line,
        // not srun's.
        let (report, _) = run(
            "srun: launching StepId=5.0 on host n1, 1 tasks: 0\n\
             thread 'main' panicked at x.rs\n\
             srun: error: n1: task 0: Exited with exit code 101",
            101,
        );
        let message = report.unwrap().message.unwrap();
        assert!(message.ends_with("panicked at x.rs"), "{message}");
        // SIGTERM'd under srun with nothing said: Slurm terminated it.
        let (report, _) = run("srun: launching StepId=6.0 on host n1, 1 tasks: 0", 143);
        let report = report.unwrap();
        assert_eq!(report.status, TrialStatus::Crash);
        let message = report.message.unwrap();
        assert!(
            message.contains("Slurm terminated") && message.contains("143"),
            "{message}"
        );
    }

    /// A stand-in for `srun` running `body` (a shell script's lines).
    fn fake_srun_running(dir: &Path, body: &str) -> Arc<SlurmLauncher> {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("srun-body");
        std::fs::write(&script, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut launcher = SlurmLauncher::new("test");
        launcher.srun = script.into_os_string();
        launcher.scancel = "true".into();
        launcher.scontrol = "true".into();
        Arc::new(launcher)
    }

    /// Exit code 2 is the worker's refusal only with its line on stdout:
    /// srun's and slurmstepd's own exit 2 (an `execve` or `chdir` that
    /// failed), a usage error of `--srun-args` and an srun that never
    /// started the step are environment errors in srun's words.
    #[test]
    fn an_srun_that_cannot_run_the_worker_is_the_environments_error_in_its_words() {
        let dir = tempfile::tempdir().unwrap();
        let request = TrialRequest::new("x.py");
        let trial = |stderr: &str, code: i32| {
            Worker::at("/nonexistent/segtune-torch")
                .launched_by(fake_srun(dir.path(), stderr, code))
                .trial(&request, None)
        };
        let cases = [
            (
                "srun: launching StepId=7.0 on host vm, 1 tasks: 0\n\
                 srun: error: vm: task 0: Exited with exit code 2\n\
                 slurmstepd-vm: error: execve(): ;: No such file or directory",
                2,
                "execve(): ;: No such file or directory",
            ),
            (
                "slurmstepd-vm: error: couldn't chdir to `/nonexistent': No such file or directory",
                2,
                "couldn't chdir to `/nonexistent'",
            ),
            (
                "srun: unrecognized option '--bogus-flag'\nTry \"srun --help\" for more information",
                255,
                "srun: unrecognized option '--bogus-flag'",
            ),
            ("srun: something odd", 1, "before the worker's job step started"),
        ];
        for (stderr, code, want) in cases {
            let err = trial(stderr, code).unwrap_err();
            assert!(matches!(err, Error::Environment { .. }), "{stderr}: {err}");
            let text = err.to_string();
            assert!(text.contains(want), "{text}");
            assert!(
                text.contains(&format!("srun exited with code {code}")),
                "{text}"
            );
        }
        // The worker's own refusal through srun: its rendered message.
        let line = WorkerRefusal::line(RefusalKind::Input, "error: no such key `model.x`\n");
        let launcher = fake_srun_running(
            dir.path(),
            &format!(
                "echo 'srun: launching StepId=8.0 on host vm, 1 tasks: 0' >&2\n\
                 printf '%s' '{}'\nexit 2",
                line.trim_end()
            ),
        );
        let err = Worker::at("/nonexistent/segtune-torch")
            .launched_by(launcher)
            .trial(&request, None)
            .unwrap_err();
        assert!(
            matches!(&err, Error::Rendered(m) if m.contains("no such key `model.x`")),
            "{err:?}"
        );
    }

    /// A worker that starts a grandchild holding its pipes is killed with
    /// it at the deadline, and its pipes are given up on within
    /// [`DRAIN_GRACE`]: nothing hangs, nothing is left running.
    #[test]
    fn a_worker_is_killed_whole_at_its_deadline_grandchildren_included() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg(format!(
            "sleep 3600 & echo $! > {}; echo started >&2; exec sleep 3600",
            pidfile.display()
        ));
        let started = Instant::now();
        let run = run_child(command, Path::new("/bin/sh"), Some(Duration::from_secs(1))).unwrap();
        let took = started.elapsed();
        assert!(run.timed_out);
        assert!(took < Duration::from_secs(4), "took {took:?}");
        assert_eq!(String::from_utf8_lossy(&run.stderr), "started\n");
        let grandchild: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // Gone, or a zombie that nobody reaped yet (its parent was killed).
        let alive = std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
            .is_ok_and(|s| !s.contains(") Z "));
        assert!(!alive, "the grandchild {grandchild} still runs");
        // One that left the group (its own setsid) and holds the pipe: the
        // pipe is abandoned after the grace, the parent returns.
        let mut command = Command::new("/bin/sh");
        command.arg("-c").arg(format!(
            "setsid sleep 30 & echo $! > {}; exit 0",
            pidfile.display()
        ));
        let started = Instant::now();
        let run = run_child(command, Path::new("/bin/sh"), Some(Duration::from_secs(60))).unwrap();
        let took = started.elapsed();
        let escaped: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: the test's own stray process.
        unsafe { libc::kill(escaped, libc::SIGKILL) };
        assert!(!run.timed_out);
        assert!(took < DRAIN_GRACE + Duration::from_secs(2), "took {took:?}");
    }

    #[test]
    fn srun_says_when_the_controller_does_not_answer() {
        let o = SrunOutcome::parse(
            "srun: error: Unable to allocate resources: Unable to contact slurm controller (connect failure)\n",
        );
        assert_eq!(o.end, Some(launcher::SlurmEnd::Unreachable));
        assert!(!o.allocated);
        let queued = SrunOutcome::parse("srun: job 12 queued and waiting for resources\n");
        assert_eq!((queued.end, queued.allocated), (None, false));
        let allocated = SrunOutcome::parse("srun: jobid 12: nodes(1):`vm', cpu counts: 1(x1)\n");
        assert!(allocated.allocated);
    }
}
