//! Public MMSeg 1.x training logs against the predicted range on their own
//! card. `tests/fixtures/mmseg_logs.tsv` holds one row per run found on
//! GitHub (commit-pinned URL; the config, batch, crop, torch, GPU, fp16,
//! and the steady-state `memory:` of the log's lines after the first, in
//! MiB: MMEngine's `get_max_cuda_memory` resets the peak at each line, so
//! those lines hold the step without cuDNN's first benchmark search). Each
//! row is predicted with `segtune estimate` for that run's setup; the logged
//! figure must lie inside the predicted range widened by 5% for at least
//! 90% of the runs (benchmark winners vary between runs of one config; the
//! runs outside are printed, and `docs/prediction.md` says why), and the
//! range's high end may be at most 35% above its low end.

mod common;

use std::collections::HashMap;
use std::process::Command;

/// One run of the fixture.
struct LoggedRun {
    url: String,
    config: String,
    cfg_options: Vec<String>,
    batch: String,
    crop: String,
    vram: String,
    compute_capability: String,
    torch: String,
    gpus: String,
    amp: String,
    steady_mib: f64,
    first_mib: f64,
    family: String,
    gpu: String,
}

fn runs() -> Vec<LoggedRun> {
    let table = common::Fixture::read("mmseg_logs.tsv");
    let col = |name: &str| table.col(name);
    let (use_, gpu) = (col("use"), col("gpu"));
    let (url, config, options, batch, crop, vram, cc, torch, gpus, amp, steady, first, family) = (
        col("url"),
        col("config"),
        col("cfg_options"),
        col("batch"),
        col("crop"),
        col("vram"),
        col("compute_capability"),
        col("torch"),
        col("gpus"),
        col("amp"),
        col("steady_median_mib"),
        col("first_mib"),
        col("family"),
    );
    table
        .rows()
        // Models segtune does not build yet are listed, not predicted.
        .filter(|c| c[use_] != "not built")
        .map(|c| LoggedRun {
            url: c[url].into(),
            config: c[config].into(),
            cfg_options: c[options].split_whitespace().map(str::to_string).collect(),
            batch: c[batch].into(),
            crop: c[crop].into(),
            vram: c[vram].into(),
            compute_capability: c[cc].into(),
            torch: c[torch].into(),
            gpus: c[gpus].into(),
            amp: c[amp].into(),
            steady_mib: c[steady].parse().unwrap(),
            first_mib: c[first].parse().unwrap_or(0.0),
            family: c[family].into(),
            gpu: c[gpu].into(),
        })
        .collect()
}

/// (least, low, likely, high, first interval) in MiB.
type Figures = (f64, f64, f64, f64, f64);

fn predict(shared: &std::path::Path, run: &LoggedRun) -> Figures {
    let config = common::configs_under(&shared.join("mmseg-configs/configs"))
        .into_iter()
        .find(|p| p.file_stem().is_some_and(|s| s == run.config.as_str()))
        .unwrap_or_else(|| panic!("config {}", run.config));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_segtune"));
    cmd.arg("estimate").arg(&config).args([
        "--json",
        "--batch-size",
        &run.batch,
        "--crop",
        &run.crop,
        "--vram",
        &run.vram,
        "--compute-capability",
        &run.compute_capability,
        "--torch",
        &run.torch,
        "--gpus",
        &run.gpus,
        "--amp",
        &run.amp,
    ]);
    if !run.cfg_options.is_empty() {
        cmd.arg("--cfg-options").args(&run.cfg_options);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        run.url,
        String::from_utf8_lossy(&out.stderr)
    );
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mib = |k: &str| e[k].as_f64().unwrap_or_else(|| panic!("{k}")) / (1u64 << 20) as f64;
    (
        mib("predicted_min_peak_allocated_bytes"),
        mib("predicted_peak_allocated_low_bytes"),
        mib("predicted_peak_allocated_bytes"),
        mib("predicted_peak_allocated_high_bytes"),
        mib("predicted_first_interval_peak_allocated_bytes"),
    )
}

#[test]
fn public_mmseg_logs_fall_inside_the_predicted_range_on_their_card() {
    let Some(shared) = common::require_shared("logs_calibration") else {
        return;
    };
    let runs = runs();
    assert!(runs.len() >= 10, "at least 10 runs");
    let families: std::collections::HashSet<&str> =
        runs.iter().map(|r| r.family.as_str()).collect();
    assert!(families.len() >= 3, "at least 3 families: {families:?}");
    // Runs of one setup on one card share a prediction.
    let mut cache: HashMap<String, Figures> = HashMap::new();
    let mut inside = 0usize;
    let mut outside = Vec::new();
    for run in &runs {
        let key = format!(
            "{} {:?} {} {} {} {} {} {} {}",
            run.config,
            run.cfg_options,
            run.batch,
            run.crop,
            run.vram,
            run.compute_capability,
            run.torch,
            run.gpus,
            run.amp
        );
        let (least, low, likely, high, first) =
            *cache.entry(key).or_insert_with(|| predict(&shared, run));
        assert!(
            high <= 1.35 * low,
            "{}: the range {low:.0}..{high:.0} MiB is wider than 35%",
            run.url
        );
        let ok = (0.95 * low..=1.05 * high).contains(&run.steady_mib);
        eprintln!(
            "{} {} b{} {} {} ({}) t{}: logged {:.0} MiB, predicted {likely:.0} ({low:.0}..{high:.0}; least {least:.0}); first line logged {:.0}, predicted {first:.0}: {}",
            run.family,
            run.config,
            run.batch,
            run.crop,
            run.gpu,
            run.vram,
            run.torch,
            run.steady_mib,
            run.first_mib,
            if ok { "inside" } else { "OUTSIDE" }
        );
        if ok {
            inside += 1;
        } else {
            outside.push(format!("{} ({:.0} MiB)", run.url, run.steady_mib));
        }
    }
    eprintln!(
        "{inside} of {} logged figures inside the predicted range (widened by 5%); outside: {outside:#?}",
        runs.len()
    );
    assert!(
        inside as f64 >= 0.9 * runs.len() as f64,
        "{inside} of {} inside",
        runs.len()
    );
}
