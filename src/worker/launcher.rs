//! Where a worker process runs: here (the default), or as a Slurm job step
//! through `srun` (`--launcher slurm`), the way MMSeg's
//! `tools/slurm_train.sh` launches training. The worker binary and its
//! arguments are the same either way; `srun` forwards its stdout (the
//! trial's JSON) and stderr back. This module owns the `srun` command line,
//! the job names (`segtune-<search id>-<n>`), what `srun`'s stderr says of
//! how a job ended (cancelled, time limit, preemption, node failure), the
//! jobs live now (cancelled with `scancel` when segtune stops), and the job
//! ids each thread launched (read by the search for its journal).
//!
//! Facts of Slurm 22.05 this follows (`srun(1)`, `scancel(1)`): `srun -v`
//! prints `launching StepId=<job>.<step>` once the step starts, in an
//! allocation and from a login node alike; slurmstepd writes
//! `*** STEP <id> ON <node> CANCELLED AT <time> [DUE TO TIME LIMIT|
//! PREEMPTION|NODE FAILURE] ***` on the step's stderr; `scancel --name`
//! cancels a user's jobs of that name; inside an allocation
//! (`SLURM_JOB_ID` set) a trial is a job step given `--exact` so that
//! steps share the allocation's CPUs and GPUs instead of each taking all.
//!
//! Slurm's client tools retry a controller that does not answer for many
//! seconds (`scancel` and `scontrol show job` ~18 s each here, `srun`'s
//! allocation ~9 s), and an `srun` whose job waits in the queue waits
//! silently for ever once the controller is gone. So every `scancel` and
//! `scontrol` here runs under a bound ([`CANCEL_WAIT`], [`ASK_WAIT`]); an
//! `srun` that has no allocation after [`SlurmLauncher::check_after`] has
//! the controller asked (`scontrol ping`, answered at once by a dead
//! controller, at most every [`PING_EVERY`] for all trials) and is stopped
//! as an environment failure when it does not answer; and once any `srun`
//! finds the controller gone ([`controller_lost`]), the search stops rather
//! than fail each of its candidates in turn. A job that `scancel` could not
//! cancel is named on stderr with the command that cancels it.

use std::cell::RefCell;
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long `scancel` may take: a live controller answers in milliseconds;
/// a dead one makes `scancel` retry for ~18 s, too long for a Ctrl-C.
pub const CANCEL_WAIT: Duration = Duration::from_secs(3);

/// How long `scontrol show job` / `scontrol ping` may take.
pub const ASK_WAIT: Duration = Duration::from_secs(10);

/// How often the controller is asked whether it answers while jobs wait
/// for their allocation (one answer serves every trial).
pub const PING_EVERY: Duration = Duration::from_secs(10);

/// The default of [`SlurmLauncher::check_after`] (`SEGTUNE_SLURM_CHECK_S`
/// overrides it, for tests).
const CHECK_AFTER: Duration = Duration::from_secs(10);

/// How segtune runs its Slurm jobs (the `--launcher slurm` options).
#[derive(Debug)]
pub struct SlurmLauncher {
    /// `srun`: the program (tests point it elsewhere; default `srun` on PATH).
    pub srun: OsString,
    /// `scancel` (default on PATH).
    pub scancel: OsString,
    /// `scontrol` (default on PATH): asked how a job ended when `srun`
    /// did not say.
    pub scontrol: OsString,
    /// `--partition`.
    pub partition: Option<String>,
    /// `--gres gpu:N` (none: no GPU asked for, as a CPU trial needs).
    pub gpus_per_trial: Option<u32>,
    /// `--cpus-per-task`.
    pub cpus_per_trial: Option<u32>,
    /// `--time`, Slurm's own syntax (`MM`, `HH:MM:SS`, `D-HH`...).
    pub time: Option<String>,
    /// Passed to every `srun` as they are (`--srun-args`), before the program.
    pub extra_args: Vec<String>,
    /// `segtune-<search id>`: every job's name starts with it.
    pub job_prefix: String,
    /// Inside an allocation (`SLURM_JOB_ID` set): job steps with `--exact`.
    pub in_allocation: bool,
    /// How long an `srun` may wait for its allocation before the controller
    /// is asked whether it still answers (and every [`PING_EVERY`] after).
    pub check_after: Duration,
    next: AtomicUsize,
}

