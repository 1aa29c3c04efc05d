//! The worker's fork server: one `segtune-torch serve` process per thread
//! of segtune that loads libtorch once and forks a fresh child for each
//! request, so that a search's traces and inspections do not each pay
//! libtorch's start (~0.4-0.7 s, more than a small model's meta trace).
//!
//! The child is a new process as a spawned worker is: its own globals,
//! limits and memory, its exit status and signal, its stdout and stderr
//! (written to files the request names), its own session and process
//! group (`setsid`), killed whole on its deadline (`killpg`). The
//! server never runs a torch op, so it forks before libtorch has started a
//! thread (fork copies only the calling thread); CUDA is never initialised
//! in it. Before forking it resolves the request's config (the child finds
//! it in the config memo instead of loading the files again). Requests on a CUDA device and Slurm job steps are spawned as
//! before.
//!
//! Protocol, one JSON line each way: segtune writes
//! `{"argv": [...], "stdout": PATH, "stderr": PATH}`; the server answers
//! `{"pid": N}` once the child runs, then `{"pid": N, "wait_status": S}`
//! (waitpid(2)'s status) when it has ended. The server dies with segtune
//! (`PR_SET_PDEATHSIG`, and it exits when its stdin closes), its child with
//! it: a segtune that dies leaves no work behind. A child's command name
//! (`ps`, `pgrep`) is `st-` and the request's command: `st-run`,
//! `st-inspect`.

use super::process::{Finished, LiveWorker};
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Set to `0` to spawn every worker process (no fork server).
pub const ENV_SWITCH: &str = "SEGTUNE_FORK_SERVER";

/// One request to the server.
#[derive(serde::Serialize, serde::Deserialize)]
struct ServeRequest {
    argv: Vec<String>,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// The server's answers: the child's pid, then with its wait status.
#[derive(serde::Serialize, serde::Deserialize)]
struct ServeAnswer {
    pid: i32,
    wait_status: Option<i32>,
}

/// Whether requests may go through a fork server here.
pub fn enabled() -> bool {
    std::env::var(ENV_SWITCH).map_or(true, |v| v.trim() != "0")
}

// ---------------------------------------------------------------- server

/// `segtune-torch serve`: answers requests until stdin closes. `run` is the
/// worker's command line on one argv (without the program name); it
/// returns the exit code, its output already written to stdout/stderr.
/// `prepare` runs in the server before each fork (on the request's argv):
/// what it leaves in memory the child inherits; it must leave no thread
/// running.
pub fn serve(run: &dyn Fn(Vec<OsString>) -> i32, prepare: &dyn Fn(&[OsString])) -> i32 {
    // Registered once here rather than in every child: the op-level trace's
    // dispatcher fallback and CUDA's autocast policy (each registration
    // rewrites the dispatch tables of every operator it touches). A child
    // that wants the CPU's autocast rules turns the policy off again
    // (`trial::run`); without autocast the policy is never consulted.
    use crate::trial::memory::{self, OpTrace};
    let _ = memory::set_op_trace(OpTrace::Meta).and_then(|()| memory::set_op_trace(OpTrace::Off));
    let _ = memory::autocast_cuda_policy(true);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    while let Some(Ok(line)) = lines.next() {
        let request: ServeRequest = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("segtune-torch serve: unreadable request ({e}): {line}");
                return 2;
            }
        };
        let argv: Vec<OsString> = request.argv.iter().map(OsString::from).collect();
        prepare(&argv);
        if let Err(e) = serve_one(&request, run) {
            eprintln!("segtune-torch serve: {e}");
            return 1;
        }
    }
    0
}

fn answer(a: &ServeAnswer) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, a)?;
    out.write_all(b"\n")?;
    out.flush()
}

