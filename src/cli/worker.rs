//! The `segtune-torch` worker's command line: `run` (the protocol's
//! request, a `TrialRequest` as JSON, see `trial::request`), `trial` (the
//! same trial from `segtune trial`'s flags, for people), `inspect`,
//! `devices` and `serve` (the fork server, `worker::fork_server`). It lives in a
//! binary of its own so that `segtune` starts in milliseconds (libtorch
//! takes ~0.4 s to load).
//!
//! Its refusals (exit code 2) print a `WorkerRefusal` line on stdout beside
//! the message on stderr: segtune takes exit 2 for the worker's own refusal
//! only with it, as `srun` and slurmstepd exit 2 for failures of theirs.

use super::args::{InspectArgs, TrialArgs};
use super::{finish, json, Output, EXIT_INPUT_ERROR};
use crate::error::{Error, Result};
use crate::worker::{RefusalKind, WorkerRefusal};
use crate::{report, trial};
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "segtune-torch",
    about = "segtune's libtorch worker (run through `segtune trial` / `segtune inspect`)"
)]
struct WorkerCli {
    #[command(subcommand)]
    command: WorkerCommand,
}

#[derive(Subcommand, Debug)]
enum WorkerCommand {
    /// Run one trial from a request (`TrialRequest` as JSON: the text
    /// itself, `@FILE`, or `-` for stdin); print its report as JSON.
    Run {
        #[arg(value_name = "REQUEST")]
        request: String,
    },
    Trial(Box<TrialArgs>),
    Inspect(InspectArgs),
    /// Print the number of CUDA devices libtorch sees.
    Devices,
    /// Answer requests on stdin, each in a forked child (see
    /// `worker::fork_server`).
    #[command(hide = true)]
    Serve,
}

/// Runs the worker's command line; returns the exit code.
pub fn main() -> i32 {
    // libtorch errors arrive as panics that trials catch and report.
    std::panic::set_hook(Box::new(|_| {}));
    run(std::env::args_os())
}

/// One command line of the worker (the program's name first).
fn run(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let cli = match WorkerCli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            if !e.use_stderr() {
                return 0;
            }
            refuse(RefusalKind::Usage, &e.to_string());
            return EXIT_INPUT_ERROR;
        }
    };
    finish_refusing(match cli.command {
        WorkerCommand::Run { request } => read_request(&request).and_then(|request| {
            crate::worker::execute(&request).map(|report| Output {
                text: json(&report),
                code: if report.status == trial::TrialStatus::Ok {
                    0
                } else {
                    1
                },
            })
        }),
        WorkerCommand::Trial(args) => {
            crate::worker::execute(&args.request()).map(|report| Output {
                text: if args.common.json {
                    json(&report)
                } else {
                    report::trial(&report)
                },
                code: if report.status == trial::TrialStatus::Ok {
                    0
                } else {
                    1
                },
            })
        }
        WorkerCommand::Inspect(args) => {
            crate::worker::inspect(&args.config, &args.common.cfg_options).map(|summary| {
                Output::ok(if args.common.json {
                    json(&summary)
                } else {
                    report::inspect(&summary)
                })
            })
        }
        WorkerCommand::Devices => Ok(Output::ok(format!(
            "{}\n",
            crate::worker::execute::cuda_device_count()
        ))),
        WorkerCommand::Serve => {
            return crate::worker::fork_server::serve(
                &|argv| run(std::iter::once("segtune-torch".into()).chain(argv)),
                &resolve_in_server,
            )
        }
    })
}

/// The request `run` was given: JSON text, `@FILE` or `-` (stdin).
fn read_request(given: &str) -> Result<trial::TrialRequest> {
    let text = match given {
        "-" => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|e| Error::io("cannot read the request on stdin", e))?;
            text
        }
        _ => match given.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| Error::io(format!("cannot read the request {path}"), e))?,
            None => given.to_string(),
        },
    };
    trial::TrialRequest::from_json(&text)
        .map_err(|e| Error::Input(format!("the trial request is not a TrialRequest: {e}")))
}

/// [`finish`], an error also said on stdout as a [`WorkerRefusal`] (its
/// kind: the machine's, or the request's).
fn finish_refusing(result: Result<Output>) -> i32 {
    match result {
        Ok(out) => finish(Ok(out)),
        Err(e) => {
            let text = e.render();
            eprint!("{text}");
            match &e {
                Error::Environment { .. } => refuse(RefusalKind::Environment, &e.to_string()),
                _ => refuse(RefusalKind::Input, &text),
            }
            EXIT_INPUT_ERROR
        }
    }
}

/// Prints the refusal line on stdout (nothing else is there: a refusal has
/// no report).
fn refuse(kind: RefusalKind, message: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(WorkerRefusal::line(kind, message).as_bytes());
    let _ = out.flush();
}

/// Resolves a request's config in the fork server before it forks, so
/// that each child finds it in the config memo (`config::memo`) instead of
/// loading it again. A request that does not parse or resolve is the
/// child's to report.
fn resolve_in_server(argv: &[std::ffi::OsString]) {
    let argv = std::iter::once("segtune-torch".into()).chain(argv.iter().cloned());
    let (config, cfg_options) = match WorkerCli::try_parse_from(argv).map(|cli| cli.command) {
        // stdin is the server's own pipe, never a request's.
        Ok(WorkerCommand::Run { request }) if request != "-" => match read_request(&request) {
            Ok(request) => (request.config, request.cfg_options),
            Err(_) => return,
        },
        Ok(WorkerCommand::Trial(args)) => {
            let request = args.request();
            (request.config, request.cfg_options)
        }
        Ok(WorkerCommand::Inspect(args)) => (args.config, args.common.cfg_options),
        _ => return,
    };
    let _ = std::panic::catch_unwind(|| crate::config::resolve(&config, &cfg_options));
}