impl SlurmLauncher {
    /// A launcher whose jobs are named `segtune-<search_id>-<n>`.
    pub fn new(search_id: &str) -> SlurmLauncher {
        SlurmLauncher {
            srun: "srun".into(),
            scancel: "scancel".into(),
            scontrol: "scontrol".into(),
            partition: None,
            gpus_per_trial: None,
            cpus_per_trial: None,
            time: None,
            extra_args: Vec::new(),
            job_prefix: format!("segtune-{search_id}"),
            in_allocation: std::env::var_os("SLURM_JOB_ID").is_some_and(|v| !v.is_empty()),
            check_after: std::env::var("SEGTUNE_SLURM_CHECK_S")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .map_or(CHECK_AFTER, Duration::from_secs_f64),
            next: AtomicUsize::new(1),
        }
    }

    /// The next job's name.
    pub fn next_job_name(&self) -> String {
        format!(
            "{}-{}",
            self.job_prefix,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// The `srun` command that runs `program argv` as job `name`: one task,
    /// verbose (for the step id), killed whole when a task fails, with a
    /// `MASTER_PORT` of its own (a multi-GPU trial's rendezvous; two
    /// trials on one node must not share one).
    pub fn command(&self, name: &str, program: &Path, argv: &[OsString]) -> Command {
        let mut command = Command::new(&self.srun);
        command.args(self.srun_args(name));
        command.arg(program).args(argv);
        command.env("MASTER_PORT", master_port(name).to_string());
        super::machine::worker_env(&mut command);
        command
    }

    /// `srun`'s own arguments for job `name` (before the program).
    pub fn srun_args(&self, name: &str) -> Vec<String> {
        let mut args = vec![
            format!("--job-name={name}"),
            "--ntasks=1".into(),
            "--nodes=1".into(),
            "--kill-on-bad-exit=1".into(),
            "--verbose".into(),
        ];
        if let Some(p) = &self.partition {
            args.push(format!("--partition={p}"));
        }
        if let Some(n) = self.gpus_per_trial {
            args.push(format!("--gres=gpu:{n}"));
        }
        if let Some(n) = self.cpus_per_trial {
            args.push(format!("--cpus-per-task={n}"));
        }
        if let Some(t) = &self.time {
            args.push(format!("--time={t}"));
        }
        if self.in_allocation {
            args.push("--exact".into());
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// The state Slurm gives job `job_id` (`scontrol show job -o`:
    /// `CANCELLED`, `TIMEOUT`, `PREEMPTED`, `NODE_FAIL`, ...), while Slurm
    /// still keeps the finished job (`MinJobAge`, 300 s by default).
    /// `None` when the controller does not answer within [`ASK_WAIT`].
    pub fn job_state(&self, job_id: &str) -> Option<String> {
        let mut command = Command::new(&self.scontrol);
        command.args(["show", "job", "-o", job_id]);
        let out = output_within(command, ASK_WAIT)?;
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .find_map(|f| f.strip_prefix("JobState="))
            .map(str::to_string)
    }

    /// Cancels the job named `name` (`scancel --name`), waiting
    /// [`CANCEL_WAIT`] at most; a job that could not be cancelled is named
    /// on stderr with the command to cancel it.
    pub fn cancel(&self, name: &str) {
        cancel_all(&[(name.to_string(), self.scancel.clone())]);
    }

    /// Whether the controller answers `scontrol ping` (asked at most every
    /// [`PING_EVERY`] for all trials, [`ASK_WAIT`] at most): `Err` with
    /// what it said (`Slurmctld(primary) at vm is DOWN`) when not.
    pub fn controller_answers(&self) -> Result<(), String> {
        type Ping = Option<(Instant, OsString, Result<(), String>)>;
        static PING: Mutex<Ping> = Mutex::new(None);
        let Ok(mut last) = PING.lock() else {
            return Ok(());
        };
        if let Some((at, scontrol, answer)) = last.as_ref() {
            if *scontrol == self.scontrol && at.elapsed() < PING_EVERY {
                return answer.clone();
            }
        }
        let mut command = Command::new(&self.scontrol);
        command.arg("ping");
        let answer = match output_within(command, ASK_WAIT) {
            None => Err(format!(
                "`scontrol ping` got no answer within {} s",
                ASK_WAIT.as_secs()
            )),
            Some(out) => {
                let said = String::from_utf8_lossy(&out.stdout).to_string()
                    + &*String::from_utf8_lossy(&out.stderr);
                let first = said
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty() && !l.starts_with('*'))
                    .unwrap_or("")
                    .to_string();
                if out.status.success() && !said.contains("DOWN") {
                    Ok(())
                } else {
                    Err(format!("scontrol ping: {first}"))
                }
            }
        };
        *last = Some((Instant::now(), self.scontrol.clone(), answer.clone()));
        answer
    }
}

/// Runs `command` (its stdin closed, its output captured) in a process
/// group of its own for `limit` at most; `None` when it could not start or
/// did not end in time (then killed, with anything it started).
pub fn output_within(mut command: Command, limit: Duration) -> Option<std::process::Output> {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = command.spawn().ok()?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            // Slurm's tools print a few lines: the pipes never fill.
            Ok(Some(_)) => return child.wait_with_output().ok(),
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                // SAFETY: killpg(2) of the group this child leads (not yet
                // reaped, so its id is not reused).
                unsafe { libc::killpg(child.id() as libc::pid_t, libc::SIGKILL) };
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// A port in 20000..40000 from the job's name (unique per search and trial;
/// 29500, PyTorch's default, is what two trials would otherwise share).
pub fn master_port(name: &str) -> u16 {
    let h = name.bytes().fold(0x811c9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x01000193)
    });
    20000 + (h % 20000) as u16
}

/// How a Slurm job step ended, from what `srun` and slurmstepd wrote on
/// its stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlurmEnd {
    /// `CANCELLED AT ...` with no cause: `scancel`, by a person or a script.
    Cancelled,
    /// `DUE TO TIME LIMIT`: the job's `--time` ran out.
    TimeLimit,
    /// `DUE TO PREEMPTION`: a job of higher priority took the node.
    Preempted,
    /// `DUE TO NODE FAILURE` or `srun: error: Node failure`.
    NodeFailure,
    /// `srun: error: Unable to allocate resources` or `Invalid ...`: the
    /// request itself was refused (a wrong partition, GRES or time).
    Refused,
    /// `Unable to contact slurm controller`, or a controller that did not
    /// answer `scontrol ping` while the job waited for its allocation.
    Unreachable,
    /// The worker got SIGTERM or SIGKILL under `srun` and neither `srun`
    /// nor `scontrol` said why: Slurm's way of ending a step (scancel, a
    /// time limit, a preemption).
    Terminated,
}

impl SlurmEnd {
    /// The end a job state of `scontrol show job` names, if it is one.
    pub fn of_state(state: &str) -> Option<SlurmEnd> {
        match state {
            "CANCELLED" => Some(SlurmEnd::Cancelled),
            "TIMEOUT" | "DEADLINE" => Some(SlurmEnd::TimeLimit),
            "PREEMPTED" => Some(SlurmEnd::Preempted),
            "NODE_FAIL" | "BOOT_FAIL" => Some(SlurmEnd::NodeFailure),
            _ => None,
        }
    }
}

impl SlurmEnd {
    pub fn describe(self) -> &'static str {
        match self {
            SlurmEnd::Cancelled => {
                "Slurm cancelled the trial's job (scancel, by a person or a script)"
            }
            SlurmEnd::TimeLimit => "the trial's Slurm job reached its time limit (--time)",
            SlurmEnd::Preempted => "the trial's Slurm job was preempted by another job",
            SlurmEnd::NodeFailure => "the trial's Slurm node failed",
            SlurmEnd::Refused => "Slurm refused the trial's job",
            SlurmEnd::Unreachable => {
                "the Slurm controller (slurmctld) does not answer: the trial's job was stopped"
            }
            SlurmEnd::Terminated => {
                "Slurm terminated the trial's job (SIGTERM or SIGKILL: scancel, its time limit or a preemption)"
            }
        }
    }
}

