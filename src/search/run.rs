//! `segtune search` as a library call: the recipe and the budget, the
//! evaluator (measured on CUDA, else predicted), the strategy with its
//! journal, the ranking, and the winner emitted as an MMSeg config.

use super::emit;
use super::evaluate::{Evaluator, MeasuredEvaluator, PredictedEvaluator};
use super::journal::{hash_text, Journal};
use super::record::{Outcome, SearchResult, TrialRecord};
use super::space::{self, Amp, Candidate, Recipe};
use super::spec::{DeviceSetting, SearchSpec};
use super::strategy::{rank, run_search, SearchSpace};
use crate::config::{self, dump, Value};
use crate::error::{Error, Result};
use crate::predict::{trace_step, Budget, Gpu, StepToTrace, TraceKind};
use crate::trial::worker::Worker;
use crate::trial::TrainingSetup;
use std::path::PathBuf;
use std::time::Duration;

/// One search: the config, the settings given on the command line (the
/// config's `segtune` dict fills the rest), and how to run it.
#[derive(Debug, Clone)]
pub struct SearchRequest {
    pub config: PathBuf,
    pub cfg_options: Vec<String>,
    pub settings: SearchSpec,
    /// Where the journal (trials.jsonl) and the emitted config go.
    pub out: PathBuf,
    /// Evaluate every candidate of the grid, without pruning (benchmarks).
    pub exhaustive: bool,
    /// How long a CUDA trial may take.
    pub trial_timeout: Duration,
    /// CPU threads of each traced step (default: half the cores).
    pub threads: Option<i32>,
    /// How predicted candidates are traced.
    pub trace: TraceKind,
    /// Classes per synthetic label map (see `TrialRequest::gt_segments`).
    pub gt_segments: Option<i64>,
}

