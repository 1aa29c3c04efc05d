//! The command lines: `segtune` ([`main`]) and its libtorch worker
//! `segtune-torch` ([`worker::main`]). Parsing (clap), the conversion of the
//! arguments into library requests, the progress bar, printing and exit
//! codes; nothing else. Every error is rendered here, once, with exit code 2.

pub mod args;
mod scale_args;
pub mod worker;

use crate::config::{self, dump};
use crate::error::Result;
use crate::predict::{estimate_config, Gpu};
use crate::search::{SearchResult, SearchSpec};
use crate::worker::Worker;
use crate::{report, trial};
use args::{Cli, Command, SearchArgs};
use clap::Parser;
use std::io::Write;

/// Exit code of every usage or input error.
pub const EXIT_INPUT_ERROR: i32 = crate::worker::EXIT_INPUT_ERROR;

/// What a command leaves: its stdout text and exit code.
struct Output {
    text: String,
    code: i32,
}

impl Output {
    fn ok(text: String) -> Output {
        Output { text, code: 0 }
    }
}

/// Ctrl-C, SIGTERM or SIGHUP: stop the workers and remove their temporary
/// files before exiting (the journal holds every finished trial already),
/// with the shell's code for death by that signal (128 + its number: 130
/// for SIGINT, 143 for SIGTERM, 129 for SIGHUP).
fn stop_on_signals() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return;
    };
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            crate::worker::stop_all_workers();
            eprintln!("segtune: stopped by a signal; finished trials are in the journal");
            std::process::exit(128 + signal);
        }
    });
}

/// Runs the `segtune` command line; returns the process exit code.
pub fn main() -> i32 {
    stop_on_signals();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_INPUT_ERROR } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    finish(run(cli))
}

/// Prints a command's output (all at once, so nothing reaches stdout when
/// it fails half-way) or its error.
fn finish(result: Result<Output>) -> i32 {
    match result {
        Ok(out) => match write_stdout(&out.text) {
            Ok(()) => out.code,
            Err(e) => {
                eprint!("{}", e.render());
                EXIT_INPUT_ERROR
            }
        },
        Err(e) => {
            eprint!("{}", e.render());
            EXIT_INPUT_ERROR
        }
    }
}

/// Writes a command's whole output to stdout. A closed pipe (`segtune
/// resolve x.py | head`) is not an error; every other write error (a full
/// disk, `/dev/full`) is, as the output on stdout is then cut short.
fn write_stdout(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(crate::error::Error::environment(format!(
                "cannot write to stdout: {e}; the output is incomplete"
            )))
        }
        _ => Ok(()),
    }
}

/// `segtune trial`'s default deadline: a CUDA trial as the search's
/// (`--trial-timeout`'s default); a CPU one as long as a CPU-traced step
/// of its batch may take, for each step it runs.
fn trial_deadline(request: &trial::TrialRequest) -> std::time::Duration {
    use crate::predict::step_trace::trace_deadline;
    match request.device {
        crate::kinds::DeviceChoice::Cuda(_) => std::time::Duration::from_secs(600),
        crate::kinds::DeviceChoice::Cpu => {
            let steps = (request.warmup_steps + request.measured_steps).max(1) as u32;
            trace_deadline(
                crate::predict::TraceKind::Cpu,
                request.batch_size,
                request.crop,
            ) * steps
                / 2
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("results serialise") + "\n"
}

/// Runs one command.
fn run(cli: Cli) -> Result<Output> {
    match cli.command {
        Command::Resolve {
            config,
            format,
            cfg_options,
        } => {
            let cfg = config::resolve(&config, &cfg_options)?;
            Ok(Output::ok(dump::render(&cfg, format)?))
        }
        Command::Trial(args) => trial_command(&args),
        Command::Inspect(args) => {
            let summary = match args.python.worker() {
                Some(python) => python.inspect(&args.config, &args.common.cfg_options)?,
                None => Worker::locate()?.inspect(&args.config, &args.common.cfg_options)?,
            };
            Ok(Output::ok(if args.common.json {
                json(&summary)
            } else {
                report::inspect(&summary)
            }))
        }
        Command::Estimate(args) => {
            let estimate = estimate_command(&args)?;
            Ok(Output::ok(if args.common.json {
                json(&estimate)
            } else {
                report::estimate(&estimate)
            }))
        }
        Command::Explain(args) => {
            let estimate = estimate_command(&args)?;
            Ok(Output::ok(if args.common.json {
                json(&estimate)
            } else {
                report::explain(&estimate)
            }))
        }
        Command::Search(args) => search_command(&args),
        Command::Atlas(args) => atlas_command(&args),
        Command::Report { dir } => write_report(&dir),
        Command::Schema { which } => {
            let schema = match which.as_str() {
                "search" => schemars::schema_for!(SearchSpec),
                "atlas" => schemars::schema_for!(crate::search::atlas::Atlas),
                _ => schemars::schema_for!(SearchResult),
            };
            Ok(Output::ok(json(&schema)))
        }
        Command::Presets { json: false } => Ok(Output::ok(report::presets(&Gpu::presets()?))),
        Command::Presets { json: true } => {
            let all = crate::config::presets::names()
                .into_iter()
                .map(crate::config::presets::load)
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok(Output::ok(report::presets_json(&all)))
        }
        Command::Doctor { json: as_json } => {
            let found = crate::predict::doctor::examine();
            let text = if as_json {
                json(&found)
            } else {
                report::doctor(&found)
            };
            Ok(Output {
                text,
                code: i32::from(found.blocked()),
            })
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "segtune",
                &mut script,
            );
            Ok(Output::ok(String::from_utf8_lossy(&script).into_owned()))
        }
    }
}

/// The search with a spinner on stderr: the candidate just decided, how
/// many are done and at most how many are left. Hidden with `--json` or
/// `--quiet`, or when stdout or stderr is not a terminal.
fn search_with_progress(args: &SearchArgs) -> Result<SearchResult> {
    use std::io::IsTerminal;
    args.scale.check().map_err(crate::error::Error::Input)?;
    let worker = Worker::locate()?;
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}")
            .expect("static template"),
    );
    if args.common.json || args.quiet || !std::io::stdout().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let progress = |step: &crate::search::Step| bar.set_message(report::progress_line(step));
    let result = crate::search::search(&args.request(), &worker, &progress);
    bar.finish_and_clear();
    result
}