/// What `srun -v`'s stderr says of a job: its step id, if it started, and
/// how it ended, if not by its program's own exit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SrunOutcome {
    /// `<job>.<step>`.
    pub step_id: Option<String>,
    pub end: Option<SlurmEnd>,
    /// The line that says so (shown with the trial's failure).
    pub line: Option<String>,
    /// `srun` or slurmstepd complained of something other than the task's
    /// own end (a usage error, an `execve` or `chdir` that failed, an
    /// error of the controller): those lines, at most [`COMPLAINTS`].
    pub complaints: Vec<String>,
    /// `srun` said the job has its allocation (`jobid N: nodes(...)`) or
    /// launched its step.
    pub allocated: bool,
}

/// The most complaint lines kept of one `srun` (each cut at 300 bytes).
pub const COMPLAINTS: usize = 5;

impl SrunOutcome {
    /// The job id (the step id without its step).
    pub fn job_id(&self) -> Option<&str> {
        self.step_id
            .as_deref()
            .map(|s| s.split('.').next().unwrap_or(s))
    }

    /// When `srun` did not say how a failed job ended: what Slurm says of
    /// the job (outside an allocation, where the job is the trial's own),
    /// else, for a worker ended by SIGTERM or SIGKILL (`srun` exits 143 or
    /// 137), that Slurm terminated it.
    pub fn end_from_slurm(
        &mut self,
        launcher: &SlurmLauncher,
        status: Option<std::process::ExitStatus>,
    ) {
        use std::os::unix::process::ExitStatusExt;
        if !launcher.in_allocation {
            let state = self
                .job_id()
                .map(str::to_string)
                .and_then(|job| launcher.job_state(&job));
            if let Some((state, end)) =
                state.and_then(|st| SlurmEnd::of_state(&st).map(|e| (st, e)))
            {
                self.end = Some(end);
                self.line = Some(format!("scontrol show job: JobState={state}"));
                return;
            }
        }
        let code = status.and_then(|s| s.code());
        let signal = status.and_then(|s| s.signal());
        if matches!(code, Some(143) | Some(137)) || matches!(signal, Some(15) | Some(9)) {
            self.end = Some(SlurmEnd::Terminated);
            self.line = Some(match (code, signal) {
                (Some(c), _) => format!("srun exited with {c}"),
                (_, Some(sig)) => format!("srun ended by signal {sig}"),
                _ => String::new(),
            });
        }
    }

