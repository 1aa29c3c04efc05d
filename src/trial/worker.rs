//! The `segtune-torch` worker: the commands that need libtorch (`trial`,
//! `inspect`). They live in a binary of their own so that `segtune` itself
//! starts in milliseconds (libtorch takes ~0.4 s to load); `segtune trial`
//! and `segtune inspect` run this binary.

use super::{TrialSpec, TrialStatus};
use crate::cli::{parse_device, InspectArgs, TrialArgs, EXIT_INPUT_ERROR};
use crate::config;
use crate::models::{check_supported, EncoderDecoder};
use clap::{Parser, Subcommand};
use tch::Device;

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
    Trial(TrialArgs),
    Inspect(InspectArgs),
    /// Print the number of CUDA devices libtorch sees.
    Devices,
}

/// Runs the worker's command line; returns the exit code.
pub fn main() -> i32 {
    // libtorch errors arrive as panics that trials catch and report.
    std::panic::set_hook(Box::new(|_| {}));
    let cli = match WorkerCli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_INPUT_ERROR } else { 0 };
        }
    };
    match cli.command {
        WorkerCommand::Trial(args) => trial(args),
        WorkerCommand::Inspect(args) => inspect(args),
        WorkerCommand::Devices => {
            let n = if tch::Cuda::is_available() {
                tch::Cuda::device_count()
            } else {
                0
            };
            println!("{n}");
            0
        }
    }
}

fn fail(message: impl std::fmt::Display) -> i32 {
    eprint!("{message}");
    if !message.to_string().ends_with('\n') {
        eprintln!();
    }
    EXIT_INPUT_ERROR
}

fn trial(args: TrialArgs) -> i32 {
    let cfg = match config::resolve(&args.config, &args.cfg_options) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if let Err(e) = check_supported(&cfg) {
        return fail(format!("error: {e}\n  --> {}", args.config.display()));
    }
    let device = match parse_device(&args.device) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let device = match device {
        None => Device::Cpu,
        Some(i) if tch::Cuda::is_available() && (i as i64) < tch::Cuda::device_count() => {
            Device::Cuda(i)
        }
        Some(i) => {
            return fail(format!(
                "error: --device cuda:{i} requested, but libtorch sees {} CUDA device(s)",
                tch::Cuda::device_count()
            ))
        }
    };
    let spec = TrialSpec {
        batch_size: args.batch_size,
        crop: args.crop.0,
        amp: args.amp,
        accumulative_counts: args.accum,
        warmup_steps: args.warmup,
        measured_steps: args.steps,
        device,
        seed: args.seed,
        ignore_fraction: args.ignore_fraction,
        cpu_cap_bytes: args.cpu_cap.map(|b| b as i64),
        trace: args.trace_out.is_some(),
        threads: args.threads,
        stack: args.setup.stack,
        gpus: args.setup.gpus,
        as_cuda: args.as_cuda,
    };
    let mut report = super::run(&cfg, &spec);
    if let (Some(path), Some(trace)) = (&args.trace_out, report.trace.take()) {
        if let Err(e) = std::fs::write(path, crate::predict::trace::to_text(&trace)) {
            return fail(format!(
                "error: cannot write the trace to {}: {e}",
                path.display()
            ));
        }
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("reports serialise")
        );
    } else {
        print!("{}", report.to_text());
    }
    match report.status {
        TrialStatus::Ok => 0,
        _ => 1,
    }
}

fn inspect(args: InspectArgs) -> i32 {
    let cfg = match config::resolve(&args.config, &args.cfg_options) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let model_type = |k: &str| {
        cfg.get("model")
            .and_then(|m| m.get_path(k))
            .and_then(config::Value::as_str)
            .map(str::to_string)
    };
    let mut out = serde_json::json!({
        "config": args.config.display().to_string(),
        "model_type": model_type("type"),
        "backbone_type": model_type("backbone.type"),
        "decode_head_type": model_type("decode_head.type"),
    });
    let supported = check_supported(&cfg).and_then(|_| EncoderDecoder::build(&cfg, Device::Cpu));
    match supported {
        Ok(model) => {
            out["supported"] = true.into();
            out["params_total"] = model.params.total().into();
            out["params_trainable"] = model.params.trainable().into();
            let by: serde_json::Map<String, serde_json::Value> = model
                .params
                .by_prefix()
                .into_iter()
                .map(|(k, t, tr)| (k, serde_json::json!({"total": t, "trainable": tr})))
                .collect();
            out["params_by_prefix"] = by.into();
        }
        Err(e) => {
            out["supported"] = false.into();
            out["reason"] = e.to_string().into();
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out).expect("json"));
    } else {
        println!("config: {}", args.config.display());
        for k in ["model_type", "backbone_type", "decode_head_type"] {
            println!("{k}: {}", out[k].as_str().unwrap_or("-"));
        }
        if out["supported"] == true {
            println!("supported: yes");
            println!(
                "parameters: {} total, {} trainable",
                out["params_total"], out["params_trainable"]
            );
            if let Some(by) = out["params_by_prefix"].as_object() {
                for (k, v) in by {
                    println!("  {k}: {} total, {} trainable", v["total"], v["trainable"]);
                }
            }
        } else {
            println!("supported: no ({})", out["reason"].as_str().unwrap_or(""));
        }
    }
    0
}
