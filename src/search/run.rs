//! `segtune search` as a library call: the recipe and the budget, the
//! evaluator (measured on CUDA, else predicted), the strategy with its
//! journal, the ranking, and the winner emitted as an MMSeg config.

use super::checks::{
    check_buildable, check_outputs, python_worker_limits, some_memory_verdict, some_verdict,
};
use super::confirm::{confirm, Confirmation};
use super::emit;
pub use super::evaluate::predictor;
pub(super) use super::evaluate::trace_slots;
use super::evaluate::{Evaluator, MeasuredEvaluator};
use super::journal::{hash_text, Inputs, Journal};
use super::knobs;
use super::record::{Mode, Outcome, SearchResult};
use super::saved;
use super::space::{self, Amp, Recipe};
use super::spec::Objective;
use super::spec::{DeviceSetting, SearchSpec};
use super::strategy::{rank, run_search_on, slots, Explored, Progress, Ranking, SearchSpace};
use crate::config::{self, dump, Value};
use crate::error::{Error, Result};
use crate::kinds::torch_version::VersionSource;
use crate::kinds::{RunMode, TorchVersion, TrainingSetup};
use crate::predict::estimate::BatchLayout;
use crate::predict::{Budget, Gpu, TraceKind};
use crate::worker::Worker;
use std::path::PathBuf;
use std::time::Duration;

/// One search: the config, what is searched (the settings given on the
/// command line; the config's `segtune` dict fills the rest), and how its
/// candidates run ([`SearchRun`]).
#[derive(Debug, Clone)]
pub struct SearchRequest {
    pub config: PathBuf,
    pub cfg_options: Vec<String>,
    pub settings: SearchSpec,
    /// `--amp`: the precisions the search may choose (`None`: fp32, fp16,
    /// and bf16 where the GPU has it).
    pub precisions: Option<Vec<Amp>>,
    /// Search training settings, or inference settings (`super::infer`).
    pub mode: RunMode,
    /// Evaluate every candidate of the grid, without pruning (benchmarks).
    pub exhaustive: bool,
    /// Where the journal (trials.jsonl) and the emitted config go.
    pub out: PathBuf,
    /// How the candidates are traced and tried.
    pub run: SearchRun,
}

/// How a search runs its candidates: where and how long, how their steps
/// are traced, with which worker. None of it changes what is searched.
#[derive(Debug, Clone)]
pub struct SearchRun {
    /// How long a CUDA trial may take.
    pub trial_timeout: Duration,
    /// CPU threads of each traced step (default: half the cores).
    pub threads: Option<i32>,
    /// How predicted candidates are traced.
    pub trace: TraceKind,
    /// Classes per synthetic label map (see `TrialRequest::gt_segments`).
    pub gt_segments: Option<i64>,
    /// Whether to ask the user's Python for its torch (a short child
    /// process) when neither `--torch` nor the config's `segtune.torch`
    /// names a release; asked only then.
    pub ask_python_torch: bool,
    /// `--cudnn-benchmark on|off` (default: the config's
    /// `env_cfg.cudnn_benchmark`).
    pub cudnn_benchmark: Option<bool>,
    /// `--trace-timeout`: each traced step's deadline (default: scaled from
    /// the step, see [`crate::predict::step_trace::trace_deadline`]).
    pub trace_timeout: Option<std::time::Duration>,
    /// Where the trials run and how many at once (`--devices`,
    /// `--launcher slurm`).
    pub placement: super::Placement,
    /// Traced steps kept on disk (`--trace-cache DIR`; `segtune atlas`'s
    /// shared by its presets): a step traced once is replayed, not traced.
    pub trace_cache: Option<std::sync::Arc<crate::predict::TraceCache>>,
    /// `--python-worker`: every step traced by MMSeg itself in this Python
    /// (the config's `custom_imports` imported, the user's code run), for
    /// models with types segtune does not build. Predicted, fp32, one GPU.
    pub python: Option<crate::worker::python_worker::PythonWorker>,
}