/// Runs the search; `progress` hears of every candidate as it is decided.
pub fn search(
    request: &SearchRequest,
    worker: &Worker,
    progress: &dyn Fn(&Candidate, &TrialRecord),
) -> Result<SearchResult> {
    let cfg = config::resolve(&request.config, &request.cfg_options)?;
    let spec = request.settings.clone().or(SearchSpec::from_config(&cfg)?);
    // Before any trial: a model segtune cannot build would fail every one.
    crate::models::check_supported(&cfg).map_err(|source| Error::Model {
        source,
        config: request.config.clone(),
    })?;
    let file_name = request
        .config
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let recipe = Recipe::of(&cfg, file_name).map_err(|e| Error::Input(e.to_string()))?;
    let gpu = Gpu::choose(
        spec.preset.as_deref(),
        spec.vram.as_deref(),
        spec.compute_capability.as_deref().unwrap_or("8.6"),
    )?;
    let budget = Budget::new(&gpu, spec.margin.unwrap_or(0.05))?;
    let objective = spec.objective.unwrap_or_default();
    let gpus = spec.gpus.unwrap_or(1);
    if gpus < 1 {
        return Err(Error::Input(format!("gpus = {gpus}: give 1 or more")));
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
    let cuda = match spec.device_setting()? {
        DeviceSetting::Cpu => None,
        DeviceSetting::Auto => (worker.cuda_devices() > 0).then_some(0),
        DeviceSetting::Cuda(i) if worker.cuda_devices() > i => Some(i),
        DeviceSetting::Cuda(i) => {
            return Err(Error::Input(format!(
                "--device cuda:{i}, but no such CUDA device is visible"
            )))
        }
    };
    let (mut evaluator, journal_device): (Box<dyn Evaluator>, String) = match cuda {
        Some(i) => (
            Box::new(MeasuredEvaluator {
                worker: worker.clone(),
                config: request.config.clone(),
                cfg_options: request.cfg_options.clone(),
                device: i,
                budget: budget.clone(),
                timeout: request.trial_timeout,
                gpus,
                gt_segments: request.gt_segments,
            }),
            format!("cuda:{i}"),
        ),
        None => {
            let config_path = request.config.clone();
            let options = request.cfg_options.clone();
            let threads = request
                .threads
                .unwrap_or_else(|| (crate::trial::host_cores() / 2).max(1));
            let worker = worker.clone();
            let trace_kind = request.trace;
            let gt_segments = request.gt_segments;
            let tracer = Box::new(
                move |batch_size: i64, crop: (i64, i64), amp: Amp, knobs: space::ModelKnobs| {
                    let cfg_options = space::options_with_knobs(&options, knobs);
                    trace_step(
                        &worker,
                        &StepToTrace {
                            config: &config_path,
                            cfg_options: &cfg_options,
                            batch_size,
                            crop,
                            amp,
                            threads,
                            gt_segments,
                            setup: TrainingSetup {
                                gpus,
                                ..TrainingSetup::default()
                            },
                            kind: trace_kind,
                        },
                    )
                },
            );
            (
                Box::new(PredictedEvaluator::new(
                    budget.clone(),
                    tracer,
                    request.trace != TraceKind::CpuAllocator,
                )),
                format!(
                    "predicted:{}:{}:{:.3}:{}",
                    budget.gpu, budget.vram_bytes, budget.margin, request.trace
                ),
            )
        }
    };
    // Trials for another number of GPUs or segments are not reusable.
    let journal_device = if gpus > 1 {
        format!("{journal_device}:x{gpus}")
    } else {
        journal_device
    };
    let journal_device = match request.gt_segments {
        Some(n) => format!("{journal_device}:segments{n}"),
        None => journal_device,
    };
    let config_hash = hash_text(&dump::to_json(&Value::Dict(cfg.clone())));
    let mut journal = Journal::open(&request.out, &config_hash, &journal_device)?;
    let mode = evaluator.mode();
    let space = SearchSpace {
        crops: &crops,
        precisions: &precisions,
        batches: &batches,
        accumulation: &accumulation,
        checkpoint: space::checkpoint_available(&cfg),
        num_points: &space::num_points_options(&cfg, recipe.crop),
    };
    let explored = run_search(
        &space,
        objective,
        request.exhaustive,
        evaluator.as_mut(),
        &mut journal,
        progress,
    )?;
    let traces_run = evaluator.traces_run();
    let (feasible, infeasible): (Vec<Outcome>, Vec<Outcome>) =
        explored.outcomes.into_iter().partition(|o| o.record.fits());
    let feasible = rank(feasible, objective);
    let winner = feasible.first().cloned();
    let mut result = SearchResult {
        config: request.config.display().to_string(),
        budget,
        gpus,
        recipe: recipe.clone(),
        objective,
        mode,
        feasible,
        infeasible,
        grid_size: batches.len() * crops.len() * precisions.len(),
        trials_run: explored.ran,
        trials_resumed: explored.resumed,
        traces_run,
        winner: winner.clone(),
        emitted: Vec::new(),
        cfg_options: None,
        auto_scale_lr: false,
        journal: journal.path().display().to_string(),
        journal_skipped_lines: journal.skipped_lines(),
    };
    if let Some(w) = &winner {
        let c = w.candidate;
        let keeps = space::accumulation_for(c.batch_size, gpus, effective).is_some();
        let auto = (!keeps).then_some(effective);
        result.auto_scale_lr = !keeps;
        let header = format!(
            "Generated by segtune search for {}{} ({:.2} GiB, margin {:.0}%): batch {}, crop {}x{}, amp {}, accumulation {}{} ({}).",
            if gpus > 1 { format!("{gpus} x ") } else { String::new() },
            result.budget.gpu,
            result.budget.vram_bytes as f64 / (1u64 << 30) as f64,
            result.budget.margin * 100.0,
            c.batch_size,
            c.crop.0,
            c.crop.1,
            c.amp,
            c.accumulation,
            knobs_note(&c),
            w.record.mode.name()
        );
        let written = emit::emit(&request.config, &cfg, &c, auto, &request.out, &header)?;
        result.emitted = written.iter().map(|p| p.display().to_string()).collect();
        result.cfg_options = Some(emit::cfg_options_line(&cfg, &c, auto));
    }
    Ok(result)
}

/// How the winner's model differs from the config's, for the emitted header.
fn knobs_note(c: &space::Candidate) -> String {
    let mut note = String::new();
    if c.checkpoint {
        note.push_str(", gradient checkpointing (model.backbone.with_cp=True)");
    }
    if let Some(k) = c.num_points {
        note.push_str(&format!(
            ", Mask2Former's point loss on {k} points ({}={k})",
            space::NUM_POINTS_KEY
        ));
    }
    note
}
