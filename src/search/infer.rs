//! `segtune search --mode infer`: the fastest inference settings that fit
//! the GPU for the config's test images: test batch x `model.test_cfg`
//! mode (the config's, and the other: whole, or slide with the training
//! crop and a stride of two thirds of it) x precision (fp32, or fp16 as
//! MMEngine's `TestLoop(fp16=True)` runs it), each a real inference trial
//! on a CUDA device (`trial --mode infer`) or else predicted from a traced
//! test step, ranked by images/s. The winner is
//! emitted as `test_dataloader.batch_size`, `model.test_cfg` and `test_cfg`
//! overrides, with the `--cfg-options` line for `tools/test.py`.

use super::evaluate::Evaluator;
use super::journal::Journal;
use super::record::SearchResult;
use super::run::{
    assemble, budget_of, cuda_device, journal_inputs, predictor, prepare, CudaTrials, Found,
    RealTrials, ResultHead, SearchRequest,
};
use super::space::{Amp, ModelKnobs, Recipe, TestMode};
use super::spec::Objective;
use super::strategy::{run_search, Explored, Progress, SearchSpace};
use super::{emit, saved};
use crate::config::{Dict, Value};
use crate::error::{Error, Result};
use crate::kinds::{RunMode, TorchVersion, TrainingSetup};
use crate::predict::estimate::BatchLayout;
use crate::worker::Worker;

/// Test batch sizes tried (per GPU).
const TEST_BATCHES: [i64; 6] = [1, 2, 4, 8, 16, 32];

/// The image size at test time: the test pipeline's `Resize` scale (MMCV
/// writes it `(w, h)`), else the training crop.
pub fn test_image_size(cfg: &Dict, crop: (i64, i64)) -> (i64, i64) {
    let pipeline = cfg.get("test_pipeline").or_else(|| {
        cfg.get("test_dataloader")
            .and_then(|d| d.get_path("dataset.pipeline"))
    });
    pipeline
        .and_then(Value::as_seq)
        .into_iter()
        .flatten()
        .filter(|s| s.get_path("type").and_then(Value::as_str) == Some("Resize"))
        .find_map(|s| match s.get_path("scale").and_then(Value::as_seq) {
            Some([w, h]) => h.as_i64().zip(w.as_i64()),
            _ => None,
        })
        .unwrap_or(crop)
}

/// The test modes to compare: the config's, and the other one.
fn test_modes(model: &Dict, crop: (i64, i64)) -> Result<Vec<TestMode>> {
    let own = TestMode::from_model(model).map_err(|e| Error::Input(e.to_string()))?;
    let other = match own {
        TestMode::Slide { .. } => TestMode::Whole,
        TestMode::Whole => TestMode::Slide {
            crop,
            stride: (crop.0 * 2 / 3, crop.1 * 2 / 3),
        },
    };
    Ok(vec![own, other])
}