impl Default for SearchRun {
    /// segtune's own worker, meta traces, 10-minute trials, here.
    fn default() -> Self {
        SearchRun {
            trial_timeout: Duration::from_secs(600),
            threads: None,
            trace: TraceKind::Meta,
            gt_segments: None,
            ask_python_torch: false,
            cudnn_benchmark: None,
            trace_timeout: None,
            placement: Default::default(),
            trace_cache: None,
            python: None,
        }
    }
}

impl SearchRequest {
    /// The PyTorch release to predict for and where that choice came from.
    pub fn torch(&self, spec: &SearchSpec) -> (TorchVersion, VersionSource) {
        if let Some(v) = spec.torch {
            return (v, VersionSource::Given);
        }
        match self
            .run
            .ask_python_torch
            .then(crate::worker::machine::detect_python_torch)
            .flatten()
        {
            Some((v, python)) => (v, VersionSource::Python(python)),
            None => (TorchVersion::NEWEST, VersionSource::Newest),
        }
    }
}

/// Runs the search; `progress` hears of every candidate as it is decided.
/// On a CUDA device the candidates are predicted first and the best of them
/// confirmed by real trials ([`super::confirm`]); else they are predicted.
pub fn search(
    request: &SearchRequest,
    worker: &Worker,
    progress: Progress,
) -> Result<SearchResult> {
    if let Some(cache) = &request.run.trace_cache {
        cache.check()?;
    }
    let worker = &request.run.placement.place(worker, &request.out)?;
    // What waits on other processes starts now and overlaps: the fork
    // servers' libtorch, the CUDA device count, the Python's PyTorch.
    worker.prestart_servers(trace_slots(request, 1));
    if request.settings.torch.is_none() && request.run.ask_python_torch {
        crate::worker::machine::prefetch_python_torch();
    }
    if request.settings.device.as_deref() != Some("cpu") {
        worker.prefetch_cuda_devices();
    }
    if request.mode == RunMode::Infer {
        return super::infer::search_inference(request, worker, progress);
    }
    let gpus = CudaTrials { request, worker };
    let result = search_with(request, worker, progress, &gpus);
    if request.run.placement.slurm.is_some() {
        // Only when empty: the traces' directory the nodes shared.
        let _ = std::fs::remove_dir(request.out.join(".segtune-tmp"));
    }
    result
}

/// Where real trials run: the CUDA devices there are, and an evaluator of
/// trials on one of them. Tests stand in a fake GPU.
pub trait RealTrials {
    fn devices(&self) -> usize;
    /// Evaluates candidates by real trials on `device` for `budget`, as one
    /// of `gpus` data-parallel GPUs.
    fn evaluator(&self, device: usize, budget: &Budget, gpus: i64) -> Box<dyn Evaluator>;
}

/// Real CUDA trials, each in its own worker process.
pub(super) struct CudaTrials<'a> {
    pub(super) request: &'a SearchRequest,
    pub(super) worker: &'a Worker,
}

impl RealTrials for CudaTrials<'_> {
    fn devices(&self) -> usize {
        self.worker.cuda_devices()
    }

    fn evaluator(&self, device: usize, budget: &Budget, gpus: i64) -> Box<dyn Evaluator> {
        Box::new(MeasuredEvaluator {
            worker: self.worker.clone(),
            config: self.request.config.clone(),
            cfg_options: self.request.cfg_options.clone(),
            device,
            budget: budget.clone(),
            timeout: self.request.run.trial_timeout,
            gpus,
            gt_segments: self.request.run.gt_segments,
            mode: self.request.mode,
            cudnn_benchmark: self.request.run.cudnn_benchmark,
        })
    }
}

