//! segtune's CPU trials against the oracle measured from the real MMSeg
//! 1.2.2 models (`../shared/oracle/results.json`), one test per record so
//! that they run in parallel and a failure names its record:
//!
//! - `params::<config>`: parameter counts (total, trainable, by top-level
//!   module) equal the oracle's;
//! - `peak::<config>::b<batch>_<crop>_<precision>`: the steady training peak
//!   (`peak_steps2_3_bytes`, the counting allocator's high-water mark over
//!   steps 2-3) within 2% (the long records, 4x256 or over 2.5 s per MMSeg
//!   step, only in the full sweep, `scripts/oracle-sweep`, but a long
//!   config's smallest fp32 shape);
//! - `infeasible::<config>::b1_<crop>_<precision>`: where MMSeg raised
//!   "Expected more than 1 value per channel", segtune's trial is
//!   `infeasible` with the same message.
//!
//! The models the shared oracle lacks (one config per CNN head type, Swin-T
//! UPerNet) come from `tests/fixtures/oracle_cpu_cnn_extra.json` and
//! `oracle_cpu_swin_extra.json`, gradient checkpointing (Swin-T UPerNet
//! with `with_cp=True`, a shared config with `cfg_options`) from
//! `oracle_cpu_with_cp.json`, and Mask2Former's knobs (`num_points=3136`,
//! `with_cp=True`) from `oracle_cpu_mask2former_knobs.json`, measured with
//! the same script.
//!
//! Every config whose model segtune supports is compared; the others are
//! listed as ignored, with the reason. `coverage` fails when no record was
//! compared. Each trial runs in its own `segtune-torch` process, as the
//! oracle ran each config in a fresh worker (the allocator count is
//! process-wide). A harness of its own (libtest-mimic): the records are
//! data, not code.

mod common;

use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Peaks further than this from the oracle fail.
const TOLERANCE_PERCENT: f64 = 2.0;

/// Records above this many pixels per step (batch x crop^2: the 2x256 and
/// 4x256 ones) or whose MMSeg step took longer than [`LONG_RECORD_SECONDS`] at one
/// thread are compared only by the full sweep (`scripts/oracle-sweep`,
/// `SEGTUNE_ORACLE_ALL=1`), to keep the suite within CI's time, except
/// each config's smallest record per precision, which always stays.
const LONG_RECORD_PIXELS: i64 = 256 * 256;
const LONG_RECORD_SECONDS: f64 = 1.5;

fn is_long(batch: i64, crop: i64, oracle_seconds: f64) -> bool {
    batch * crop * crop > LONG_RECORD_PIXELS || oracle_seconds > LONG_RECORD_SECONDS
}

fn sweep_all() -> bool {
    std::env::var("SEGTUNE_ORACLE_ALL").is_ok_and(|v| v == "1")
}

/// The CPU's class for oneDNN: it takes a different path (and allocates
/// differently) on AMX, on AVX-512 with bf16 instructions, on AVX-512
/// without them, and on AVX2 alone.
///
/// `ONEDNN_MAX_CPU_ISA` (oneDNN's own cap, inherited by the trials; set
/// `ATEN_CPU_CAPABILITY` to match) makes this CPU behave as a lower class:
/// `AVX2`, `AVX512_CORE` or `AVX512_CORE_BF16` test that class's fixture
/// here (an AVX2 cap reproduces the AMD EPYC figures to the byte).
fn cpu_class() -> &'static str {
    match std::env::var("ONEDNN_MAX_CPU_ISA").as_deref() {
        Ok("AVX2") => return "avx2",
        Ok("AVX512_CORE") => return "avx512_core",
        Ok("AVX512_CORE_BF16") => return "avx512_core_bf16",
        _ => {}
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    let has = |f: &str| flags.contains(&f);
    if has("amx_bf16") {
        "amx"
    } else if has("avx512_bf16") {
        "avx512_core_bf16"
    } else if has("avx512f") {
        "avx512_core"
    } else {
        "avx2"
    }
}