fn serve_one(request: &ServeRequest, run: &dyn Fn(Vec<OsString>) -> i32) -> std::io::Result<()> {
    // Opened before the fork: an unwritable path is the request's error.
    let stdout = std::fs::File::create(&request.stdout)?;
    let stderr = std::fs::File::create(&request.stderr)?;
    std::io::stdout().flush()?;
    // SAFETY: this process is single-threaded (it never runs torch ops, and
    // the config loads of `prepare` join their thread), so the child may run
    // any code after the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // `ps` and `pgrep` tell the children by their command:
        // `st-run`, `st-inspect` (the name holds 15 bytes).
        let mut name = format!("st-{}", request.argv.first().map_or("", String::as_str));
        name.truncate(15);
        let name = std::ffi::CString::new(name).unwrap_or_default();
        // SAFETY: plain fd and process calls in the child; `name` is a
        // NUL-terminated string that outlives the call.
        unsafe {
            libc::prctl(libc::PR_SET_NAME, name.as_ptr());
            // A group of its own, as a spawned worker's: killed whole.
            libc::setsid();
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
            libc::dup2(null, 0);
            libc::dup2(stdout.as_raw_fd(), 1);
            libc::dup2(stderr.as_raw_fd(), 2);
        }
        let code = run(request.argv.iter().map(OsString::from).collect());
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: ends the child without the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    drop((stdout, stderr));
    answer(&ServeAnswer {
        pid,
        wait_status: None,
    })?;
    let status = wait_watching_stdin(pid);
    answer(&ServeAnswer {
        pid,
        wait_status: Some(status),
    })
}

/// Waits for the child; kills it if segtune closes our stdin meanwhile (it
/// died or stopped), and then exits.
fn wait_watching_stdin(pid: libc::pid_t) -> i32 {
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid pointer.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            return status;
        }
        if done < 0 {
            return 0;
        }
        let mut fd = libc::pollfd {
            fd: 0,
            events: 0,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd.
        unsafe { libc::poll(&mut fd, 1, 20) };
        if fd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
                libc::_exit(0);
            }
        }
    }
}

// ---------------------------------------------------------------- client

/// A running server and the pipes to it.
struct Server {
    worker: PathBuf,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    _live: LiveWorker,
}

