//! Public MMSeg training logs against the predicted step time on their own
//! card. `tests/fixtures/mmseg_log_times.tsv` holds one row per run
//! (commit-pinned URL; the config, batch, crop, card, GPUs, PyTorch, AMP,
//! and the steady-state medians of the log's `time` and `data_time`):
//! the GPU's step is `time - data_time`. Setups are split by a hash of
//! (card, config, batch, crop, precision) into a fitting part (two thirds)
//! and a held-out part (one third, never fitted): the efficiencies of
//! `predict::speed::rules::Efficiencies::FITTED` come from the fitting part
//! (`scripts/speed-fit` runs [`fit_the_efficiencies`]), and the held-out
//! part's errors are what the acceptance is judged on.

mod common;

use segtune::kinds::{Amp, RunMode, TorchVersion, TrainingSetup};
use segtune::predict::speed::rules::Efficiencies;
use segtune::predict::speed::{Card, SpeedSetup, StepWork};
use segtune::predict::{step_work, EstimateRequest, Gpu, TraceKind};
use segtune::worker::Worker;
use std::collections::HashMap;

/// One run of the fixture.
#[derive(Debug, Clone)]
struct LoggedRun {
    url: String,
    family: String,
    config: String,
    cfg_options: Vec<String>,
    batch: i64,
    crop: (i64, i64),
    gpu: String,
    gpus: i64,
    torch: String,
    amp: String,
    /// Training iterations, or MMSeg's inference benchmark (batch 1).
    mode: RunMode,
    step_s: f64,
}

impl LoggedRun {
    /// Runs of one setup share a prediction and a side of the split.
    fn setup_key(&self) -> String {
        format!(
            "{}|{}|{:?}|{}|{:?}|{}|{}|{:?}",
            self.gpu,
            self.config,
            self.cfg_options,
            self.batch,
            self.crop,
            self.amp,
            self.gpus,
            self.mode
        )
    }

    /// Whether the run is held out of the fit: a third of the setups, by
    /// a hash of the setup (FNV-1a), so that the split is fixed and blind
    /// to the figures.
    fn held_out(&self) -> bool {
        let mut h: u64 = 0xcbf29ce484222325;
        for b in self.setup_key().bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
        h.is_multiple_of(3)
    }
}

fn runs() -> Vec<LoggedRun> {
    let table = common::Fixture::read("mmseg_log_times.tsv");
    let col = |name: &str| table.col(name);
    let (url, family, config, options, batch, crop) = (
        col("url"),
        col("family"),
        col("config"),
        col("cfg_options"),
        col("batch"),
        col("crop"),
    );
    let (gpu, gpus, torch, amp, step, use_) = (
        col("gpu"),
        col("gpus"),
        col("torch"),
        col("amp"),
        col("step_s"),
        col("use"),
    );
    table
        .rows()
        .filter(|c| matches!(c[use_], "yes" | "multi-gpu"))
        .filter_map(|c| {
            let (h, w) = c[crop].split_once('x')?;
            Some(LoggedRun {
                url: c[url].into(),
                family: c[family].into(),
                config: c[config].into(),
                cfg_options: c[options].split_whitespace().map(str::to_string).collect(),
                batch: c[batch].parse().ok()?,
                crop: (h.parse().ok()?, w.parse().ok()?),
                gpu: c[gpu].into(),
                gpus: c[gpus].parse().unwrap_or(1),
                torch: c[torch].into(),
                amp: c[amp].into(),
                mode: RunMode::Train,
                step_s: c[step].parse().ok()?,
            })
        })
        .collect()
}

/// MMSeg's published inference speeds on a V100 (`Inf time (fps)` of the
/// config READMEs: `tools/analysis_tools/benchmark.py`, batch 1, the
/// test pipeline's image size: the short side of its `Resize` scale, 4:3,
/// or Cityscapes' 1024x2048), each as a step of 1/fps seconds.
fn inference_runs(shared: &std::path::Path) -> Vec<LoggedRun> {
    let table = common::Fixture::read("mmseg_inf_fps.tsv");
    let col = |name: &str| table.col(name);
    let (config, family, fps, device, readme) = (
        col("config"),
        col("family"),
        col("inf_fps"),
        col("device"),
        col("readme"),
    );
    let configs = common::configs_under(&shared.join("mmseg-configs/configs"));
    table
        .rows()
        .filter(|c| c[device].contains("V100"))
        .filter_map(|c| {
            let fps: f64 = c[fps].parse().ok().filter(|f: &f64| *f > 0.0)?;
            let path = configs
                .iter()
                .find(|p| p.file_stem().is_some_and(|s| s == c[config]))?;
            Some(LoggedRun {
                url: format!("{} ({})", c[readme], c[config]),
                family: c[family].into(),
                config: c[config].into(),
                cfg_options: Vec::new(),
                batch: 1,
                crop: test_image_size(path),
                gpu: "Tesla V100-SXM2-16GB".into(),
                gpus: 1,
                torch: "1.13".into(),
                // An `-amp` config's row was measured in fp16.
                amp: if c[config].contains("-amp") {
                    "fp16"
                } else {
                    "off"
                }
                .into(),
                mode: RunMode::Infer,
                step_s: 1.0 / fps,
            })
        })
        .collect()
}

