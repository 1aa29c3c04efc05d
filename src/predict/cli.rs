//! `segtune estimate`: resolves the config, has the `segtune-torch` worker
//! trace one warm-up and one measured step on the CPU, and turns the trace
//! into a GPU memory prediction for the target.

use super::estimate::{
    self as model, cudnn_benchmark, parse_vram, recipe_batch_size, recipe_crop, Estimate, Target,
};
use super::trace;
use crate::cli::{worker_path, Amp, EstimateArgs, TrainingSetup};
use crate::config::{self, presets, Value};

/// Resolves the GPU target from `--preset` or `--vram`.
pub fn target_of(
    preset: Option<&str>,
    vram: Option<&str>,
    compute_capability: &str,
) -> Result<Target, String> {
    match (preset, vram) {
        (Some(name), _) => {
            let p = presets::load(name).map_err(|e| e.to_string())?;
            Ok(Target {
                gpu: p
                    .get("preset")
                    .and_then(Value::as_str)
                    .unwrap_or(name)
                    .to_string(),
                vram_bytes: presets::vram_bytes(&p).ok_or("the preset has no vram_mib")?,
                compute_capability: p
                    .get("compute_capability")
                    .and_then(Value::as_str)
                    .unwrap_or("8.6")
                    .to_string(),
            })
        }
        (None, Some(v)) => Ok(Target {
            gpu: "custom".into(),
            vram_bytes: parse_vram(v).map_err(|e| format!("error: --vram {e}"))?,
            compute_capability: compute_capability.to_string(),
        }),
        (None, None) => Err("error: give --preset NAME or --vram SIZE".into()),
    }
}

/// Runs `segtune estimate` and returns what it prints.
pub fn estimate_cmd(args: EstimateArgs) -> Result<Estimate, String> {
    let target = target_of(
        args.preset.as_deref(),
        args.vram.as_deref(),
        &args.compute_capability,
    )?;
    let cfg = config::resolve(&args.config, &args.cfg_options).map_err(|e| e.to_string())?;
    let batch = args
        .batch_size
        .or_else(|| recipe_batch_size(&cfg))
        .ok_or("error: the config has no train_dataloader.batch_size; pass --batch-size")?;
    let crop = args
        .crop
        .map(|c| c.0)
        .or_else(|| recipe_crop(&cfg))
        .ok_or("error: the config has no crop size; pass --crop HxW")?;
    let recipe_amp = cfg
        .get("optim_wrapper")
        .filter(|o| o.get_path("type").and_then(Value::as_str) == Some("AmpOptimWrapper"))
        .map(|o| {
            if o.get_path("dtype").and_then(Value::as_str) == Some("bfloat16") {
                Amp::Bf16
            } else {
                Amp::Fp16
            }
        });
    let amp = args.amp.or(recipe_amp).unwrap_or(Amp::Off);
    let benchmark = cudnn_benchmark(&cfg);
    let threads = args.threads.unwrap_or_else(crate::cli::cores);
    let trace = |b| {
        trace_step(
            &args.config,
            &args.cfg_options,
            b,
            crop,
            amp,
            threads,
            args.setup,
        )
    };
    let (events, cpu_peak) = if batch <= 3 {
        let (events, peak, _) = trace(batch)?;
        (events, Some(peak))
    } else {
        let (ba, bb) = super::extrapolate::TRACED_BATCHES;
        let (one, _, _) = trace(ba)?;
        let (two, _, _) = trace(bb)?;
        (
            super::extrapolate::extrapolate(&one, &two, batch)
                .map_err(|e| format!("error: {e}"))?,
            None,
        )
    };
    let mut e = model::estimate(
        &events,
        &target,
        batch,
        crop,
        amp.name(),
        benchmark,
        cpu_peak,
    );
    if args.setup.gpus > 1 {
        e.notes.push(format!(
            "per GPU of {} training data-parallel: includes DDP's gradient buckets (one more copy of the trainable parameters)",
            args.setup.gpus
        ));
    }
    if args.setup.stack == crate::cli::Stack::Zoo2021 {
        e.notes.push("stack zoo-2021: PyTorch <= 1.10 with the mmcv 1.x runner (softmax and log_softmax keep their input for backward; gradients are zeroed, not freed), as MMSeg's model-zoo memory was measured".into());
    }
    if cpu_peak.is_none() {
        e.notes.push(format!("batch {batch} was extrapolated from traces at batch 2 and 3 (every step tensor is affine in the batch)"));
    }
    Ok(e)
}