/// [`search`] with real trials from `real` (see [`RealTrials`]).
pub fn search_with(
    request: &SearchRequest,
    worker: &Worker,
    progress: Progress,
    real: &dyn RealTrials,
) -> Result<SearchResult> {
    let prepared = prepare(request, worker, None, emit::TRAIN_SUFFIX)?;
    let plan = TrainingPlan::of(&prepared, request, real)?;
    // One predictor per slot: traces run side by side as trials do.
    let traces_at_once = trace_slots(request, plan.slots);
    let mut predictors: Vec<Box<dyn Evaluator>> = (0..traces_at_once)
        .map(|_| {
            let layout = prepared.layout;
            predictor(
                request,
                worker,
                &plan.budget,
                plan.setup,
                layout,
                traces_at_once,
            )
        })
        .collect();
    let inputs = journal_inputs(request, &prepared, &plan.budget, plan.setup, worker);
    let mut journal = Journal::open(&request.out, inputs, &plan.predicted_device)?;
    let space = plan.space();
    let explored = explore(
        &plan,
        &space,
        request,
        real,
        &mut predictors,
        &mut journal,
        progress,
    )?;
    let found = Found {
        explored,
        mode: if plan.cuda.is_some() {
            Mode::Measured
        } else {
            Mode::Predicted
        },
        traces_run: predictors.iter().map(|p| p.traces_run()).sum(),
    };
    let head = ResultHead {
        run_mode: RunMode::Train,
        budget: plan.budget.clone(),
        gpus: plan.setup.gpus,
        torch: (plan.setup.torch, plan.torch_source.clone()),
        recipe: plan.recipe.clone(),
        objective: plan.objective,
        ranking: plan.ranking,
        grid_size: plan.batches.len() * plan.crops.len() * plan.precisions.len(),
    };
    let mut result = assemble(request, head, found, &journal)?;
    result.recipe_outcome =
        super::winner::recipe_outcome(&plan, &result, &mut predictors, &mut journal);
    super::winner::emit_training_winner(request, &prepared, &plan, &mut result)?;
    saved::save_result(request, &result, prepared.config_hash, journal.inputs())?;
    Ok(result)
}

/// A search's config and settings, checked before any trial.
pub(super) struct Prepared {
    pub(super) cfg: crate::config::Dict,
    pub(super) spec: SearchSpec,
    /// The journal's key: the resolved config's hash.
    pub(super) config_hash: String,
    /// How the model takes its batch (MMSeg's, or transformers').
    pub(super) layout: BatchLayout,
}

/// Resolves the config and its settings, and refuses before any trial
/// what would fail late: an `--out` that cannot take the winner (written as
/// `written_as` says, else as the config's batch layout implies; named
/// with `suffix`) and a model segtune cannot build.
pub(super) fn prepare(
    request: &SearchRequest,
    worker: &Worker,
    written_as: Option<BatchLayout>,
    suffix: &str,
) -> Result<Prepared> {
    let cfg = config::resolve(&request.config, &request.cfg_options)?;
    if let Some(why) = super::recipe::mmseg_0x_layout(&cfg) {
        return Err(Error::Input(format!("{}: {why}", request.config.display())));
    }
    let spec = request.settings.clone().or(SearchSpec::from_config(&cfg)?);
    let layout = BatchLayout::of(&cfg);
    check_outputs(request, written_as.unwrap_or(layout), suffix)?;
    check_buildable(&cfg, request, worker)?;
    let config_hash = hash_text(&dump::to_json(&Value::Dict(cfg.clone())));
    Ok(Prepared {
        cfg,
        spec,
        config_hash,
        layout,
    })
}

/// What a search's verdicts depend on besides the candidate, for its
/// journal's keys: a row recorded with other inputs is evaluated again.
/// The resolved config (with `--cfg-options`, the config's `env_cfg` and
/// `segtune` settings), the GPU (named, and every preset fact hashed),
/// cuDNN's benchmark mode as the step runs it, the PyTorch release and
/// what its allocator offers, GPUs, label segments, the trace kind, the
/// environment's allocator settings (real trials' CUDA allocator reads
/// them) and the worker build.
pub(super) fn journal_inputs(
    request: &SearchRequest,
    prepared: &Prepared,
    budget: &Budget,
    setup: TrainingSetup,
    worker: &Worker,
) -> Inputs {
    let on_off = |b: bool| if b { "on" } else { "off" };
    let cudnn_benchmark = request
        .run
        .cudnn_benchmark
        .unwrap_or_else(|| crate::trial::cudnn_flags::cudnn_benchmark(&prepared.cfg));
    let alloc_conf = ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| format!("{name}={v}")))
        .collect::<Vec<_>>();
    Inputs::from(prepared.config_hash.as_str())
        .with("mode", request.mode)
        .with("GPU", &budget.gpu)
        .with("VRAM", format!("{} bytes", budget.vram_bytes))
        .with("compute capability", &budget.compute_capability)
        .with("margin", format!("{:.3}", budget.margin))
        .with(
            "GPU facts",
            hash_text(&serde_json::to_string(budget).unwrap_or_default()),
        )
        .with("cuDNN benchmark", on_off(cudnn_benchmark))
        .with("PyTorch", setup.torch)
        .with(
            "allocator",
            if setup.torch.has(crate::kinds::Switch::ExpandableSegments) {
                "expandable_segments offered"
            } else {
                "no expandable_segments"
            },
        )
        .with("GPUs", setup.gpus)
        .with(
            "label segments",
            request
                .run
                .gt_segments
                .map_or("default".to_string(), |n| n.to_string()),
        )
        .with("trace", request.run.trace)
        .with(
            "PYTORCH_CUDA_ALLOC_CONF",
            if alloc_conf.is_empty() {
                "unset".to_string()
            } else {
                alloc_conf.join(" ")
            },
        )
        .with("worker", hash_text(&worker.stamp()))
}

