//! Predicting MMSeg's published model-zoo memory: the stack those figures
//! were measured on (PyTorch <= 1.10 + mmcv 1.x, DDP over 8 GPUs) is
//! reproduced in the CPU trace, and the prediction lands within 5% of the
//! published figure. `scripts/calibrate-estimate` prints every SegFormer row.

mod common;

use segtune::trial::memory::{hold_until_freed, CpuCounter};
use tch::{Device, Kind, Tensor};

#[test]
fn a_held_tensor_lives_until_the_watched_one_is_freed() {
    let counter = CpuCounter::install();
    let before = counter.current();
    let input = Tensor::zeros([1024], (Kind::Float, Device::Cpu));
    let output = input.softmax(-1, None::<Kind>);
    hold_until_freed(&input, &output).unwrap();
    drop(input);
    assert_eq!(
        counter.current() - before,
        2 * 4096,
        "the input is still held"
    );
    drop(output);
    assert_eq!(counter.current() - before, 0, "both go with the output");
}

/// `(published GiB, gpus, config path)` of a row of the calibration table.
fn zoo_row(shared: &std::path::Path, row: &str) -> (f64, String, std::path::PathBuf) {
    let csv = std::fs::read_to_string(shared.join("calibration/mmseg_zoo_memory.csv")).unwrap();
    let line = csv
        .lines()
        .find(|l| l.starts_with(&format!("{row},")))
        .expect("the row is in the table");
    let cols: Vec<&str> = line.split(',').collect();
    let config = common::configs_under(&shared.join("mmseg-configs/configs"))
        .into_iter()
        .find(|p| p.file_stem().is_some_and(|s| s == cols[10]))
        .expect("the row's config exists");
    (cols[9].parse().unwrap(), cols[7].to_string(), config)
}

use common::estimate_json;

fn predicted_allocated(config: &std::path::Path, extra: &[&str]) -> f64 {
    let mut args = vec!["--vram", "80G", "--compute-capability", "7.0"];
    args.extend_from_slice(extra);
    estimate_json(config, &args)["predicted_peak_allocated_bytes"]
        .as_f64()
        .unwrap()
}

/// Predicts row `row` of the calibration table for its own setup (the 2021
/// stack, its GPUs), prints it and asserts it within 5%; returns the
/// prediction and the config.
fn within_5_percent_of_row(
    shared: &std::path::Path,
    row: &str,
    label: &str,
) -> (f64, std::path::PathBuf) {
    let (published_gib, gpus, config) = zoo_row(shared, row);
    let published = published_gib * (1u64 << 30) as f64;
    let zoo = predicted_allocated(&config, &["--torch", "1.10", "--gpus", &gpus]);
    let error = (zoo - published) / published;
    eprintln!(
        "{label}: published {published_gib} GiB, predicted {:.3} GiB ({:+.1}%)",
        zoo / (1u64 << 30) as f64,
        100.0 * error
    );
    assert!(
        error.abs() < 0.05,
        "predicted {zoo} vs published {published}"
    );
    (zoo, config)
}

#[test]
fn segformer_b0_ade20k_within_5_percent_of_the_published_figure() {
    let Some(shared) = common::require_shared("segformer_b0_zoo_calibration") else {
        return;
    };
    let (zoo, config) = within_5_percent_of_row(&shared, "1", "B0 ADE20K 512x512 b2");
    // Today's stack on one GPU needs less: softmax inputs are not kept, nor DDP buckets.
    let today = predicted_allocated(&config, &["--torch", "2.11"]);
    assert!(today < 0.9 * zoo, "today {today} vs zoo stack {zoo}");
}