    pub fn parse(stderr: &str) -> SrunOutcome {
        let mut out = SrunOutcome::default();
        // How the job ended, by how sure the line is: slurmstepd's
        // `CANCELLED AT` line says the cause; srun's own lines (a node
        // failure, a refusal, a step aborted or force-terminated) may come
        // before or after it, as the two write on one stderr.
        let mut best: Option<(u8, SlurmEnd, String)> = None;
        for line in stderr.lines() {
            let line = line.trim();
            if let Some(rest) = line.split("launching StepId=").nth(1) {
                let id: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '_')
                    .collect();
                if !id.is_empty() {
                    out.step_id = Some(id);
                }
            }
            if out.step_id.is_some()
                || (line.starts_with("srun: jobid ") && line.contains("nodes("))
            {
                out.allocated = true;
            }
            let lower = line.to_ascii_lowercase();
            if is_complaint(line, &lower) && out.complaints.len() < COMPLAINTS {
                out.complaints.push(cut(line, 300));
            }
            let found = if lower.contains("unable to contact slurm controller") {
                Some((4, SlurmEnd::Unreachable))
            } else if line.contains("CANCELLED AT") {
                Some((
                    3,
                    if line.contains("DUE TO TIME LIMIT") {
                        SlurmEnd::TimeLimit
                    } else if line.contains("DUE TO PREEMPTION") {
                        SlurmEnd::Preempted
                    } else if line.contains("DUE TO NODE FAILURE") {
                        SlurmEnd::NodeFailure
                    } else {
                        SlurmEnd::Cancelled
                    },
                ))
            } else if line.contains("srun: error: Node failure") {
                Some((2, SlurmEnd::NodeFailure))
            } else if line.starts_with("srun: error: Unable to allocate resources")
                || line.starts_with("srun: error: Invalid")
                || line.starts_with("srun: fatal:")
            {
                Some((2, SlurmEnd::Refused))
            } else if line.starts_with("srun: ")
                && (lower.contains("force terminated")
                    || lower.contains("has been cancelled")
                    || lower.contains("job step aborted")
                    || lower.contains("already completing or completed"))
            {
                // A job cancelled before or as its step started.
                Some((1, SlurmEnd::Cancelled))
            } else {
                None
            };
            if let Some((rank, end)) = found {
                if best.as_ref().is_none_or(|(r, _, _)| rank > *r) {
                    best = Some((rank, end, line.to_string()));
                }
            }
        }
        if let Some((_, end, line)) = best {
            out.end = Some(end);
            out.line = Some(line);
        }
        out
    }
}