/// The precisions a training search tries on the budget's GPU: `asked`
/// (`--amp`; `None`: all) of fp32, fp16 and bf16 where the GPU has it.
fn precisions_on(budget: &Budget, asked: Option<&[Amp]>) -> Result<Vec<Amp>> {
    let mut offered = vec![Amp::Off, Amp::Fp16];
    if budget.bf16 {
        offered.push(Amp::Bf16);
    }
    space::precisions(asked, &offered).map_err(|e| {
        let bf16 = if budget.bf16 {
            String::new()
        } else {
            format!(
                " (bf16 needs compute capability 8.0 or newer; the {} has {})",
                budget.gpu, budget.compute_capability
            )
        };
        Error::Input(format!("{e}{bf16}"))
    })
}

/// A training search's grid and where it runs: the recipe, the budget, the
/// batches, crops and precisions, the PyTorch release, the CUDA device for
/// real trials (if any) and the journal's device keys.
pub(super) struct TrainingPlan {
    pub(super) recipe: Recipe,
    pub(super) budget: Budget,
    pub(super) objective: super::spec::Objective,
    /// How the feasible candidates are ordered (the recipe's precision and
    /// effective batch before speed).
    pub(super) ranking: Ranking,
    pub(super) schedule: super::recipe::Schedule,
    pub(super) setup: TrainingSetup,
    pub(super) torch_source: String,
    pub(super) batches: Vec<i64>,
    pub(super) crops: Vec<(i64, i64)>,
    pub(super) precisions: Vec<Amp>,
    /// The accumulation that keeps the recipe's effective batch at a batch
    /// size, and whether one does.
    pub(super) accumulation: Box<dyn Fn(i64) -> (i64, bool)>,
    /// The model knobs tried after the grid, in turn (`knobs::fallback_passes`).
    pub(super) fallbacks: Vec<space::ModelKnobs>,
    pub(super) cuda: Option<usize>,
    /// The CUDA devices real trials run on at once (`cuda` first; on
    /// Slurm, device 0 of each job's node, `--max-parallel` times).
    pub(super) measure_on: Vec<usize>,
    /// Evaluators at once (`--devices`, `--max-parallel`; else 1).
    pub(super) slots: usize,
    /// The journal's device key of predictions, and the suffix of real
    /// trials' (`cuda:N<suffix>`): trials for another number of GPUs,
    /// segments or PyTorch are not reusable.
    pub(super) predicted_device: String,
    pub(super) trial_suffix: String,
}

/// The CUDA device a search's real trials check on, and the devices its
/// trials are measured on (none: predicted only).
fn measuring_devices(
    placement: &crate::search::Placement,
    spec: &SearchSpec,
    visible: usize,
    slots: usize,
    torch: TorchVersion,
) -> Result<(Option<usize>, Vec<usize>)> {
    Ok(match &placement.devices {
        Some(d) if d.cpu_only() => (None, Vec::new()),
        Some(d) => {
            let listed = d.cuda(visible);
            let Some(first) = listed.first().copied() else {
                return Err(Error::Input(
                    "--devices all, but no CUDA device is visible".into(),
                ));
            };
            let spec = SearchSpec {
                device: Some(format!("cuda:{first}")),
                ..spec.clone()
            };
            (cuda_device(&spec, visible, torch)?, listed)
        }
        None => {
            let cuda = cuda_device(spec, visible, torch)?;
            let times = if placement.slurm.is_some() { slots } else { 1 };
            (cuda, cuda.map_or(Vec::new(), |i| vec![i; times]))
        }
    })
}