/// The figures of the real MMSeg measured on a CPU of this class, where
/// they differ from the AMX machine's that measured the oracle files: oneDNN
/// picks other kernels (and allocates other buffers) per class, in bf16
/// always and in fp32 for some conv shapes (DeepLabV3+ R18 at 2x128 peaks
/// 16% higher on AVX2, in MMSeg and in segtune alike). The fixtures were
/// made with the shared oracle script (commands inside `tests/fixtures/`).
/// `None` on AMX (the oracle files apply); `Err` when no fixture was
/// measured on this class.
fn local_oracle(isa: &str) -> Option<Result<Value, String>> {
    if isa == "amx" {
        return None;
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    for file in [
        "oracle_cpu_avx512_core_bf16.json",
        "oracle_cpu_avx512_core.json",
        "oracle_cpu_avx2.json",
    ] {
        let Ok(text) = std::fs::read_to_string(format!("{dir}/{file}")) else {
            continue;
        };
        let fixture: Value = serde_json::from_str(&text).expect("fixtures are JSON");
        if fixture["isa"] == isa {
            return Some(Ok(fixture));
        }
    }
    Some(Err(format!(
        "no MMSeg oracle was measured on a CPU of class {isa}"
    )))
}

fn worker(args: &[&str]) -> Result<Value, Failed> {
    let out = Command::new(env!("CARGO_BIN_EXE_segtune-torch"))
        .args(args)
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if out.status.code().is_none_or(|c| c > 1) {
        return Err(format!("{args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)).into())
}

fn params_test(config: PathBuf, cfg_options: Vec<String>, want: Value) -> Result<(), Failed> {
    let mut args = vec!["inspect", config.to_str().unwrap(), "--json"];
    args.extend(common::cfg_options_args(&cfg_options));
    let inspect = worker(&args)?;
    for (key, oracle_key) in [
        ("params_total", "total"),
        ("params_trainable", "trainable"),
        ("params_by_prefix", "by_prefix"),
    ] {
        if inspect[key] != want[oracle_key] {
            return Err(format!(
                "{key}: segtune {} vs MMSeg {}",
                inspect[key], want[oracle_key]
            )
            .into());
        }
    }
    Ok(())
}

struct PeakRecord {
    name: String,
    config: PathBuf,
    batch: i64,
    crop: i64,
    precision: String,
    want: i64,
    oracle_seconds: f64,
    cfg_options: Vec<String>,
}

fn peak_test(r: PeakRecord) -> Result<(), Failed> {
    let amp = if r.precision == "bf16" { "bf16" } else { "off" };
    let (batch, crop) = (r.batch.to_string(), format!("{0}x{0}", r.crop));
    let mut args = vec![
        "trial",
        r.config.to_str().unwrap(),
        "--batch-size",
        &batch,
        "--crop",
        &crop,
        "--amp",
        amp,
        "--ignore-fraction",
        "0",
        // The oracle's labels: every class in every image.
        "--gt-segments",
        "all",
        "--threads",
        "1",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--json",
    ];
    args.extend(common::cfg_options_args(&r.cfg_options));
    let report = worker(&args)?;
    if report["status"] != "ok" {
        return Err(format!("status {}: {}", report["status"], report["message"]).into());
    }
    let got = report["peak_bytes"].as_i64().unwrap();
    let error = 100.0 * (got - r.want) as f64 / r.want as f64;
    println!(
        "{:<48} {:>5} {:>5} {:>6} oracle {:>13} segtune {:>13} {:>+7.3}%  time {:.3} s vs {:.3} s",
        r.name,
        r.batch,
        r.crop,
        r.precision,
        r.want,
        got,
        error,
        r.oracle_seconds,
        report["step_time_median_s"].as_f64().unwrap_or(f64::NAN)
    );
    if error.abs() > TOLERANCE_PERCENT {
        return Err(format!(
            "peak {got} vs MMSeg's {}: {error:+.2}% (tolerance {TOLERANCE_PERCENT}%)",
            r.want
        )
        .into());
    }
    Ok(())
}

/// A shape MMSeg cannot train (it raised `want`): segtune's trial says
/// "infeasible" with MMSeg's message, not OOM and not an error.
fn infeasible_test(
    config: &Path,
    batch: i64,
    crop: i64,
    precision: &str,
    want: &str,
) -> Result<(), Failed> {
    let amp = if precision == "bf16" { "bf16" } else { "off" };
    let (batch, crop) = (batch.to_string(), format!("{crop}x{crop}"));
    let report = worker(&[
        "trial",
        config.to_str().unwrap(),
        "--batch-size",
        &batch,
        "--crop",
        &crop,
        "--amp",
        amp,
        "--threads",
        "1",
        "--json",
    ])?;
    if report["status"] != "infeasible" || report["message"] != want {
        return Err(format!(
            "MMSeg raised `{want}`; segtune's trial: status {}, message {}",
            report["status"], report["message"]
        )
        .into());
    }
    Ok(())
}

/// The params and peak trials of one oracle file measured on an AMX CPU
/// (`models` and `records` as the shared oracle script writes them), each
/// peak compared with this CPU class's figure (`local`, see
/// [`local_oracle`]). Returns how many peak records are compared.
fn oracle_trials(
    oracle: &Value,
    configs: &Path,
    local: &Option<Result<Value, String>>,
    trials: &mut Vec<Trial>,
) -> usize {
    // The peak to compare with here, or why this record cannot be compared.
    let local_peak = |name: &str, batch: i64, crop: i64, precision: &str, own: i64| {
        let fixture = match local {
            None => return Ok(own),
            Some(Err(why)) if precision == "bf16" => return Err(why.clone()),
            Some(Err(_)) => return Ok(own),
            Some(Ok(f)) => f,
        };
        let found = fixture["records"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|r| {
                (r["config"] == name
                    && r["batch"] == batch
                    && r["precision"] == precision
                    && (r["crop"] == crop || r["crop"][0] == crop))
                    .then(|| r["peak_steps2_3_bytes"].as_i64())
                    .flatten()
            });
        let fp32_as_amx = fixture["fp32_as_amx"]
            .as_array()
            .is_some_and(|names| names.iter().any(|n| n == name));
        match found {
            Some(peak) => Ok(peak),
            // Where every fp32 record was seen to agree with AMX's.
            None if precision == "fp32" && fp32_as_amx => Ok(own),
            None => Err(format!(
                "not measured on a CPU of class {} (the fixture has no {precision} record \
                 {name} {batch}x{crop})",
                fixture["isa"].as_str().unwrap_or("?")
            )),
        }
    };
    let mut compared = 0usize;
    let records = oracle["records"].as_array().expect("records");
    // Each config's smallest record of each precision stays in the suite
    // even when long, so that no model goes unchecked outside the sweep.
    let smallest = |name: &str, precision: &str| {
        records
            .iter()
            .filter(|r| r["config"] == name && r["precision"] == precision && r["status"] == "ok")
            .filter_map(|r| Some(r["batch"].as_i64()? * r["crop"][0].as_i64()?.pow(2)))
            .min()
    };
    for (name, model) in oracle["models"].as_object().expect("models") {
        let config = configs.join(model["config_path"].as_str().expect("config_path"));
        // A fixture's model may be a shared config with options (with_cp).
        let cfg_options = common::fixture_cfg_options(model);
        let why_not = common::why_unsupported(&config, &cfg_options);
        let skip = |t: Trial| match &why_not {
            Some(_) => t.with_ignored_flag(true),
            None => t,
        };
        let want = model["params"].clone();
        let path = config.clone();
        let options = cfg_options.clone();
        let params = skip(Trial::test(format!("params::{name}"), move || {
            params_test(path, options, want)
        }));
        // tests/model_params.rs counts a sweep_only model's parameters in CI.
        let sweep_only = model["sweep_only"] == true && !sweep_all();
        trials.push(if sweep_only {
            params.with_ignored_flag(true)
        } else {
            params
        });
        for rec in oracle["records"]
            .as_array()
            .expect("records")
            .iter()
            .filter(|r| r["config"] == name.as_str() && r["status"] == "ok")
        {
            let batch = rec["batch"].as_i64().expect("batch");
            let crop = rec["crop"][0].as_i64().expect("crop");
            let precision = rec["precision"].as_str().expect("precision").to_string();
            let own = rec["peak_steps2_3_bytes"].as_i64().expect("peak");
            // A model segtune cannot build is ignored for that reason alone (below).
            let want = if why_not.is_none() {
                local_peak(name, batch, crop, &precision, own)
            } else {
                Ok(own)
            };
            let oracle_seconds = rec["time_steps2_3_mean_s"].as_f64().unwrap_or(f64::NAN);
            let test_name = format!("peak::{name}::b{batch}_{crop}_{precision}");
            let always = oracle["always_compared"]
                .as_array()
                .is_some_and(|names| names.iter().any(|n| n == test_name.as_str()))
                || oracle["suite_record"]
                    .as_str()
                    .is_some_and(|kept| test_name.ends_with(&format!("::{kept}")));
            let want = match want {
                // A long config's smallest shape in fp32 only (Mask2Former:
                // 4.5 s per MMSeg step at 1x128); its bf16 twin in the sweep.
                Ok(_)
                    if is_long(batch, crop, oracle_seconds)
                        && (smallest(name, &precision) != Some(batch * crop * crop)
                            || precision != "fp32")
                        && !always
                        && !sweep_all() =>
                {
                    Err(format!(
                        "a long record ({batch}x{crop}x{crop}, {oracle_seconds:.1} s per step in \
                     MMSeg), compared by scripts/oracle-sweep"
                    ))
                }
                w => w,
            };
            // A fixture model marked `sweep_only` (a large one) is compared
            // by the sweep alone.
            let want = match want {
                Ok(_) if model["sweep_only"] == true && !sweep_all() => Err(
                    "a large fixture model (sweep_only), compared by scripts/oracle-sweep"
                        .to_string(),
                ),
                w => w,
            };
            // A fixture may keep one record per config in the suite (the
            // rest in the sweep): `suite_record` names it (`b2_128_fp32`).
            let want = match (want, oracle["suite_record"].as_str()) {
                (Ok(_), Some(kept))
                    if !test_name.ends_with(&format!("::{kept}")) && !sweep_all() =>
                {
                    Err(format!(
                        "the fixture keeps its {kept} records in the suite; this one is compared by scripts/oracle-sweep"
                    ))
                }
                (w, _) => w,
            };
            let want = match want {
                Ok(w) => w,
                Err(why) => {
                    println!("oracle: {test_name} not compared: {why}");
                    trials.push(Trial::test(test_name, || Ok(())).with_ignored_flag(true));
                    continue;
                }
            };
            let record = PeakRecord {
                name: name.clone(),
                config: config.clone(),
                batch,
                crop,
                precision: precision.clone(),
                want,
                oracle_seconds,
                cfg_options: cfg_options.clone(),
            };
            if why_not.is_none() {
                compared += 1;
            }
            trials.push(skip(Trial::test(test_name, move || peak_test(record))));
        }
        // Batch 1 with BatchNorm after a global pooling: MMSeg raises, and
        // segtune must call the shape infeasible with the same words.
        for rec in oracle["records"]
            .as_array()
            .expect("records")
            .iter()
            .filter(|r| {
                r["config"] == name.as_str()
                    && r["status"] == "error"
                    && r["error"].as_str().is_some_and(|e| {
                        e.contains(segtune::models::layers::norm::ONE_VALUE_PER_CHANNEL)
                    })
            })
        {
            let batch = rec["batch"].as_i64().expect("batch");
            let crop = rec["crop"][0].as_i64().expect("crop");
            let precision = rec["precision"].as_str().expect("precision").to_string();
            let error = rec["error"].as_str().expect("error");
            let want = error
                .strip_prefix("ValueError: ")
                .unwrap_or(error)
                .to_string();
            let path = config.clone();
            let infeasible = skip(Trial::test(
                format!("infeasible::{name}::b{batch}_{crop}_{precision}"),
                move || infeasible_test(&path, batch, crop, &precision, &want),
            ));
            trials.push(infeasible.with_ignored_flag(sweep_only || why_not.is_some()));
        }
        if let Some(reason) = &why_not {
            println!(
                "oracle: {name} not compared: {}",
                reason.lines().next().unwrap_or("")
            );
        }
    }
    compared
}

/// One trial per oracle config (parameters) and per record (peak).
fn trials(shared: &Path) -> Vec<Trial> {
    let oracle: Value = serde_json::from_str(
        &std::fs::read_to_string(shared.join("oracle/results.json")).expect("results.json"),
    )
    .expect("results.json is JSON");
    let configs = shared.join("mmseg-configs/configs");
    let isa = cpu_class();
    let local = local_oracle(isa);
    println!("oracle: CPU class {isa}");
    let mut trials = Vec::new();
    let mut compared = oracle_trials(&oracle, &configs, &local, &mut trials);
    for path in common::EXTRA_ORACLES {
        let extra: Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("the extra oracle fixture"))
                .expect("the extra oracle fixture is JSON");
        if extra["isa"] == "amx" {
            compared += oracle_trials(&extra, &configs, &local, &mut trials);
            continue;
        }
        // Measured on another class: its figures are this CPU's own when
        // the class is the same, and not known here otherwise (an empty
        // fixture of this class: every peak listed as not compared).
        let here = if extra["isa"] == isa {
            None
        } else {
            Some(Ok(serde_json::json!({"isa": isa, "records": []})))
        };
        compared += oracle_trials(&extra, &configs, &here, &mut trials);
    }
    println!("oracle: {compared} peak records compared");
    trials.push(Trial::test("coverage", move || {
        if compared == 0 {
            Err("no oracle record was compared".into())
        } else {
            Ok(())
        }
    }));
    trials
}

fn main() {
    let args = Arguments::from_args();
    let trials = match common::require_shared("oracle_cpu") {
        Some(shared) => trials(&shared),
        None => vec![Trial::test("oracle_cpu", || Ok(())).with_ignored_flag(true)],
    };
    libtest_mimic::run(&args, trials).exit();
}
