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

pub(super) use super::child::{
    kill_group, own_group_dying_with_parent, run_child, run_watched, LiveWorker,
};
pub use super::child::{
    set_temp_root, stop_all_workers, stop_running_workers, DeathCause, LiveTempDir, WorkerDeath,
};
use super::launcher::{self, LiveJob, SlurmLauncher, SrunOutcome};
use super::ModelSummary;
use crate::error::{Error, Result};
use crate::trial::{TrialReport, TrialRequest, TrialStatus};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// The worker's command line for `request`: `run` and the request as JSON,
/// the one format every worker reads.
pub fn run_argv(request: &TrialRequest) -> Vec<OsString> {
    vec!["run".into(), request.to_json().into()]
}

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
        super::machine::libtorch()?;
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
        let forkable = request.device == crate::kinds::DeviceChoice::Cpu;
        // This machine's driver decides a local CUDA trial; a Slurm node's
        // driver is the node's to tell.
        if !forkable && self.launcher.is_none() {
            super::machine::check_cuda_trial()?;
        }
        let run = self.run_launched(&run_argv(request), timeout, forkable)?;
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

    /// Starts the worker here once and asks its CUDA devices: the count,
    /// or how it failed to start (its last words, e.g. the loader's).
    pub fn probe_devices(&self) -> std::result::Result<usize, String> {
        let run = self
            .run(&["devices".into()], Some(DEVICES_DEADLINE), false)
            .map_err(|e| e.to_string())?;
        if run.timed_out {
            return Err(format!(
                "it gave no answer within {} s",
                DEVICES_DEADLINE.as_secs()
            ));
        }
        String::from_utf8_lossy(&run.stdout)
            .trim()
            .parse()
            .map_err(|_| WorkerDeath::of(run.status, &run.stderr).to_string())
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
        super::machine::worker_env(&mut command);
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
        let mut srun = SrunOutcome::parse(&String::from_utf8_lossy(&run.stderr));
        if let Some(step) = &srun.step_id {
            launcher::note_launched_job(step);
        }
        if let Some(why) = &run.stopped {
            srun.end = Some(launcher::SlurmEnd::Unreachable);
            srun.line = Some(why.clone());
        }
        let failed = !run.status.is_some_and(|s| s.success());
        let lost = launcher::controller_lost();
        if srun.end.is_none() && failed && !run.timed_out {
            match &lost {
                // Another trial found the controller gone: asking it why
                // this job ended would wait for nothing.
                Some(why) => {
                    srun.end = Some(launcher::SlurmEnd::Unreachable);
                    srun.line = Some(why.clone());
                }
                None => srun.end_from_slurm(slurm, run.status),
            }
        }
        // A job whose srun was stopped (its deadline, a lost controller,
        // segtune's own teardown), or gave up on the controller by itself,
        // may still sit in slurmctld's saved state: cancelled, or named
        // with the command to cancel it once the controller answers.
        let unreachable = srun.end == Some(launcher::SlurmEnd::Unreachable);
        let killed = run
            .status
            .is_some_and(|s| std::os::unix::process::ExitStatusExt::signal(&s).is_some());
        if run.timed_out || run.stopped.is_some() || unreachable || killed {
            slurm.cancel(&name);
        }
        if unreachable {
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

#[cfg(test)]
#[path = "process_tests.rs"]
mod tests;