/// `segtune trial`: a measurement that says "does not fit" or "cannot
/// train" is an answer (exit 1 with its report); a trial that broke is not
/// (one line on stderr, exit 2). The native worker runs it, or the Python
/// worker when asked (`--python-worker`).
fn trial_command(args: &args::TrialCommandArgs) -> Result<Output> {
    use crate::worker::python_worker;
    let request = args.trial.request();
    let deadline = args
        .trial
        .timeout
        .map(std::time::Duration::from_secs)
        .unwrap_or_else(|| trial_deadline(&request));
    let python = args.python.worker();
    let report = if let Some(worker) = python {
        let deadline = args
            .trial
            .timeout
            .map_or(deadline + python_worker::START_ALLOWANCE, |_| deadline);
        worker.trial(&request, Some(deadline))?
    } else {
        Worker::locate()?.trial(&request, Some(deadline))?
    };
    trial_output(&report, args.trial.common.json)
}

/// `segtune estimate` and `explain`: traced by segtune's worker, or by the
/// Python worker when asked (`--python-worker`).
fn estimate_command(args: &args::EstimateArgs) -> Result<crate::predict::Estimate> {
    let python = args.python.worker();
    estimate_config(&args.request(python)?, &Worker::locate()?)
}

/// A trial's report as `segtune trial` prints it, with its exit code.
fn trial_output(report: &trial::TrialReport, as_json: bool) -> Result<Output> {
    if matches!(
        report.status,
        trial::TrialStatus::Error
            | trial::TrialStatus::Crash
            | trial::TrialStatus::Timeout
            | trial::TrialStatus::HostOom
    ) {
        return Err(crate::error::Error::Trial(format!(
            "the trial failed ({}): {}",
            report.status.name(),
            report.message.as_deref().unwrap_or("no reason given")
        )));
    }
    let text = if as_json {
        json(report)
    } else {
        report::trial(report)
    };
    let code = if report.status == trial::TrialStatus::Ok {
        0
    } else {
        1
    };
    Ok(Output { text, code })
}

/// `segtune search`: the table (or JSON), and with `--why` the winner's
/// peak beside the next batch's.
fn search_command(args: &SearchArgs) -> Result<Output> {
    let result = search_with_progress(args)?;
    let mut text = if args.common.json {
        json(&result)
    } else {
        report::search(&result, args.all)
    };
    if args.why && !args.common.json {
        text.push_str(&why(args, &result)?);
    }
    Ok(Output::ok(text))
}