/// A meta trace counts op outputs only, never what CPU kernels allocate per
/// thread: the estimate pinned to one thread equals the one on every core,
/// figure for figure.
#[test]
fn a_prediction_does_not_depend_on_the_hosts_thread_count() {
    let Some(shared) =
        common::require_shared("a_prediction_does_not_depend_on_the_hosts_thread_count")
    else {
        return;
    };
    let config =
        shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py");
    let run = |threads: &str| {
        let mut report = estimate_json(
            &config,
            &[
                "--vram",
                "8G",
                "--batch-size",
                "2",
                "--crop",
                "256x256",
                "--threads",
                threads,
            ],
        );
        report
            .as_object_mut()
            .unwrap()
            .remove("cpu_trace_peak_bytes");
        report
    };
    let all = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2);
    let (one, every) = (run("1"), run(&all.to_string()));
    assert_eq!(one, every, "1 thread vs {all}");
    eprintln!(
        "1 and {all} threads: predicted {} bytes both",
        one["predicted_peak_allocated_bytes"]
    );
}

/// A CNN row, predicted from a meta trace in seconds (the CPU trace of the
/// same step took about a minute): DeepLabV3+ R-50 on Cityscapes.
#[test]
fn deeplabv3plus_r50_cityscapes_within_5_percent_of_the_published_figure() {
    let Some(shared) = common::require_shared("deeplabv3plus_zoo_calibration") else {
        return;
    };
    within_5_percent_of_row(&shared, "15", "DeepLabV3+ R-50 Cityscapes 512x1024 b2");
}

/// The CNN rows the tensors alone under-predicted (PSPNet R-50 -10.7%,
/// R-101 -7.1% before the kernel model): with cuDNN's workspaces on the
/// zoo's V100 (32 GB, sm 7.0, `cudnn.benchmark=False`, 4-GPU DDP, the 2021
/// stack) the all-time peak mmcv 1.x logged (never reset: the first
/// interval's figure) is within 5%. `scripts/calibrate-metafile` runs every
/// metafile row the same way.
#[test]
fn pspnet_cityscapes_rows_within_5_percent_with_cudnns_workspaces() {
    let Some(shared) = common::require_shared("pspnet_cityscapes_zoo_calibration") else {
        return;
    };
    for row in ["30", "31"] {
        let (published_gib, gpus, config) = zoo_row(&shared, row);
        let e = estimate_json(
            &config,
            &[
                "--vram",
                "32G",
                "--compute-capability",
                "7.0",
                "--torch",
                "1.10",
                "--cudnn-benchmark",
                "off",
                "--gpus",
                &gpus,
            ],
        );
        let predicted = e["predicted_first_interval_peak_allocated_bytes"]
            .as_f64()
            .unwrap();
        let published = published_gib * (1u64 << 30) as f64;
        let error = (predicted - published) / published;
        eprintln!(
            "row {row}: published {published_gib} GiB, predicted {:.3} GiB ({:+.1}%)",
            predicted / (1u64 << 30) as f64,
            100.0 * error
        );
        assert!(error.abs() < 0.05, "row {row}: {predicted} vs {published}");
    }
}

/// A family whose zoo run held more than segtune finds (ERFNet:
/// `segtune::predict::unexplained`) has its range widened to cover it and
/// says so; the likeliest figure stays the trace's.
#[test]
fn erfnets_range_covers_its_zoo_run_and_says_why() {
    let Some(shared) = common::require_shared("erfnets_range_covers_its_zoo_run") else {
        return;
    };
    let config =
        shared.join("mmseg-configs/configs/erfnet/erfnet_fcn_4xb4-160k_cityscapes-512x1024.py");
    let args = [
        "--vram",
        "8G",
        "--batch-size",
        "1",
        "--crop",
        "128x256",
        "--torch",
        "1.9",
    ];
    let e = common::estimate_json(&config, &args);
    let bytes = |key: &str| e[key].as_u64().unwrap() as f64;
    let likely = bytes("predicted_peak_allocated_bytes");
    let high = bytes("predicted_peak_allocated_high_bytes");
    assert!(high >= likely * 1.42, "high {high} vs likely {likely}");
    let notes = e["notes"].to_string();
    assert!(
        notes.contains("ERFNet: a published run held 42% more"),
        "{notes}"
    );
    // A family without such a row keeps its range.
    let fcn = shared.join("mmseg-configs/configs/fcn/fcn_r18-d8_4xb2-80k_cityscapes-512x1024.py");
    let e = common::estimate_json(&fcn, &args);
    assert!(!e["notes"].to_string().contains("published run held"));
}