/// Traces a warm-up and a measured training step of `config` on the CPU in
/// the `segtune-torch` worker; returns the trace and the CPU peak.
pub fn trace_step(
    config: &std::path::Path,
    cfg_options: &[String],
    batch: i64,
    crop: (i64, i64),
    amp: Amp,
    threads: i32,
    setup: TrainingSetup,
) -> Result<(Vec<trace::TraceEvent>, i64, f64), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("error: no temporary directory: {e}"))?;
    let trace_path = dir.path().join("step.trace");
    let mut cmd = std::process::Command::new(worker_path()?);
    cmd.arg("trial")
        .arg(config)
        .args([
            "--batch-size",
            &batch.to_string(),
            "--crop",
            &format!("{}x{}", crop.0, crop.1),
        ])
        .args([
            "--amp",
            amp.name(),
            "--warmup",
            "1",
            "--steps",
            "1",
            "--ignore-fraction",
            "0",
        ])
        .args(["--threads", &threads.to_string(), "--json", "--trace-out"])
        .arg(&trace_path)
        .args([
            "--gpus",
            &setup.gpus.to_string(),
            "--stack",
            setup.stack.name(),
        ])
        .arg("--as-cuda");
    if !cfg_options.is_empty() {
        cmd.arg("--cfg-options").args(cfg_options);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("error: cannot run segtune-torch: {e}"))?;
    if out.status.code() == Some(crate::cli::EXIT_INPUT_ERROR) {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("error: the trial's report is unreadable: {e}"))?;
    if report["status"] != "ok" {
        return Err(format!(
            "error: the traced CPU step failed ({}): {}",
            report["status"], report["message"]
        ));
    }
    let text = std::fs::read_to_string(&trace_path).map_err(|e| format!("error: no trace: {e}"))?;
    Ok((
        trace::from_text(&text)?,
        report["peak_bytes"].as_i64().unwrap_or(0),
        report["forward_flops"].as_f64().unwrap_or(0.0),
    ))
}

/// `segtune estimate`, rendered.
pub fn estimate(args: EstimateArgs) -> Result<String, String> {
    let json = args.json;
    let e = estimate_cmd(args)?;
    if json {
        return Ok(serde_json::to_string_pretty(&e).expect("estimates serialise") + "\n");
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut out = format!(
        "predicted for {} ({:.2} GiB), batch {} x {}x{}, amp {}, cudnn_benchmark {}\n",
        e.gpu,
        gib(e.vram_bytes),
        e.batch_size,
        e.crop[0],
        e.crop[1],
        e.amp,
        e.cudnn_benchmark
    );
    out.push_str(&format!(
        "  predicted peak allocated (max_memory_allocated): {:>8.3} GiB\n",
        gib(e.predicted_peak_allocated_bytes)
    ));
    out.push_str(&format!(
        "  predicted peak reserved  (max_memory_reserved):  {:>8.3} GiB\n",
        gib(e.predicted_peak_reserved_bytes)
    ));
    out.push_str(&format!(
        "  predicted device memory (reserved + context):    {:>8.3} GiB\n",
        gib(e.predicted_device_bytes)
    ));
    out.push_str(&format!(
        "  predicted peak phase: {}\n",
        e.predicted_peak_phase
    ));
    out.push_str("  fixed terms (predicted):\n");
    for t in &e.fixed_terms {
        out.push_str(&format!(
            "    {:<20} {:>8.3} GiB  {}  ({})\n",
            t.name,
            gib(t.bytes),
            if t.in_allocated {
                "in allocated"
            } else {
                "outside the allocator"
            },
            t.source
        ));
    }
    out.push_str(&format!(
        "  fits in {}: {} (predicted)\n",
        e.gpu,
        if e.fits { "yes" } else { "no" }
    ));
    for n in &e.notes {
        out.push_str(&format!("  note: {n}\n"));
    }
    Ok(out)
}