/// The journal's device key of predictions, and the suffix of real
/// trials' keys: what makes a row another setup's.
fn journal_devices(
    budget: &Budget,
    request: &SearchRequest,
    gpus: i64,
    torch: TorchVersion,
) -> (String, String) {
    let mut trial_suffix = if gpus > 1 {
        format!(":x{gpus}")
    } else {
        String::new()
    };
    if torch != TorchVersion::NEWEST {
        trial_suffix.push_str(&format!(":torch{torch}"));
    }
    if let Some(n) = request.run.gt_segments {
        trial_suffix.push_str(&format!(":segments{n}"));
    }
    // MMSeg's own step is another answer than segtune's rebuild.
    let python = request.run.python.as_ref().map_or(String::new(), |p| {
        format!(":python={}", p.python().display())
    });
    let predicted_device = format!(
        "predicted:{}:{}:{:.3}:{}{trial_suffix}{python}",
        budget.gpu, budget.vram_bytes, budget.margin, request.run.trace
    );
    (predicted_device, trial_suffix)
}

impl TrainingPlan {
    fn of(prepared: &Prepared, request: &SearchRequest, real: &dyn RealTrials) -> Result<Self> {
        let (cfg, spec) = (&prepared.cfg, &prepared.spec);
        let file_name = request
            .config
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        let gpus = spec.gpus.unwrap_or(1);
        if gpus < 1 {
            return Err(Error::Input(format!("gpus = {gpus}: give 1 or more")));
        }
        let recipe =
            Recipe::of(cfg, file_name, gpus, spec.effective_batch).map_err(Error::Input)?;
        let budget = budget_of(spec)?;
        let mut precisions = precisions_on(&budget, request.precisions.as_deref())?;
        let (torch, torch_source) = request.torch(spec);
        if request.run.python.is_some() {
            precisions = python_worker_limits(&recipe, &precisions, gpus, torch, spec)?;
        }
        let placement = &request.run.placement;
        // Asked only when a CUDA device may be used: on Slurm the count is
        // a job of its own.
        let cpu_only = spec.device_setting()? == DeviceSetting::Cpu
            || placement.devices.as_ref().is_some_and(|d| d.cpu_only());
        // MMSeg's own step is traced on the CPU and predicted, never measured.
        let cpu_only = cpu_only || request.run.python.is_some();
        let visible = if cpu_only { 0 } else { real.devices() };
        placement.check(visible)?;
        let slots = placement.slots(visible);
        let (cuda, measure_on) = measuring_devices(placement, spec, visible, slots, torch)?;
        let (predicted_device, trial_suffix) = journal_devices(&budget, request, gpus, torch);
        let effective = recipe.effective_batch;
        let objective = spec.objective.unwrap_or_default();
        // Half precision for speed only where the user allows it; whether
        // it is faster on this card is the step-time model's to say (a
        // card without tensor cores gains nothing, and pays the casts).
        // Else the recipe's precision wherever it fits.
        let amp_for_speed = request.precisions.is_some() || objective == Objective::Throughput;
        let ranking = Ranking {
            objective,
            keep_precision: (!amp_for_speed).then_some(recipe.amp),
            effective_batch: Some((effective, gpus)),
        };
        Ok(TrainingPlan {
            batches: space::batch_sizes(&recipe, gpus),
            crops: space::crops(recipe.crop),
            accumulation: Box::new(move |b| match space::accumulation_for(b, gpus, effective) {
                Some(a) => (a, true),
                None => (1, false),
            }),
            fallbacks: knobs::fallback_passes(
                space::ModelKnobs::default(),
                knobs::FallbackOptions {
                    checkpoint: space::checkpoint_available(cfg),
                    num_points: &space::num_points_options(cfg, recipe.crop),
                },
            ),
            recipe,
            budget,
            objective,
            ranking,
            schedule: spec.schedule.unwrap_or_default(),
            setup: TrainingSetup::new(gpus, torch),
            torch_source: match &request.run.python {
                Some(p) => format!(
                    "{torch_source}; each step MMSeg's own, traced by the Python worker in {}",
                    p.python().display()
                ),
                None => torch_source.to_string(),
            },
            precisions,
            cuda,
            measure_on,
            slots,
            predicted_device,
            trial_suffix,
        })
    }