/// The image size of a config's test pipeline: Cityscapes' 1024x2048 for a
/// 2:1 `Resize` scale, else a 4:3 image with the scale's short side.
fn test_image_size(config: &std::path::Path) -> (i64, i64) {
    let cfg = segtune::config::resolve(config, &[]).unwrap();
    let scale = cfg
        .get("test_pipeline")
        .and_then(|p| match p {
            segtune::config::Value::List(steps) => steps
                .iter()
                .find(|s| {
                    s.get_path("type")
                        .and_then(segtune::config::Value::as_str)
                        .is_some_and(|t| t == "Resize")
                })
                .and_then(|s| s.get_path("scale"))
                .cloned(),
            _ => None,
        })
        .and_then(|v| match v {
            segtune::config::Value::List(xs) | segtune::config::Value::Tuple(xs) => {
                let n: Vec<i64> = xs.iter().filter_map(|x| x.as_i64()).collect();
                (n.len() == 2).then(|| (n[0].max(n[1]), n[0].min(n[1])))
            }
            _ => None,
        });
    match scale {
        Some((long, short)) if long == 2 * short => (short, long),
        Some((_, short)) => (short, (short * 4 + 2) / 3),
        None => (512, 683),
    }
}

/// A run's traced step and its card (`None`: a card or config segtune
/// does not know, said on stderr).
type Traced = Option<(StepWork, SpeedSetup, Card)>;

fn trace(shared: &std::path::Path, run: &LoggedRun) -> Traced {
    let Some(config) = common::configs_under(&shared.join("mmseg-configs/configs"))
        .into_iter()
        .find(|p| p.file_stem().is_some_and(|s| s == run.config.as_str()))
    else {
        eprintln!("no config {} ({})", run.config, run.url);
        return None;
    };
    let gpu = match Gpu::preset(&run.gpu) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("no card `{}` ({e}): {}", run.gpu, run.url);
            return None;
        }
    };
    let card = Card::of_gpu(&gpu);
    let amp = match run.amp.as_str() {
        "fp16" => Amp::Fp16,
        "bf16" => Amp::Bf16,
        _ => Amp::Off,
    };
    let request = EstimateRequest {
        config,
        cfg_options: run.cfg_options.clone(),
        gpu,
        batch_size: Some(run.batch),
        crop: Some(run.crop),
        amp: Some(amp),
        threads: None,
        gt_segments: None,
        setup: TrainingSetup {
            gpus: run.gpus,
            torch: run
                .torch
                .parse::<TorchVersion>()
                .unwrap_or(TorchVersion::NEWEST),
            ..TrainingSetup::default()
        },
        torch_source: String::new(),
        trace: TraceKind::Meta,
        alloc_conf: Default::default(),
        mode: run.mode,
        cudnn_benchmark: None,
        trace_timeout: None,
        python: None,
    };
    let worker = Worker::at(env!("CARGO_BIN_EXE_segtune-torch"));
    match step_work(&request, &worker) {
        Ok(Some((work, setup))) => Some((work, setup, card)),
        Ok(None) => {
            eprintln!("no op work in the trace of {}", run.url);
            None
        }
        Err(e) => {
            eprintln!("cannot trace {}: {e}", run.url);
            None
        }
    }
}

/// Every run with its trace (one trace per setup).
fn traced_runs(
    shared: &std::path::Path,
    runs: Vec<LoggedRun>,
) -> Vec<(LoggedRun, StepWork, SpeedSetup, Card)> {
    let mut cache: HashMap<String, Traced> = HashMap::new();
    let mut out = Vec::new();
    for run in runs {
        let key = run.setup_key();
        let traced = cache
            .entry(key)
            .or_insert_with(|| trace(shared, &run))
            .clone();
        if let Some((work, setup, card)) = traced {
            out.push((run, work, setup, card));
        }
    }
    out
}