/// `segtune atlas`: every config on every GPU, progress on stderr, then
/// atlas.json, atlas.csv and atlas.html written whole into --out and the
/// summary (or the JSON) on stdout.
fn atlas_command(args: &args::AtlasArgs) -> Result<Output> {
    use crate::search::atlas::AtlasStatus;
    use crate::search::saved::write_atomically;
    args.scale.check().map_err(crate::error::Error::Input)?;
    let worker = Worker::locate()?;
    let request = args.request(&crate::config::presets::names());
    let quiet = args.quiet || args.common.json;
    let progress = |step: &crate::search::atlas::AtlasStep| {
        if quiet {
            return;
        }
        let r = step.row;
        let what = match r.status {
            AtlasStatus::Fits => format!(
                "fits: b{} {}x{} {}{} ({:.2} GiB)",
                r.batch_size.unwrap_or(0),
                r.crop.map_or(0, |c| c.0),
                r.crop.map_or(0, |c| c.1),
                r.amp.as_deref().unwrap_or(""),
                r.accumulation
                    .filter(|a| *a > 1)
                    .map_or(String::new(), |a| format!(" acc{a}")),
                r.device_bytes.unwrap_or(0) as f64 / (1u64 << 30) as f64
            ),
            AtlasStatus::NothingFits => "nothing fits".into(),
            AtlasStatus::Failed => format!("failed: {}", r.reason.as_deref().unwrap_or("")),
        };
        eprintln!(
            "atlas [{}/{}] {} on {}: {what}{}",
            step.done,
            step.of,
            r.config,
            r.gpu,
            if step.reused {
                " (reused)".to_string()
            } else {
                format!(" [{:.1} s]", r.seconds)
            }
        );
    };
    // Before any search: the tables replace only what segtune wrote.
    crate::search::owned::check_replaceable(
        &args.out,
        &crate::search::owned::atlas_outputs(&args.out),
    )?;
    let atlas = crate::search::atlas::atlas(&request, &worker, &progress)?;
    atlas.notes.iter().for_each(|n| eprintln!("note: {n}"));
    let text = json(&atlas);
    write_atomically(&args.out.join("atlas.json"), text.as_bytes())?;
    write_atomically(
        &args.out.join("atlas.csv"),
        report::atlas::csv(&atlas).as_bytes(),
    )?;
    write_atomically(
        &args.out.join("atlas.html"),
        report::atlas::page(&atlas).as_bytes(),
    )?;
    // Tables whose every row is a failure of this machine say nothing of
    // the configs: written (each row says why), but not an answer.
    if let Some(first) = atlas
        .rows
        .first()
        .filter(|_| atlas.rows.iter().all(|r| r.unjudged))
    {
        return Err(crate::error::Error::environment(format!(
            "no row could be judged: all {} failed for a reason of this machine or the moment, \
             not of the configs (the first, {} on {}: {}); nothing is kept as their result \
             (the tables in {} say so): re-run the atlas once the cause is gone",
            atlas.rows.len(),
            first.name,
            first.gpu,
            first.reason.as_deref().unwrap_or("no reason given"),
            args.out.display()
        )));
    }
    Ok(Output::ok(if args.common.json {
        text
    } else {
        report::atlas::summary(&atlas, &args.out)
    }))
}

/// `segtune report DIR`: the page and its charts into `DIR/report/`.
fn write_report(dir: &std::path::Path) -> Result<Output> {
    use crate::search::saved;
    let (search, rows) = saved::load(dir)?;
    let breakdown = saved::winner_breakdown(&search, &Worker::locate()?)?;
    let page = report::page(&search, &rows, breakdown.as_ref());
    let charts: Vec<&str> = page.svgs.iter().map(|(name, _)| *name).collect();
    crate::search::owned::check_replaceable(
        dir,
        &crate::search::owned::report_outputs(dir, &charts),
    )?;
    let out = dir.join("report");
    std::fs::create_dir_all(&out)
        .map_err(|e| crate::error::Error::io(format!("cannot create {}", out.display()), e))?;
    let mut text = String::new();
    for (name, svg) in &page.svgs {
        let path = out.join(name);
        saved::write_atomically(&path, svg.as_bytes())?;
        text.push_str(&format!("wrote {}\n", path.display()));
    }
    let path = out.join("report.html");
    saved::write_atomically(&path, page.html.as_bytes())?;
    text.push_str(&format!(
        "wrote {} ({} journal rows)\n",
        path.display(),
        rows.len()
    ));
    Ok(Output::ok(text))
}

/// `search --why`: the winner's predicted peak beside the next larger
/// batch's (which does not fit), part by part.
fn why(args: &SearchArgs, result: &SearchResult) -> Result<String> {
    use crate::search::saved;
    let Some(winner) = &result.winner else {
        return Ok(String::new());
    };
    let search = saved::SavedSearch {
        result: result.clone(),
        config: config::absolute(args.config_path()),
        config_hash: String::new(),
        cfg_options: args.common.cfg_options.clone(),
        gt_segments: args.step.gt_segments.0,
        inputs: None,
    };
    let worker = Worker::locate()?;
    let won = saved::breakdown_of(
        &search,
        &winner.candidate,
        winner.record.allocator_settings(),
        &worker,
    )?;
    let next = match saved::next_that_does_not_fit(result) {
        Some(c) => Some((
            c,
            saved::breakdown_of(&search, &c, Default::default(), &worker)?,
        )),
        None => None,
    };
    Ok(report::why(
        result,
        (&winner.candidate, &won),
        next.as_ref().map(|(c, b)| (c, b)),
    ))
}