    fn space(&self) -> SearchSpace<'_> {
        SearchSpace {
            crops: &self.crops,
            precisions: &self.precisions,
            batches: &self.batches,
            accumulation: &*self.accumulation,
            fallbacks: &self.fallbacks,
            knobs: space::ModelKnobs::default(),
        }
    }
}

/// Runs the strategy: predictions first, then on a CUDA device real trials
/// confirming them from the top down (or, for benchmarks, every candidate
/// measured). Each list of evaluators runs its candidates at once.
fn explore(
    plan: &TrainingPlan,
    space: &SearchSpace,
    request: &SearchRequest,
    real: &dyn RealTrials,
    predictors: &mut [Box<dyn Evaluator>],
    journal: &mut Journal,
    progress: Progress,
) -> Result<Explored> {
    let gpus = plan.setup.gpus;
    let mut measurers: Vec<Box<dyn Evaluator>> = plan
        .measure_on
        .iter()
        .map(|i| real.evaluator(*i, &plan.budget, gpus))
        .collect();
    let cuda_device = |i: usize| format!("cuda:{i}{}", plan.trial_suffix);
    match plan.cuda {
        // Benchmarks measure every candidate of the grid.
        Some(i) if request.exhaustive => {
            journal.set_device(&cuda_device(i));
            let mut on = slots(&mut measurers);
            run_search_on(space, plan.objective, true, &mut on, journal, progress)
        }
        cuda => {
            journal.set_device(&plan.predicted_device);
            let explored = {
                let mut on = slots(predictors);
                run_search_on(
                    space,
                    plan.objective,
                    request.exhaustive,
                    &mut on,
                    journal,
                    progress,
                )?
            };
            let (Some(i), Some(predictor)) = (cuda, predictors.first_mut()) else {
                return Ok(explored);
            };
            if measurers.is_empty() {
                return Ok(explored);
            }
            journal.set_device(&cuda_device(i));
            let mut cx = Confirmation {
                ranking: plan.ranking,
                space,
                predictor: predictor.as_mut(),
                measurers: slots(&mut measurers),
                journal,
                predicted_device: &plan.predicted_device,
                progress,
            };
            confirm_predictions(explored, &mut cx)
        }
    }
}

/// What a search explored, in which mode, and how many traces it took.
pub(super) struct Found {
    pub(super) explored: Explored,
    pub(super) mode: Mode,
    pub(super) traces_run: usize,
}

/// The parts of a result each kind of search decides itself.
pub(super) struct ResultHead {
    pub(super) run_mode: RunMode,
    pub(super) budget: Budget,
    pub(super) gpus: i64,
    /// The release predicted for and where that choice came from.
    pub(super) torch: (TorchVersion, String),
    pub(super) recipe: Recipe,
    pub(super) objective: super::spec::Objective,
    pub(super) ranking: Ranking,
    pub(super) grid_size: usize,
}