impl Server {
    fn start(worker: &Path) -> std::io::Result<Server> {
        let mut child = spawn_server(worker)?;
        let live = LiveWorker::register(child.id());
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other("no pipes to the fork server"));
        };
        Ok(Server {
            worker: worker.to_path_buf(),
            child,
            stdin,
            stdout: BufReader::new(stdout),
            _live: live,
        })
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn read_answer(&mut self) -> std::io::Result<ServeAnswer> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("the fork server ended"));
        }
        serde_json::from_str(&line).map_err(std::io::Error::other)
    }

    /// Whether an answer can be read now or within `wait`.
    fn answer_ready(&self, wait: Duration) -> bool {
        if !self.stdout.buffer().is_empty() {
            return true;
        }
        let mut fd = libc::pollfd {
            fd: self.stdout.get_ref().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one valid pollfd.
        unsafe { libc::poll(&mut fd, 1, wait.as_millis().min(i32::MAX as u128) as i32) > 0 }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `worker serve` from a thread that lives as long as segtune:
/// the server dies with segtune (`PR_SET_PDEATHSIG` fires when the thread
/// that spawned it ends, and servers outlive the threads that use them),
/// even while it is still loading libtorch and not yet reading its stdin.
fn spawn_server(worker: &Path) -> std::io::Result<Child> {
    type Reply = std::sync::mpsc::Sender<std::io::Result<Child>>;
    static SPAWNER: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<(PathBuf, Reply)>>> =
        std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<(PathBuf, Reply)>();
        std::thread::spawn(move || {
            for (worker, reply) in rx {
                let mut command = Command::new(&worker);
                command
                    .arg("serve")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null());
                super::machine::worker_env(&mut command);
                super::process::own_group_dying_with_parent(&mut command);
                let _ = reply.send(command.spawn());
            }
        });
        Mutex::new(tx)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    spawner
        .lock()
        .map_err(|_| std::io::Error::other("the fork servers' spawner is gone"))?
        .send((worker.to_path_buf(), reply))
        .map_err(|_| std::io::Error::other("the fork servers' spawner is gone"))?;
    answer
        .recv()
        .map_err(|_| std::io::Error::other("the fork servers' spawner is gone"))?
}

/// Idle servers, any worker's (each thread takes one for a request).
static IDLE: Mutex<Vec<Server>> = Mutex::new(Vec::new());

/// Workers whose server could not start (another segtune's worker without
/// `serve`): spawned from then on.
static REFUSED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn take_server(worker: &Path) -> std::io::Result<Server> {
    if let Ok(mut idle) = IDLE.lock() {
        while let Some(i) = idle.iter().position(|s| s.worker == worker) {
            let mut server = idle.swap_remove(i);
            if server.alive() {
                return Ok(server);
            }
        }
    }
    Server::start(worker)
}

/// Makes `n` idle servers of `worker` exist (started, not awaited).
pub fn prestart(worker: &Path, n: usize) {
    if REFUSED.lock().is_ok_and(|r| r.iter().any(|p| p == worker)) {
        return;
    }
    let Ok(mut idle) = IDLE.lock() else {
        return;
    };
    idle.retain_mut(Server::alive);
    let have = idle.iter().filter(|s| s.worker == worker).count();
    for _ in have..n {
        match Server::start(worker) {
            Ok(server) => idle.push(server),
            Err(_) => return,
        }
    }
}

fn give_back(server: Server) {
    if let Ok(mut idle) = IDLE.lock() {
        idle.push(server);
    }
}

/// Runs the worker at `worker` on `argv` through a fork server, as
/// `worker::run_child` would spawn it: its status, stdout and stderr, killed
/// past `timeout`. `Ok(None)`: no server to be had; spawn instead.
pub(super) fn run_forked(
    worker: &Path,
    argv: &[OsString],
    timeout: Option<Duration>,
) -> Result<Option<Finished>> {
    if REFUSED.lock().is_ok_and(|r| r.iter().any(|p| p == worker)) {
        return Ok(None);
    }
    let Some(argv) = argv
        .iter()
        .map(|a| a.to_str().map(str::to_string))
        .collect::<Option<Vec<String>>>()
    else {
        return Ok(None);
    };
    let dir = super::process::LiveTempDir::new()
        .map_err(|e| Error::io("no temporary directory for a worker's output", e))?;
    let request = ServeRequest {
        argv,
        stdout: dir.path().join("stdout"),
        stderr: dir.path().join("stderr"),
    };
    let Ok(mut server) = take_server(worker) else {
        return Ok(None);
    };
    let started = Instant::now();
    let pid = match send(&mut server, &request) {
        Ok(pid) => pid,
        Err(_) => {
            // A worker without `serve` ends on clap's usage error; any
            // other end (killed while idle) is this server's alone.
            let usage = matches!(server.child.try_wait(), Ok(Some(s)) if s.code() == Some(2));
            if usage {
                if let Ok(mut refused) = REFUSED.lock() {
                    refused.push(worker.to_path_buf());
                }
            }
            return Ok(None);
        }
    };
    let child = LiveWorker::register(pid as u32);
    let mut timed_out = false;
    let status = loop {
        let left = timeout.map(|t| t.saturating_sub(started.elapsed()));
        if left == Some(Duration::ZERO) && !timed_out {
            // The server's child (and its group), whose end the server
            // still awaits: its pid is not reused meanwhile.
            super::process::kill_group(pid as u32);
            timed_out = true;
        }
        let wait = left
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        if !server.answer_ready(wait.max(Duration::from_millis(1))) {
            continue;
        }
        match server.read_answer() {
            Ok(ServeAnswer {
                wait_status: Some(s),
                ..
            }) => break Some(s),
            Ok(_) => continue,
            Err(_) => break None,
        }
    };
    drop(child);
    if status.is_some() {
        give_back(server);
    }
    use std::os::unix::process::ExitStatusExt;
    let read = |p: &Path| std::fs::read(p).unwrap_or_default();
    Ok(Some(Finished {
        status: status.map(std::process::ExitStatus::from_raw),
        stdout: read(&request.stdout),
        stderr: read(&request.stderr),
        timed_out,
        stopped: None,
        srun: None,
    }))
}

/// Sends the request and reads the child's pid.
fn send(server: &mut Server, request: &ServeRequest) -> std::io::Result<i32> {
    let mut line = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    line.push(b'\n');
    server.stdin.write_all(&line)?;
    server.stdin.flush()?;
    if !server.answer_ready(Duration::from_secs(60)) {
        return Err(std::io::Error::other("the fork server did not answer"));
    }
    Ok(server.read_answer()?.pid)
}
