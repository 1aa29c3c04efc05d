//! Tests of `worker.rs` and `child.rs`: how a worker's end is read, and
//! workers torn down whole.

use super::*;
use std::time::Instant;

#[test]
fn a_signal_is_named_with_its_likely_cause() {
    use std::os::unix::process::ExitStatusExt;
    let death =
        |raw, stderr: &[u8]| WorkerDeath::of(Some(std::process::ExitStatus::from_raw(raw)), stderr);
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
        (
            "srun: something odd",
            1,
            "before the worker's job step started",
        ),
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
