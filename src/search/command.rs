//! `segtune search`: reads the recipe and the budget, runs the search with
//! a journal and a progress bar, ranks, emits the winner, renders the table.

use super::emit;
use super::journal::{hash_text, Journal};
use super::space::{self, Amp, Candidate, Recipe};
use super::{
    rank, run_search, Budget, CudaEvaluator, Evaluator, FailEvery, Outcome, PredictedEvaluator,
    SearchResult, SearchSpace, SearchSpec,
};
use crate::cli::SearchArgs;
use crate::config::{self, dump, presets, Value};
use crate::predict::estimate::parse_vram;
use tabled::builder::Builder;

fn spec_from_config(cfg: &config::Dict) -> SearchSpec {
    let d = cfg.get("segtune").and_then(Value::as_dict);
    let s = |k: &str| d.and_then(|d| d.get(k)).map(config::value::python_str);
    SearchSpec {
        vram: s("vram"),
        preset: s("preset"),
        margin: d.and_then(|d| d.get("margin")).and_then(Value::as_f64),
        objective: s("objective"),
        device: s("device"),
        compute_capability: s("compute_capability"),
        gpus: d.and_then(|d| d.get("gpus")).and_then(Value::as_i64),
    }
}

fn budget(spec: &SearchSpec, compute_capability: &str) -> Result<Budget, String> {
    let margin = spec.margin.unwrap_or(0.05);
    if !(0.0..0.9).contains(&margin) {
        return Err(format!("error: --margin {margin} must be in [0, 0.9)"));
    }
    let num = |d: &config::Dict, k: &str, default: f64| {
        d.get(k).and_then(Value::as_f64).unwrap_or(default)
    };
    let (gpu, vram, cc, bf16, fp32, fp16, bf16t, bw) = match (&spec.preset, &spec.vram) {
        (Some(name), _) => {
            let p = presets::load(name).map_err(|e| e.to_string())?;
            (
                p.get("preset").and_then(Value::as_str).unwrap_or(name).to_string(),
                presets::vram_bytes(&p).ok_or("the preset has no vram_mib")?,
                p.get("compute_capability").and_then(Value::as_str).unwrap_or("8.6").to_string(),
                p.get("bf16").is_some_and(Value::truthy),
                num(&p, "fp32_tflops", 10.0),
                num(&p, "fp16_tflops", 40.0),
                num(&p, "bf16_tflops", 40.0),
                num(&p, "memory_bandwidth_gbs", 500.0),
            )
        }
        (None, Some(v)) => {
            let bytes = parse_vram(v).map_err(|e| format!("error: --vram {e}"))?;
            let bf16 = compute_capability.split('.').next().and_then(|m| m.parse::<u32>().ok()).is_some_and(|m| m >= 8);
            ("custom".to_string(), bytes, compute_capability.to_string(), bf16, 10.0, 40.0, if bf16 { 40.0 } else { 0.0 }, 500.0)
        }
        (None, None) => return Err("error: give --vram SIZE or --preset NAME (or a `segtune` section with one of them in the config)".into()),
    };
    let context = crate::predict::estimate::cuda_context_bytes(&cc);
    let usable = (vram as f64 * (1.0 - margin)) as u64;
    if usable <= context {
        return Err(format!(
            "error: the budget of {:.2} GiB leaves nothing after the CUDA context ({:.2} GiB) and the {:.0}% margin",
            vram as f64 / (1u64 << 30) as f64,
            context as f64 / (1u64 << 30) as f64,
            margin * 100.0
        ));
    }
    Ok(Budget {
        gpu,
        vram_bytes: vram,
        compute_capability: cc,
        bf16,
        fp16_tflops: fp16,
        fp32_tflops: fp32,
        bf16_tflops: bf16t,
        bandwidth_gbs: bw,
        margin,
        cuda_context_bytes: context,
        usable_bytes: usable,
    })
}