/// Whether `line` (`lower`, lowercased) is `srun`'s or slurmstepd's
/// complaint rather than its report of the task's own end (`srun: error:
/// n1: task 0: Exited with exit code 2`, which the worker's exit is) or a
/// line of `--verbose`'s.
fn is_complaint(line: &str, lower: &str) -> bool {
    if line.starts_with("Try \"srun --help\"") {
        return true;
    }
    if !is_srun_line(line) {
        return false;
    }
    let task_end = lower.contains(": task ") && !lower.contains("execve");
    !task_end
        && [
            "error",
            "fatal",
            "unrecognized",
            "invalid",
            "unable",
            "no such",
            "not found",
        ]
        .iter()
        .any(|w| lower.contains(w))
}

/// `text` cut to at most `max` bytes (at a character boundary).
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// `srun`'s own lines, which are not the worker's (dropped from the
/// worker's last stderr line).
pub fn is_srun_line(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("srun: ") || line.starts_with("slurmstepd")
}

/// Slurm jobs running now, by name, with the launcher that can cancel
/// them: [`cancel_live_jobs`] on a signal or a failed search.
static LIVE_JOBS: Mutex<Vec<(String, OsString)>> = Mutex::new(Vec::new());

/// Jobs whose `srun` ended lately, with when: a job that ended while the
/// controller was already gone (but not yet found so) may still sit in its
/// saved state, its end never recorded.
static ENDED_JOBS: Mutex<Vec<(String, OsString, Instant)>> = Mutex::new(Vec::new());

/// How long before the controller is found gone a job's end may not have
/// reached it: the time an `srun` takes to find it so (no allocation after
/// [`SlurmLauncher::check_after`], then `scontrol ping`'s [`ASK_WAIT`]),
/// with room to spare.
const UNRECORDED_END: Duration = Duration::from_secs(60);

/// A job in [`LIVE_JOBS`] for as long as this lives.
pub struct LiveJob(String, OsString);

impl LiveJob {
    pub fn register(launcher: &SlurmLauncher, name: &str) -> LiveJob {
        if let Ok(mut live) = LIVE_JOBS.lock() {
            live.push((name.to_string(), launcher.scancel.clone()));
        }
        LiveJob(name.to_string(), launcher.scancel.clone())
    }
}

impl Drop for LiveJob {
    fn drop(&mut self) {
        if let Ok(mut live) = LIVE_JOBS.lock() {
            live.retain(|(n, _)| *n != self.0);
        }
        if let Ok(mut ended) = ENDED_JOBS.lock() {
            ended.retain(|(_, _, at)| at.elapsed() < UNRECORDED_END);
            ended.push((self.0.clone(), self.1.clone(), Instant::now()));
        }
    }
}