/// The error of each run: predicted / logged - 1.
fn errors(
    runs: &[(LoggedRun, StepWork, SpeedSetup, Card)],
    e: &Efficiencies,
) -> Vec<(LoggedRun, f64, f64)> {
    runs.iter()
        .map(|(run, work, setup, card)| {
            let predicted = work.time_with(card, setup, e).step_s;
            (run.clone(), predicted, predicted / run.step_s - 1.0)
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Pairs of setups on one card whose logged times differ by 5% or more,
/// and how many the prediction orders the same way.
fn ordered_pairs(rows: &[(LoggedRun, f64, f64)]) -> (usize, usize) {
    let (mut pairs, mut right) = (0, 0);
    for (i, (a, pa, _)) in rows.iter().enumerate() {
        for (b, pb, _) in &rows[i + 1..] {
            if a.gpu != b.gpu || a.setup_key() == b.setup_key() {
                continue;
            }
            if (a.step_s / b.step_s - 1.0).abs() < 0.05 {
                continue;
            }
            pairs += 1;
            if (a.step_s < b.step_s) == (pa < pb) {
                right += 1;
            }
        }
    }
    (pairs, right)
}

/// The error table: every run, then per card and per family.
fn report(title: &str, rows: &[(LoggedRun, f64, f64)]) -> (f64, f64, (usize, usize)) {
    eprintln!("== {title}: {} runs", rows.len());
    for (run, predicted, err) in rows {
        eprintln!(
            "{:<14} {:<48} b{:<3} {:>9} {:<5} {:<32} logged {:>7.1} ms predicted {:>7.1} ms {:>+6.0}%",
            run.family,
            run.config,
            run.batch,
            format!("{}x{}", run.crop.0, run.crop.1),
            run.amp,
            run.gpu,
            run.step_s * 1e3,
            predicted * 1e3,
            err * 100.0
        );
    }
    for (what, key) in [
        (
            "card",
            (|r: &LoggedRun| r.gpu.clone()) as fn(&LoggedRun) -> String,
        ),
        ("family", |r: &LoggedRun| r.family.clone()),
    ] {
        let mut groups: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
        for (run, _, err) in rows {
            groups.entry(key(run)).or_default().push(err.abs());
        }
        for (name, errs) in groups {
            eprintln!(
                "  {what} {name:<34} {:>3} runs, median |error| {:>5.1}%",
                errs.len(),
                median(errs) * 100.0
            );
        }
    }
    let abs: Vec<f64> = rows.iter().map(|r| r.2.abs()).collect();
    let within = abs.iter().filter(|e| **e <= 0.30).count() as f64 / abs.len().max(1) as f64;
    let pairs = ordered_pairs(rows);
    let m = median(abs);
    eprintln!(
        "  median |error| {:.1}%, within 30%: {:.0}%, same-card pairs ordered right: {} of {}",
        m * 100.0,
        within * 100.0,
        pairs.1,
        pairs.0
    );
    (m, within, pairs)
}

/// The held-out logs, with the fitted efficiencies: median |error| at most
/// 15%, at least 80% within 30%, and the faster of two setups on one card
/// predicted faster in at least 90% of pairs.
#[test]
fn held_out_logs_match_the_predicted_step_time() {
    let Some(shared) = common::require_shared("speed_logs") else {
        return;
    };
    // The fitting part's table is scripts/speed-fit's (its traces are the
    // suite's time).
    let held_out = runs().into_iter().filter(LoggedRun::held_out).collect();
    let held = errors(&traced_runs(&shared, held_out), &Efficiencies::FITTED);
    let (median_error, within_30, (pairs, right)) = report("training logs, held-out part", &held);
    assert!(held.len() >= 8, "{} held-out runs", held.len());
    assert!(median_error <= 0.15, "median |error| {median_error:.3}");
    assert!(within_30 >= 0.8, "{within_30:.2} within 30%");
    assert!(
        right as f64 >= 0.9 * pairs as f64,
        "{right} of {pairs} pairs ordered right"
    );
}

/// MMSeg's published V100 inference speeds (`--mode infer`), the
/// held-out third: median |error| at most 20%.
#[test]
fn published_v100_inference_speeds_match_mode_infer() {
    let Some(shared) = common::require_shared("speed_logs") else {
        return;
    };
    let held_out = inference_runs(&shared)
        .into_iter()
        .filter(LoggedRun::held_out)
        .collect();
    let held = errors(&traced_runs(&shared, held_out), &Efficiencies::FITTED);
    let (median_error, _, _) = report("published V100 inference speeds, held-out part", &held);
    assert!(held.len() >= 10, "{} held-out rows", held.len());
    assert!(median_error <= 0.20, "median |error| {median_error:.3}");
}

/// Fits the efficiencies on the fitting part (Nelder-Mead on the squared
/// log errors) and prints them with both parts' tables:
/// `scripts/speed-fit`.
#[test]
#[ignore = "the fit of the speed model's efficiencies: scripts/speed-fit"]
fn fit_the_efficiencies() {
    let Some(shared) = common::require_shared("speed_logs") else {
        return;
    };
    let mut runs = runs();
    runs.extend(inference_runs(&shared));
    let traced = traced_runs(&shared, runs);
    let (fit, _): (Vec<_>, Vec<_>) = traced.iter().cloned().partition(|(r, ..)| !r.held_out());
    let start = Efficiencies::FITTED;
    // Each figure within what the hardware allows (log-space, clamped):
    // host time per op 2-60 us, a kernel's latency 2-15 us, efficiencies
    // 0.2-0.95, a backward convolution 1-2.5 times its forward, Winograd
    // 1-2.5 times faster, atomics 1-6 times slower, L2 1-4 times DRAM.
    const BOUNDS: [(f64, f64); 10] = [
        (2e-6, 60e-6),
        (2e-6, 60e-6),
        (2e-6, 15e-6),
        (0.2, 0.95),
        (0.2, 0.95),
        (0.2, 0.95),
        (1.0, 2.5),
        (1.0, 2.5),
        (1.0, 6.0),
        (1.0, 4.0),
    ];
    let to_params = |e: &Efficiencies| {
        vec![
            e.forward_dispatch_s.ln(),
            e.backward_dispatch_s.ln(),
            e.kernel_latency_s.ln(),
            e.tensor_core.ln(),
            e.cuda_core.ln(),
            e.bandwidth.ln(),
            e.conv_backward.ln(),
            e.winograd.ln(),
            e.atomic_slowdown.ln(),
            (e.l2 + 0.5).ln(),
        ]
    };
    let clamp = |p: &[f64]| -> Vec<f64> {
        p.iter()
            .zip(BOUNDS)
            .map(|(x, (lo, hi))| x.exp().clamp(lo, hi))
            .collect()
    };
    let of_params = |p: &[f64]| {
        let v = clamp(p);
        Efficiencies {
            forward_dispatch_s: v[0],
            backward_dispatch_s: v[1],
            kernel_latency_s: v[2],
            tensor_core: v[3],
            cuda_core: v[4],
            bandwidth: v[5],
            conv_backward: v[6],
            winograd: v[7],
            atomic_slowdown: v[8],
            l2: v[9],
            ..start
        }
    };
    let loss = |p: &[f64]| {
        let e = of_params(p);
        errors(&fit, &e)
            .iter()
            .map(|(_, _, err)| (1.0 + err).ln().abs())
            .sum::<f64>()
    };
    let best = nelder_mead(&to_params(&start), loss, 1500);
    let fitted = of_params(&best);
    eprintln!("fitted: {fitted:#?}");
    let all = errors(&traced, &fitted);
    for mode in [RunMode::Train, RunMode::Infer] {
        let of_mode: Vec<_> = all.iter().filter(|r| r.0.mode == mode).cloned().collect();
        let (fit_rows, held): (Vec<_>, Vec<_>) =
            of_mode.into_iter().partition(|(r, _, _)| !r.held_out());
        report(&format!("{mode:?}: fitting part (fitted)"), &fit_rows);
        report(&format!("{mode:?}: held-out part (fitted)"), &held);
    }
}

/// Minimises `f` from `start` (Nelder-Mead, the standard coefficients).
fn nelder_mead(start: &[f64], f: impl Fn(&[f64]) -> f64, iterations: usize) -> Vec<f64> {
    let n = start.len();
    let mut simplex: Vec<(Vec<f64>, f64)> = (0..=n)
        .map(|i| {
            let mut p = start.to_vec();
            if i > 0 {
                p[i - 1] += 0.3;
            }
            let v = f(&p);
            (p, v)
        })
        .collect();
    for _ in 0..iterations {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let centroid: Vec<f64> = (0..n)
            .map(|j| simplex[..n].iter().map(|(p, _)| p[j]).sum::<f64>() / n as f64)
            .collect();
        let worst = simplex[n].clone();
        let along = |t: f64| -> Vec<f64> {
            centroid
                .iter()
                .zip(&worst.0)
                .map(|(c, w)| c + t * (c - w))
                .collect()
        };
        let reflected = along(1.0);
        let fr = f(&reflected);
        if fr < simplex[0].1 {
            let expanded = along(2.0);
            let fe = f(&expanded);
            simplex[n] = if fe < fr {
                (expanded, fe)
            } else {
                (reflected, fr)
            };
        } else if fr < simplex[n - 1].1 {
            simplex[n] = (reflected, fr);
        } else {
            let contracted = along(-0.5);
            let fc = f(&contracted);
            if fc < worst.1 {
                simplex[n] = (contracted, fc);
            } else {
                let best = simplex[0].0.clone();
                for s in simplex.iter_mut().skip(1) {
                    s.0 =
                        s.0.iter()
                            .zip(&best)
                            .map(|(x, b)| b + 0.5 * (x - b))
                            .collect();
                    s.1 = f(&s.0);
                }
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    simplex.swap_remove(0).0
}