fn cuda_devices() -> usize {
    let Ok(worker) = crate::cli::worker_path() else {
        return 0;
    };
    std::process::Command::new(worker)
        .arg("devices")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `segtune search`; returns the result (the caller renders it).
pub fn search(args: &SearchArgs) -> Result<SearchResult, String> {
    let cfg = config::resolve(&args.config, &args.cfg_options).map_err(|e| e.to_string())?;
    crate::predict::estimate::recipe_crop(&cfg).ok_or(
        "error: the config has no crop size (crop_size, RandomCrop or data_preprocessor.size)",
    )?;
    let from_cfg = spec_from_config(&cfg);
    let spec = SearchSpec {
        vram: args.vram.clone().or(if args.preset.is_some() {
            None
        } else {
            from_cfg.vram.clone()
        }),
        preset: args.preset.clone().or(if args.vram.is_some() {
            None
        } else {
            from_cfg.preset.clone()
        }),
        margin: args.margin.or(from_cfg.margin),
        objective: args.objective.clone().or(from_cfg.objective.clone()),
        device: args.device.clone().or(from_cfg.device.clone()),
        compute_capability: args
            .compute_capability
            .clone()
            .or(from_cfg.compute_capability.clone()),
        gpus: args.gpus.or(from_cfg.gpus),
    };
    let budget = budget(&spec, spec.compute_capability.as_deref().unwrap_or("8.6"))?;
    let objective = spec.objective.clone().unwrap_or_else(|| "keep-crop".into());
    if !matches!(objective.as_str(), "keep-crop" | "throughput") {
        return Err(format!(
            "error: objective `{objective}`: use keep-crop or throughput"
        ));
    }
    let keep_crop = objective == "keep-crop";
    let file_name = args
        .config
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let recipe = Recipe::of(&cfg, file_name).map_err(|e| format!("error: {e}"))?;
    let gpus = spec.gpus.unwrap_or(1);
    if gpus < 1 {
        return Err(format!("error: gpus = {gpus}: give 1 or more"));
    }
    let batches = space::batch_sizes(&recipe, gpus);
    let crops = space::crops(recipe.crop);
    let mut precisions = vec![Amp::Off, Amp::Fp16];
    if budget.bf16 {
        precisions.push(Amp::Bf16);
    }
    let effective = recipe.effective_batch;
    let accumulation = move |b: i64| match space::accumulation_for(b, gpus, effective) {
        Some(a) => (a, true),
        None => (1, false),
    };
    let device_text = spec.device.clone().unwrap_or_else(|| "auto".into());
    let cuda = match device_text.as_str() {
        "cpu" => None,
        "auto" => (cuda_devices() > 0).then_some(0),
        other => match crate::cli::parse_device(other)? {
            None => None,
            Some(i) if cuda_devices() > i => Some(i),
            Some(i) => {
                return Err(format!(
                    "error: --device cuda:{i}, but no such CUDA device is visible"
                ))
            }
        },
    };
    let (mut evaluator, journal_device): (Box<dyn Evaluator>, String) = match cuda {
        Some(i) => (
            Box::new(CudaEvaluator {
                config: args.config.clone(),
                cfg_options: args.cfg_options.clone(),
                device: i,
                budget: budget.clone(),
                timeout: std::time::Duration::from_secs(args.trial_timeout),
                gpus,
            }),
            format!("cuda:{i}"),
        ),
        None => {
            let config_path = args.config.clone();
            let options = args.cfg_options.clone();
            let threads = args
                .threads
                .unwrap_or_else(|| (crate::cli::cores() / 2).max(1));
            let tracer = Box::new(move |b: i64, crop: (i64, i64), amp: Amp| {
                crate::predict::cli::trace_step(
                    &config_path,
                    &options,
                    b,
                    crop,
                    amp,
                    threads,
                    crate::cli::TrainingSetup {
                        gpus,
                        ..Default::default()
                    },
                )
                .map(|(e, _, f)| (e, f))
            });
            (
                Box::new(PredictedEvaluator::new(budget.clone(), tracer)),
                format!(
                    "predicted:{}:{}:{:.3}",
                    budget.gpu, budget.vram_bytes, budget.margin
                ),
            )
        }
    };
    let fail_every: usize = std::env::var("SEGTUNE_TEST_FAIL_EVERY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if fail_every > 0 {
        evaluator = Box::new(FailEvery {
            inner: evaluator,
            every: fail_every,
            count: 0,
        });
    }
    // Trials for another number of GPUs are not reusable.
    let journal_device = if gpus > 1 {
        format!("{journal_device}:x{gpus}")
    } else {
        journal_device
    };
    let config_hash = hash_text(&dump::to_json(&Value::Dict(cfg.clone())));
    let mut journal = Journal::open(&args.out, &config_hash, &journal_device)?;
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}")
            .expect("static template"),
    );
    if args.json || args.quiet {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let mode = evaluator.mode().to_string();
    let progress = |c: &Candidate, r: &super::TrialRecord| {
        bar.set_message(format!(
            "{} trial b{} {}x{} {}: {}",
            r.mode,
            c.batch_size,
            c.crop.0,
            c.crop.1,
            c.amp.name(),
            r.status
        ));
    };
    let space = SearchSpace {
        crops: &crops,
        precisions: &precisions,
        batches: &batches,
        accumulation: &accumulation,
    };
    let (outcomes, ran, resumed) = run_search(
        &space,
        keep_crop,
        args.exhaustive,
        evaluator.as_mut(),
        &mut journal,
        &progress,
    )?;
    bar.finish_and_clear();
    let traces_run = evaluator.traces_run();
    let (feasible, infeasible): (Vec<Outcome>, Vec<Outcome>) =
        outcomes.into_iter().partition(|o| o.record.fits());
    let feasible = rank(feasible, keep_crop);
    let winner = feasible.first().cloned();
    let mut result = SearchResult {
        config: args.config.display().to_string(),
        budget,
        gpus,
        recipe: recipe.clone(),
        objective,
        mode,
        feasible,
        infeasible,
        grid_size: batches.len() * crops.len() * precisions.len(),
        trials_run: ran,
        trials_resumed: resumed,
        traces_run,
        winner: winner.clone(),
        emitted: Vec::new(),
        cfg_options: None,
        auto_scale_lr: false,
        journal: journal.path().display().to_string(),
    };
    if let Some(w) = &winner {
        let c = w.candidate;
        let keeps = space::accumulation_for(c.batch_size, gpus, effective).is_some();
        let auto = (!keeps).then_some(effective);
        result.auto_scale_lr = !keeps;
        let header = format!(
            "Generated by segtune search for {}{} ({:.2} GiB, margin {:.0}%): batch {}, crop {}x{}, amp {}, accumulation {} ({}).",
            if gpus > 1 { format!("{gpus} x ") } else { String::new() },
            result.budget.gpu,
            result.budget.vram_bytes as f64 / (1u64 << 30) as f64,
            result.budget.margin * 100.0,
            c.batch_size,
            c.crop.0,
            c.crop.1,
            c.amp.name(),
            c.accumulation,
            w.record.mode
        );
        let written = emit::emit(&args.config, &cfg, &c, auto, &args.out, &header)?;
        result.emitted = written.iter().map(|p| p.display().to_string()).collect();
        result.cfg_options = Some(emit::cfg_options_line(&cfg, &c, auto));
    }
    Ok(result)
}