/// The result of a search, training or inference alike: refused when no
/// candidate got a verdict; the feasible candidates ranked, measured ones
/// first (unconfirmed predictions rank below every measured candidate);
/// the winner the best of those in the search's own mode. Nothing emitted
/// yet.
pub(super) fn assemble(
    request: &SearchRequest,
    head: ResultHead,
    found: Found,
    journal: &Journal,
) -> Result<SearchResult> {
    some_verdict(&found.explored.outcomes)?;
    some_memory_verdict(&request.config, &found.explored.outcomes)?;
    let (feasible, infeasible): (Vec<Outcome>, Vec<Outcome>) = found
        .explored
        .outcomes
        .into_iter()
        .partition(|o| o.record.fits());
    let (measured, predicted): (Vec<Outcome>, Vec<Outcome>) = feasible
        .into_iter()
        .partition(|o| o.record.mode == found.mode);
    let mut feasible = rank(measured, head.ranking);
    let winner = feasible.first().cloned();
    feasible.extend(rank(predicted, head.ranking));
    Ok(SearchResult {
        config: request.config.display().to_string(),
        run_mode: head.run_mode,
        budget: head.budget,
        gpus: head.gpus,
        torch: head.torch.0,
        torch_source: head.torch.1,
        recipe: head.recipe,
        objective: head.objective,
        mode: found.mode,
        feasible,
        infeasible,
        grid_size: head.grid_size,
        trials_run: found.explored.ran,
        trials_resumed: found.explored.resumed,
        traces_run: found.traces_run,
        predictions_confirmed_from: found.explored.predictions,
        winner,
        emitted: Vec::new(),
        cfg_options: None,
        auto_scale_lr: false,
        changes: Vec::new(),
        schedule: None,
        training_time: None,
        recipe_outcome: None,
        journal: journal.path().display().to_string(),
        journal_skipped_lines: journal.skipped_lines(),
        journal_not_reused: journal.not_reused(),
        stale_report: saved::stale_report(&request.out),
    })
}

/// The CUDA device the settings choose among `visible` ones (`None`:
/// predict on the CPU).
/// A real trial runs the libtorch segtune links: another release is
/// predicted only.
pub(super) fn cuda_device(
    spec: &SearchSpec,
    visible: usize,
    torch: TorchVersion,
) -> Result<Option<usize>> {
    let other_torch = torch != TorchVersion::NEWEST;
    let setting = spec.device_setting()?;
    // libtorch sees no device where the driver is too old for its CUDA:
    // that is said, not taken for a machine without a GPU.
    if visible == 0 && !other_torch && setting != DeviceSetting::Cpu {
        crate::worker::machine::check_cuda_trial()?;
    }
    Ok(match setting {
        DeviceSetting::Cpu => None,
        DeviceSetting::Auto if other_torch => None,
        DeviceSetting::Cuda(i) if other_torch => {
            return Err(Error::Input(format!(
                "--device cuda:{i} measures with the PyTorch segtune links ({}), not {torch}; predict for {torch} with --device cpu, or measure with --torch {}",
                TorchVersion::NEWEST,
                TorchVersion::NEWEST
            )))
        }
        DeviceSetting::Auto => (visible > 0).then_some(0),
        DeviceSetting::Cuda(i) if visible > i => Some(i),
        DeviceSetting::Cuda(i) => {
            return Err(Error::Input(format!(
                "--device cuda:{i}, but no such CUDA device is visible"
            )))
        }
    })
}

/// The GPU budget the settings name (a preset or a VRAM size).
pub(super) fn budget_of(spec: &SearchSpec) -> Result<Budget> {
    let gpu = Gpu::choose(&spec.gpu)?;
    Budget::new(&gpu, spec.margin.unwrap_or(0.05))
}

/// Confirms the predicted search's feasible candidates with real trials
/// (best first); when none measures feasible, the real trials search the
/// space themselves (binary search, as without predictions).
fn confirm_predictions(predicted: Explored, cx: &mut Confirmation) -> Result<Explored> {
    let (fits, misses): (Vec<Outcome>, Vec<Outcome>) = predicted
        .outcomes
        .into_iter()
        .partition(|o| o.record.fits());
    let predictions = fits.len() + misses.len();
    let confirmed = confirm(fits, cx)?;
    let (mut ran, mut resumed) = (confirmed.ran, confirmed.resumed);
    let mut outcomes = confirmed.measured;
    if !outcomes.iter().any(|o| o.record.fits()) {
        let searched = run_search_on(
            cx.space,
            cx.ranking.objective,
            false,
            &mut cx.measurers,
            cx.journal,
            cx.progress,
        )?;
        ran += searched.ran;
        resumed += searched.resumed;
        for o in searched.outcomes {
            if outcomes
                .iter()
                .any(|m| m.candidate.key() == o.candidate.key())
            {
                // Measured by the confirmation a moment ago, not resumed.
                resumed -= usize::from(!o.ran_now);
            } else {
                outcomes.push(o);
            }
        }
    }
    outcomes.extend(confirmed.unconfirmed);
    outcomes.extend(misses);
    Ok(Explored::new(outcomes, ran, resumed, predictions))
}