/// `scancel --name` of every job still running, [`CANCEL_WAIT`] at most
/// for all of them together: what segtune does when it is stopped (SIGINT,
/// SIGTERM) or its search fails, so that nothing of it stays queued or
/// running on the cluster. Each job that could not be cancelled (the
/// controller does not answer) is named on stderr with the command to run.
pub fn cancel_live_jobs() {
    let mut jobs: Vec<(String, OsString)> = LIVE_JOBS.lock().map(|l| l.clone()).unwrap_or_default();
    // With the controller gone, the jobs that ended lately may not have
    // been recorded as ended: cancelled too, or named.
    if controller_lost().is_some() {
        if let Ok(ended) = ENDED_JOBS.lock() {
            for (name, scancel, at) in ended.iter() {
                if at.elapsed() < UNRECORDED_END && !jobs.iter().any(|(n, _)| n == name) {
                    jobs.push((name.clone(), scancel.clone()));
                }
            }
        }
    }
    cancel_all(&jobs);
}

/// `scancel --name=<name>` of each job, all at once, [`CANCEL_WAIT`] at
/// most; the names it could not cancel, each said once on stderr with the
/// exact command.
fn cancel_all(jobs: &[(String, OsString)]) -> Vec<String> {
    let threads: Vec<_> = jobs
        .iter()
        .cloned()
        .map(|(name, scancel)| {
            std::thread::spawn(move || {
                let mut command = Command::new(&scancel);
                command.arg(format!("--name={name}"));
                let done = output_within(command, CANCEL_WAIT).is_some_and(|o| o.status.success());
                (name, done)
            })
        })
        .collect();
    let failed: Vec<String> = threads
        .into_iter()
        .filter_map(|t| t.join().ok())
        .filter(|(_, done)| !done)
        .map(|(name, _)| name)
        .collect();
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    for name in &failed {
        let new = SAID.lock().map_or(true, |mut said| {
            let new = !said.contains(name);
            if new {
                said.push(name.clone());
            }
            new
        });
        if new {
            eprintln!(
                "segtune: could not cancel the Slurm job {name} (scancel got no answer within {} s); \
                 once the controller answers, cancel it with: scancel --name={name}",
                CANCEL_WAIT.as_secs()
            );
        }
    }
    failed
}

/// Why the Slurm controller is taken for gone, once an `srun` found it so:
/// a search stops then (every further trial would fail alike).
static LOST: Mutex<Option<String>> = Mutex::new(None);

/// Notes that the controller does not answer (`why`), for
/// [`controller_lost`]; the first note stays.
pub fn note_controller_lost(why: &str) {
    if let Ok(mut lost) = LOST.lock() {
        lost.get_or_insert_with(|| why.to_string());
    }
}

/// Why the Slurm controller is gone, when an `srun` of this process found
/// it so: the search stops with an environment error.
pub fn controller_lost() -> Option<String> {
    LOST.lock().ok().and_then(|l| l.clone())
}