fn gib(b: Option<u64>) -> String {
    b.map_or("-".into(), |b| {
        format!("{:.2}", b as f64 / (1u64 << 30) as f64)
    })
}

/// The result as text: the ranked table, infeasible ones with `--all`.
pub fn render(r: &SearchResult, all: bool) -> String {
    let mut out = format!(
        "segtune search: {} on {}{} ({:.2} GiB, usable {:.2} GiB after a {:.0}% margin; CUDA context {:.2} GiB)\n",
        r.config,
        if r.gpus > 1 { format!("{} x ", r.gpus) } else { String::new() },
        r.budget.gpu,
        r.budget.vram_bytes as f64 / (1u64 << 30) as f64,
        r.budget.usable_bytes as f64 / (1u64 << 30) as f64,
        r.budget.margin * 100.0,
        r.budget.cuda_context_bytes as f64 / (1u64 << 30) as f64
    );
    out.push_str(&format!(
        "recipe: batch {}, crop {}x{}, effective batch {} (from {}); objective {}; {} trials\n",
        r.recipe.batch_size,
        r.recipe.crop.0,
        r.recipe.crop.1,
        r.recipe.effective_batch,
        r.recipe.effective_batch_source,
        r.objective,
        r.mode
    ));
    let mut b = Builder::default();
    b.push_record([
        "rank",
        "batch",
        "crop",
        "accum",
        "eff. batch",
        "amp",
        "peak GiB",
        "% budget",
        "images/s",
        "how",
    ]);
    for (i, o) in r.feasible.iter().enumerate() {
        let c = o.candidate;
        let device = o.record.device_bytes.unwrap_or(0) as f64;
        b.push_record([
            (i + 1).to_string(),
            c.batch_size.to_string(),
            format!("{}x{}", c.crop.0, c.crop.1),
            c.accumulation.to_string(),
            c.effective_batch(r.gpus).to_string(),
            c.amp.name().to_string(),
            gib(o.record.device_bytes),
            format!("{:.0}%", 100.0 * device / r.budget.usable_bytes as f64),
            o.record
                .images_per_s
                .map_or("-".into(), |v| format!("{v:.2}")),
            if o.record.mode == "predicted" {
                "predicted".into()
            } else {
                "measured".into()
            },
        ]);
    }
    if r.feasible.is_empty() {
        out.push_str("no candidate fits this budget.\n");
    } else {
        out.push_str(&b.build().to_string());
        out.push('\n');
    }
    if all && !r.infeasible.is_empty() {
        let mut b = Builder::default();
        b.push_record(["batch", "crop", "amp", "accum", "status", "reason", "how"]);
        for o in &r.infeasible {
            let c = o.candidate;
            b.push_record([
                c.batch_size.to_string(),
                format!("{}x{}", c.crop.0, c.crop.1),
                c.amp.name().to_string(),
                c.accumulation.to_string(),
                o.record.status.clone(),
                o.record.reason.clone().unwrap_or_default(),
                o.record.mode.clone(),
            ]);
        }
        out.push_str("infeasible:\n");
        out.push_str(&b.build().to_string());
        out.push('\n');
    } else if !r.infeasible.is_empty() {
        out.push_str(&format!(
            "{} infeasible candidates (--all lists them with the reason)\n",
            r.infeasible.len()
        ));
    }
    out.push_str(&format!(
        "trials: {} run now, {} from the journal ({}), of a grid of {}\n",
        r.trials_run, r.trials_resumed, r.journal, r.grid_size
    ));
    if r.auto_scale_lr {
        out.push_str("note: no batch size keeps the recipe's effective batch; auto_scale_lr is enabled in the emitted config\n");
    }
    if let Some(w) = &r.winner {
        out.push_str(&format!(
            "winner: batch {} x crop {}x{}, amp {}, accumulation {} ({})\n",
            w.candidate.batch_size,
            w.candidate.crop.0,
            w.candidate.crop.1,
            w.candidate.amp.name(),
            w.candidate.accumulation,
            w.record.mode
        ));
        for p in &r.emitted {
            out.push_str(&format!("wrote {p}\n"));
        }
        if let Some(o) = &r.cfg_options {
            out.push_str(&format!("tools/train.py equivalent: {o}\n"));
        }
    }
    out
}