/// Searches inference settings: measured on a CUDA device, else predicted.
pub fn search_inference(
    request: &SearchRequest,
    worker: &Worker,
    progress: Progress,
) -> Result<SearchResult> {
    // An inference winner is always written as an MMSeg config.
    let prepared = prepare(
        request,
        worker,
        Some(BatchLayout::MmSeg),
        emit::INFER_SUFFIX,
    )?;
    let cfg = &prepared.cfg;
    let model = cfg.get("model").and_then(Value::as_dict).expect("checked");
    crate::models::segmentors::inference::check_inference(model).map_err(|source| {
        Error::Model {
            source,
            config: request.config.clone(),
        }
    })?;
    let crop = crate::predict::estimate::recipe_crop(cfg).ok_or_else(|| {
        Error::Input(
            "the config has no crop size (crop_size, RandomCrop or data_preprocessor.size)".into(),
        )
    })?;
    let image = test_image_size(cfg, crop);
    let test_batch = cfg
        .get("test_dataloader")
        .and_then(|d| d.get_path("batch_size"))
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let spec = &prepared.spec;
    let budget = budget_of(spec)?;
    let gpus = spec.gpus.unwrap_or(1);
    let precisions = super::space::precisions(request.precisions.as_deref(), &INFERENCE_PRECISIONS)
        .map_err(|e| Error::Input(format!("{e} (inference is searched in fp32 and fp16)")))?;
    // On a CUDA device each setting is a real inference trial; else predicted.
    let real = CudaTrials { request, worker };
    let (torch, torch_source) = request.torch(spec);
    let setup = TrainingSetup::new(gpus, torch);
    let cuda = cuda_device(spec, real.devices(), torch)?;
    let (mut evaluator, device) = match cuda {
        Some(i) => (real.evaluator(i, &budget, gpus), format!("cuda:{i}:infer")),
        None => (
            predictor(request, worker, &budget, setup, prepared.layout, 1),
            format!(
                "predicted-infer:{}:{}:{:.3}:{}{}",
                budget.gpu,
                budget.vram_bytes,
                budget.margin,
                request.run.trace,
                if torch == TorchVersion::NEWEST {
                    String::new()
                } else {
                    format!(":torch{torch}")
                }
            ),
        ),
    };
    let inputs = journal_inputs(request, &prepared, &budget, setup, worker);
    let mut journal = Journal::open(&request.out, inputs, &device)?;
    let explored = explore_test_modes(
        test_modes(model, crop)?,
        (image, &precisions),
        request,
        evaluator.as_mut(),
        &mut journal,
        progress,
    )?;
    let found = Found {
        explored,
        mode: evaluator.mode(),
        traces_run: evaluator.traces_run(),
    };
    let head = ResultHead {
        run_mode: RunMode::Infer,
        budget,
        gpus,
        torch: (torch, torch_source.to_string()),
        recipe: Recipe {
            batch_size: test_batch,
            crop: image,
            effective_batch: test_batch,
            effective_batch_source:
                "test_dataloader.batch_size; the image size from the test pipeline's Resize".into(),
            accumulation: 1,
            amp: Amp::Off,
            name_note: None,
        },
        objective: Objective::Throughput,
        ranking: Objective::Throughput.into(),
        grid_size: TEST_BATCHES.len() * precisions.len() * 2,
    };
    let mut result = assemble(request, head, found, &journal)?;
    emit_inference_winner(request, &mut result)?;
    saved::save_result(request, &result, prepared.config_hash, journal.inputs())?;
    Ok(result)
}

/// The precisions an inference search tries.
const INFERENCE_PRECISIONS: [Amp; 2] = [Amp::Off, Amp::Fp16];

/// Test batch x precision for each test mode, at the test image size.
fn explore_test_modes(
    modes: Vec<TestMode>,
    (image, precisions): ((i64, i64), &[Amp]),
    request: &SearchRequest,
    evaluator: &mut dyn Evaluator,
    journal: &mut Journal,
    progress: Progress,
) -> Result<Explored> {
    let (mut outcomes, mut ran, mut resumed) = (Vec::new(), 0, 0);
    for mode in modes {
        let space = SearchSpace {
            crops: &[image],
            precisions,
            batches: &TEST_BATCHES,
            accumulation: &|_| (1, true),
            fallbacks: &[],
            knobs: ModelKnobs {
                test_mode: Some(mode),
                ..ModelKnobs::default()
            },
        };
        let explored = run_search(
            &space,
            Objective::Throughput,
            request.exhaustive,
            evaluator,
            journal,
            progress,
        )?;
        ran += explored.ran;
        resumed += explored.resumed;
        outcomes.extend(explored.outcomes);
    }
    Ok(Explored::new(outcomes, ran, resumed, 0))
}

/// Writes an inference winner as `test_dataloader`, `model.test_cfg` and
/// `test_cfg` overrides, with its `tools/test.py` line.
fn emit_inference_winner(request: &SearchRequest, result: &mut SearchResult) -> Result<()> {
    let Some(w) = result.winner.clone() else {
        return Ok(());
    };
    let c = w.candidate;
    let header = format!(
        "Generated by segtune search --mode infer for {}: test batch {}, {}x{} images, {} inference, amp {} ({}).",
        result.budget.card_and_margin(),
        c.batch_size,
        c.crop.0,
        c.crop.1,
        c.test_mode.unwrap_or(TestMode::Whole).label(),
        c.amp,
        w.record.mode.name(),
    );
    let written = emit::emit_inference(&request.config, &c, &request.out, &header)?;
    result.emitted = written.iter().map(|p| p.display().to_string()).collect();
    result.cfg_options = Some(emit::inference_cfg_options_line(&c));
    Ok(())
}