thread_local! {
    /// Slurm job ids this thread's workers ran as, since last taken: a
    /// candidate is evaluated on one thread, so what its evaluation
    /// launched is read there after it ([`take_launched_jobs`]).
    static LAUNCHED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Notes that this thread's worker ran as Slurm step `step_id`.
pub fn note_launched_job(step_id: &str) {
    LAUNCHED.with(|l| l.borrow_mut().push(step_id.to_string()));
}

/// The Slurm job steps this thread's workers ran as since the last call.
pub fn take_launched_jobs() -> Vec<String> {
    LAUNCHED.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srun_stderr_gives_the_step_and_how_it_ended() {
        let scancelled = "srun: jobid 2: nodes(1):`vm', cpu counts: 1(x1)\n\
            srun: launching StepId=2.0 on host vm, 1 tasks: 0\n\
            srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n\
            srun: error: vm: task 0: Terminated\n\
            slurmstepd-vm: error: *** STEP 2.0 ON vm CANCELLED AT 2026-12-05T00:14:41 ***\n";
        let o = SrunOutcome::parse(scancelled);
        assert_eq!(o.step_id.as_deref(), Some("2.0"));
        assert_eq!(o.job_id(), Some("2"));
        assert_eq!(o.end, Some(SlurmEnd::Cancelled));
        let timed = "srun: launching StepId=3.0 on host vm, 1 tasks: 0\n\
            slurmstepd-vm: error: *** STEP 3.0 ON vm CANCELLED AT 2026-12-05T00:15:59 DUE TO TIME LIMIT ***\n";
        assert_eq!(SrunOutcome::parse(timed).end, Some(SlurmEnd::TimeLimit));
        let preempted = "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO PREEMPTION ***";
        assert_eq!(SrunOutcome::parse(preempted).end, Some(SlurmEnd::Preempted));
        let node = "srun: error: Node failure on n3\n";
        assert_eq!(SrunOutcome::parse(node).end, Some(SlurmEnd::NodeFailure));
        let refused =
            "srun: error: Unable to allocate resources: Invalid partition name specified\n";
        let o = SrunOutcome::parse(refused);
        assert_eq!(o.end, Some(SlurmEnd::Refused));
        assert!(o.line.unwrap().contains("Invalid partition"));
        // srun's "aborted" before slurmstepd's line: the line with the cause wins.
        let reordered = "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n\
            slurmstepd-vm: error: *** STEP 3.0 ON vm CANCELLED AT 2026-12-05T00:15:59 DUE TO TIME LIMIT ***\n";
        assert_eq!(SrunOutcome::parse(reordered).end, Some(SlurmEnd::TimeLimit));
        // Cancelled before the step started: srun's own words.
        let early = "srun: Force Terminated JobId=12\n";
        assert_eq!(SrunOutcome::parse(early).end, Some(SlurmEnd::Cancelled));
        assert_eq!(SlurmEnd::of_state("TIMEOUT"), Some(SlurmEnd::TimeLimit));
        assert_eq!(SlurmEnd::of_state("CANCELLED"), Some(SlurmEnd::Cancelled));
        assert_eq!(SlurmEnd::of_state("COMPLETED"), None);
        let clean = "srun: launching StepId=12.4 on host n1, 1 tasks: 0\n\
            srun: launch/slurm: _task_finish: n1: task 0: Completed\n";
        let o = SrunOutcome::parse(clean);
        assert_eq!((o.step_id.as_deref(), o.end), (Some("12.4"), None));
    }

    #[test]
    fn the_srun_line_names_the_job_and_asks_what_was_given() {
        let mut l = SlurmLauncher::new("ab12");
        l.partition = Some("gpu".into());
        l.gpus_per_trial = Some(2);
        l.cpus_per_trial = Some(4);
        l.time = Some("00:30:00".into());
        l.extra_args = vec!["--qos=short".into()];
        l.in_allocation = true;
        let name = l.next_job_name();
        assert_eq!(name, "segtune-ab12-1");
        assert_eq!(l.next_job_name(), "segtune-ab12-2");
        let args = l.srun_args(&name);
        for want in [
            "--job-name=segtune-ab12-1",
            "--partition=gpu",
            "--gres=gpu:2",
            "--cpus-per-task=4",
            "--time=00:30:00",
            "--exact",
            "--qos=short",
            "--verbose",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        // The user's own arguments come last: they may override ours.
        assert_eq!(args.last().map(String::as_str), Some("--qos=short"));
        assert_ne!(master_port("segtune-ab12-1"), master_port("segtune-ab12-2"));
        assert!((20000..40000).contains(&master_port("x")));
    }

    #[test]
    fn each_thread_reads_the_jobs_it_launched() {
        note_launched_job("5.0");
        let other = std::thread::spawn(|| {
            note_launched_job("6.0");
            take_launched_jobs()
        })
        .join()
        .unwrap();
        assert_eq!(other, vec!["6.0".to_string()]);
        assert_eq!(take_launched_jobs(), vec!["5.0".to_string()]);
        assert!(take_launched_jobs().is_empty());
    }
}
