//! The Python worker: `--python-worker` of `trial`, `estimate`, `search`
//! and `inspect` for a config with component types segtune does not build
//! (a backbone of the user's own, registered through `custom_imports`). It
//! runs MMSeg's own `train_step` in the user's Python and reports as the
//! native worker does; without the flag segtune never runs the user's code.
//!
//! The tests need two interpreters that `scripts/test-env.sh` names:
//! `SEGTUNE_MMSEG_PYTHON` (MMSegmentation 1.2.2 over the torch venv,
//! made by `scripts/setup-tests`) and `SEGTUNE_TORCH_PYTHON` (the torch venv,
//! without MMSeg). Without them a test fails under `CI=true` and says why
//! otherwise.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

const PIP_LINE: &str = "pip install mmengine==0.10.7 mmcv-lite==2.1.0 mmsegmentation==1.2.2";
const PSPNET_R18: &str = "pspnet/pspnet_r18-d8_4xb2-80k_cityscapes-512x1024.py";

fn run(command: &mut Command) -> (Output, f64) {
    let started = Instant::now();
    let out = command.output().expect("segtune runs");
    (out, started.elapsed().as_secs_f64())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_python_without_mmseg_is_told_what_to_install() {
    let test = "a_python_without_mmseg_is_told_what_to_install";
    let Some(python) = common::require_python(test, "SEGTUNE_TORCH_PYTHON") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = common::write(&dir, "cfg.py", "model = dict(type='EncoderDecoder')\n");
    let (out, _) = run(Command::new(env!("CARGO_BIN_EXE_segtune"))
        .arg("trial")
        .arg(&config)
        .arg("--python-worker")
        .arg("--python")
        .arg(&python));
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one message: {stderr}");
    let line = lines[0];
    assert!(line.starts_with("error: "), "{line}");
    assert!(line.contains("MMSeg"), "{line}");
    assert!(line.contains(PIP_LINE), "{line}");
    assert!(line.contains(&python.display().to_string()), "{line}");
}

/// A ResNetV1c registered under a new name, and a PSPNet R-18 config using
/// it through `custom_imports`; returns the config.
fn custom_backbone_config(dir: &tempfile::TempDir, shared: &Path) -> PathBuf {
    common::write(
        dir,
        "my_backbone.py",
        "from mmseg.models.backbones import ResNetV1c\n\
         from mmseg.registry import MODELS\n\n\n\
         @MODELS.register_module()\n\
         class MyResNet(ResNetV1c):\n    \
             \"\"\"ResNetV1c under a name segtune does not build.\"\"\"\n",
    );
    let base = shared.join("mmseg-configs/configs").join(PSPNET_R18);
    common::write(
        dir,
        "my_pspnet.py",
        &format!(
            "_base_ = '{}'\n\
             custom_imports = dict(imports=['my_backbone'], allow_failed_imports=False)\n\
             model = dict(backbone=dict(type='MyResNet'))\n",
            base.display()
        ),
    )
}

/// A marker the user's module writes when it is imported: proof that
/// segtune ran (or did not run) the user's code.
fn with_import_marker(dir: &tempfile::TempDir) -> PathBuf {
    let marker = dir.path().join("my_backbone_was_imported");
    let module = dir.path().join("my_backbone.py");
    let text = std::fs::read_to_string(&module).unwrap();
    std::fs::write(
        &module,
        format!(
            "import pathlib\npathlib.Path({:?}).touch()\n{text}",
            marker.display().to_string()
        ),
    )
    .unwrap();
    marker
}

#[test]
fn a_custom_backbone_runs_through_the_python_worker_only_when_asked() {
    let test = "a_custom_backbone_runs_through_the_python_worker_only_when_asked";
    let Some(shared) = common::require_shared(test) else {
        return;
    };
    let Some(python) = common::require_python(test, "SEGTUNE_MMSEG_PYTHON") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = custom_backbone_config(&dir, &shared);
    let marker = with_import_marker(&dir);
    // Unasked: refused by name, the module named with the way to opt in,
    // and none of the user's code run.
    for command in ["trial", "estimate", "search", "inspect"] {
        let mut segtune = Command::new(env!("CARGO_BIN_EXE_segtune"));
        segtune.arg(command).arg(&config);
        if command == "estimate" || command == "search" {
            segtune.args(["--vram", "8G"]);
        }
        if command == "search" {
            segtune.arg("--out").arg(dir.path().join("unasked"));
        }
        let (out, _) = run(segtune
            .env("SEGTUNE_PYTHON", &python)
            .env("PYTHONPATH", dir.path()));
        // `inspect` answers "supported: no" (exit 0); the others refuse.
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        let code = if command == "inspect" { 0 } else { 2 };
        assert_eq!(out.status.code(), Some(code), "{command}: {said}");
        assert!(
            said.contains("unknown backbone type `MyResNet`")
                && said.contains("custom_imports, `my_backbone`")
                && said.contains("--python-worker"),
            "{command}: {said}"
        );
        assert!(!marker.exists(), "{command} ran the user's module unasked");
    }
    // Asked: MMSeg's own step, in that Python.
    let (out, seconds) = run(Command::new(env!("CARGO_BIN_EXE_segtune"))
        .args(["trial"])
        .arg(&config)
        .args([
            "--python-worker",
            "--batch-size",
            "2",
            "--crop",
            "128x128",
            "--threads",
            "1",
        ])
        .env("SEGTUNE_PYTHON", &python)
        .env("PYTHONPATH", dir.path()));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        marker.exists(),
        "the Python worker did not import the module"
    );
    assert!(
        stdout.starts_with("status: ok (Python worker)\n"),
        "{stdout}"
    );
    // MMSeg's PSPNet R-18 count (params_all.json): the backbone is ResNetV1c's.
    assert!(stdout.contains("model: 12790086 params"), "{stdout}");
    let peak: i64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("peak bytes (CPU tensors, measured steps): "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a peak in: {stdout}"));
    assert!(peak > 100 << 20, "{peak}");
    eprintln!("{test}: peak {peak} bytes, {seconds:.1} s");
}

/// `segtune inspect --python-worker`: MMSeg's own model, counted.
#[test]
fn a_custom_backbone_is_inspected_by_mmseg_itself() {
    let test = "a_custom_backbone_is_inspected_by_mmseg_itself";
    let Some(shared) = common::require_shared(test) else {
        return;
    };
    let Some(python) = common::require_python(test, "SEGTUNE_MMSEG_PYTHON") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = custom_backbone_config(&dir, &shared);
    let (out, _) = run(Command::new(env!("CARGO_BIN_EXE_segtune"))
        .arg("inspect")
        .arg(&config)
        .args(["--python-worker", "--json"])
        .arg("--python")
        .arg(&python)
        .env("PYTHONPATH", dir.path()));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["backbone_type"], "MyResNet", "{summary}");
    assert_eq!(summary["supported"], true, "{summary}");
    // MMSeg's PSPNet R-18 count (params_all.json), as segtune's own build.
    assert_eq!(summary["params_total"], 12790086, "{summary}");
}

/// `segtune search --python-worker` of a config with the user's own
/// backbone: a winner, predicted from MMSeg's own steps, written as a
/// config that mmengine loads (the module importable) and MMSeg builds.
/// A recipe in mixed precision is not switched to fp32 unasked.
#[test]
fn a_custom_backbone_is_searched_through_the_python_worker() {
    let test = "a_custom_backbone_is_searched_through_the_python_worker";
    let Some(shared) = common::require_shared(test) else {
        return;
    };
    let Some(python) = common::require_python(test, "SEGTUNE_MMSEG_PYTHON") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = custom_backbone_config(&dir, &shared);
    let out_dir = dir.path().join("out");
    let search = |extra: &[&str]| {
        run(Command::new(env!("CARGO_BIN_EXE_segtune"))
            .arg("search")
            .arg(&config)
            .args([
                "--python-worker",
                "--vram",
                "8G",
                "--threads",
                "1",
                "--json",
            ])
            .arg("--python")
            .arg(&python)
            .arg("--out")
            .arg(&out_dir)
            .args(extra)
            .env("PYTHONPATH", dir.path()))
    };
    let (out, seconds) = search(&[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let result: Value = serde_json::from_str(&stdout).unwrap();
    let winner = &result["winner"]["candidate"];
    assert!(winner["batch_size"].as_i64().unwrap() >= 1, "{result}");
    assert_eq!(winner["amp"], "off", "{result}");
    assert!(
        result["torch_source"]
            .as_str()
            .is_some_and(|s| s.contains("Python worker")),
        "{result}"
    );
    let written = result["emitted"][0].as_str().expect("a written config");
    let check = format!(
        "import importlib.util, sys\n\
         spec = importlib.util.spec_from_file_location('w', {worker:?})\n\
         w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n\
         w.stub_mmcv_ext()\n\
         from mmengine.config import Config\n\
         cfg = Config.fromfile({written:?})\n\
         from mmseg.utils import register_all_modules; register_all_modules()\n\
         from mmseg.registry import MODELS\n\
         model = MODELS.build(cfg.model)\n\
         print(type(model.backbone).__name__, cfg.train_dataloader.batch_size)\n",
        worker = concat!(env!("CARGO_MANIFEST_DIR"), "/src/worker/python_worker.py"),
    );
    let loaded = Command::new(&python)
        .args(["-c", &check])
        .env("PYTHONPATH", dir.path())
        .output()
        .unwrap();
    assert!(
        loaded.status.success(),
        "mmengine/MMSeg could not load {written}: {}",
        text(&loaded.stderr)
    );
    assert_eq!(
        text(&loaded.stdout).trim(),
        format!("MyResNet {}", winner["batch_size"]),
        "{written}"
    );
    eprintln!("{test}: winner {winner} in {seconds:.1} s");

    // An fp16 recipe: refused, with the way to allow fp32.
    let (out, _) = search(&["--cfg-options", "optim_wrapper.type=AmpOptimWrapper"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--amp off"), "{stderr}");
}

/// The CPU's class for oneDNN, as `tests/oracle_cpu.rs` tells it.
fn cpu_class() -> &'static str {
    match std::env::var("ONEDNN_MAX_CPU_ISA").as_deref() {
        Ok("AVX2") => return "avx2",
        Ok("AVX512_CORE") => return "avx512_core",
        Ok("AVX512_CORE_BF16") => return "avx512_core_bf16",
        _ => {}
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |f: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|l| l.split_whitespace().any(|w| w == f))
    };
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

/// MMSeg's peak over steps 2-3 of PSPNet R-18 at 2x128 fp32: the shared
/// oracle's record where it has one (measured with AMX), else this
/// project's fixture when this CPU is of its class; `Err` says why none.
fn oracle_peak(shared: &Path) -> Result<i64, String> {
    let name = "pspnet_r18-d8_4xb2-80k_cityscapes-512x1024";
    let find = |doc: &Value| {
        doc["records"].as_array().and_then(|records| {
            records
                .iter()
                .find(|r| {
                    r["config"] == name
                        && r["batch"] == 2
                        && r["crop"] == serde_json::json!([128, 128])
                        && r["precision"] == "fp32"
                })
                .and_then(|r| r["peak_steps2_3_bytes"].as_i64())
        })
    };
    let read = |path: PathBuf| -> Value {
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    };
    let results = read(shared.join("oracle/results.json"));
    if let (Some(peak), "amx") = (find(&results), cpu_class()) {
        return Ok(peak);
    }
    let fixture = read(PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_python_worker.json"
    )));
    match (find(&fixture), fixture["isa"].as_str()) {
        (Some(peak), Some(isa)) if isa == cpu_class() => Ok(peak),
        _ => Err(format!(
            "no MMSeg oracle of {name} at 2x128 fp32 was measured on a CPU of class {}",
            cpu_class()
        )),
    }
}

const SHAPE: &[&str] = &[
    "--batch-size",
    "2",
    "--crop",
    "128x128",
    "--amp",
    "off",
    "--threads",
    "1",
    "--warmup",
    "1",
    "--steps",
    "2",
    "--ignore-fraction",
    "0",
    "--gt-segments",
    "all",
    "--json",
];

fn peak_of(out: &Output, who: &str) -> i64 {
    assert!(
        out.status.success(),
        "{who}: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["status"], "ok", "{who}");
    report["peak_bytes"].as_i64().expect("a CPU peak")
}

fn within(a: i64, b: i64, fraction: f64) -> bool {
    (a - b).abs() as f64 <= fraction * b as f64
}

#[test]
fn pspnet_r18_peaks_as_mmseg_and_as_the_native_worker() {
    let test = "pspnet_r18_peaks_as_mmseg_and_as_the_native_worker";
    let Some(shared) = common::require_shared(test) else {
        return;
    };
    let Some(python) = common::require_python(test, "SEGTUNE_MMSEG_PYTHON") else {
        return;
    };
    let config = shared.join("mmseg-configs/configs").join(PSPNET_R18);
    let (out, python_s) = run(Command::new(env!("CARGO_BIN_EXE_segtune"))
        .arg("trial")
        .arg(&config)
        .args(["--python-worker", "--python"])
        .arg(&python)
        .args(SHAPE));
    let python_peak = peak_of(&out, "the Python worker");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["worker"], "python");
    let (out, native_s) = run(Command::new(env!("CARGO_BIN_EXE_segtune-torch"))
        .arg("trial")
        .arg(&config)
        .args(SHAPE));
    let native_peak = peak_of(&out, "the native worker");
    eprintln!(
        "{test}: Python worker {python_peak} bytes ({python_s:.1} s), native {native_peak} bytes ({native_s:.1} s)"
    );
    assert!(
        within(native_peak, python_peak, 0.001),
        "native {native_peak} vs Python worker {python_peak}"
    );
    match oracle_peak(&shared) {
        Ok(oracle) => {
            eprintln!("{test}: MMSeg oracle {oracle} bytes");
            assert!(
                within(python_peak, oracle, 0.001),
                "Python worker {python_peak} vs oracle {oracle}"
            );
        }
        Err(why) => eprintln!("{test}: oracle comparison skipped: {why}"),
    }
}

/// `segtune estimate` of a config, `extra` its flags; the JSON estimate.
fn estimate(config: &Path, extra: &[&str], envs: &[(&str, &Path)]) -> (Value, f64, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_segtune"));
    command
        .arg("estimate")
        .arg(config)
        .args(["--vram", "24G", "--batch-size", "2", "--crop", "128x128"])
        .args(["--amp", "off", "--threads", "1", "--json"])
        .args(extra);
    for (k, v) in envs {
        command.env(k, v);
    }
    let (out, seconds) = run(&mut command);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let value = serde_json::from_str(&stdout).expect("a JSON estimate");
    (value, seconds, stderr)
}

fn predicted(e: &Value, key: &str) -> i64 {
    e[key].as_i64().unwrap_or_else(|| panic!("{key} in {e}"))
}

/// For a stock PSPNet R-18, the Python worker's traces of MMSeg's own step
/// replay as segtune's traces of its rebuild: on meta kernels (op outputs,
/// with the kernel calls that take cuDNN workspaces and scratch) and as
/// every CPU allocation. The allocated figures within 0.5%; the reserved
/// one (the order of frees decides which cached blocks are reused) within
/// 1% on meta kernels.
#[test]
fn pspnet_r18_python_traces_replay_as_the_native_ones() {
    let test = "pspnet_r18_python_traces_replay_as_the_native_ones";
    let Some(shared) = common::require_shared(test) else {
        return;
    };
    let Some(python) = common::require_python(test, "SEGTUNE_MMSEG_PYTHON") else {
        return;
    };
    let config = shared.join("mmseg-configs/configs").join(PSPNET_R18);
    let python_flag = python.display().to_string();
    for (trace, reserved_tolerance) in [("meta", 0.01), ("cpu-allocator", 0.005)] {
        let (native, native_s, _) = estimate(&config, &["--trace", trace], &[]);
        let (by_python, python_s, _) = estimate(
            &config,
            &[
                "--trace",
                trace,
                "--python-worker",
                "--python",
                &python_flag,
            ],
            &[],
        );
        assert!(
            by_python["notes"][0]
                .as_str()
                .is_some_and(|n| n.contains("Python worker")),
            "{}",
            by_python["notes"]
        );
        for (key, tolerance) in [
            ("predicted_min_peak_allocated_bytes", 0.005),
            ("predicted_peak_allocated_bytes", 0.005),
            ("predicted_peak_reserved_bytes", reserved_tolerance),
        ] {
            let (n, p) = (predicted(&native, key), predicted(&by_python, key));
            eprintln!(
                "{test}: --trace {trace} {key}: native {n}, Python worker {p} ({:+.3}%)",
                100.0 * (p - n) as f64 / n as f64
            );
            assert!(
                within(p, n, tolerance),
                "--trace {trace} {key}: Python worker {p} vs native {n}"
            );
        }
        eprintln!("{test}: --trace {trace}: native {native_s:.1} s, Python worker {python_s:.1} s");
    }
}

/// `segtune estimate --python-worker` of a config with the user's own
/// backbone predicts from MMSeg's own step.
#[test]
fn a_custom_backbone_is_estimated_through_the_python_worker() {
    let test = "a_custom_backbone_is_estimated_through_the_python_worker";
    let Some(shared) = common::require_shared(test) else {
        return;
    };
    let Some(python) = common::require_python(test, "SEGTUNE_MMSEG_PYTHON") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = custom_backbone_config(&dir, &shared);
    let (e, seconds, _) = estimate(
        &config,
        &["--python-worker"],
        &[
            ("SEGTUNE_PYTHON", python.as_path()),
            ("PYTHONPATH", dir.path()),
        ],
    );
    let notes = e["notes"].to_string();
    assert!(notes.contains("Python worker"), "{notes}");
    let peak = predicted(&e, "predicted_peak_allocated_bytes");
    assert!(peak > 100 << 20 && e["fits"] == true, "{e}");
    eprintln!("{test}: predicted {peak} bytes in {seconds:.1} s");
}

/// Where values decide shapes (Mask2Former's Hungarian matching on the
/// classes present), the Python worker's meta trace cannot run the step:
/// the estimate traces every CPU allocation of MMSeg's step instead, and
/// says so.
#[test]
fn a_step_meta_kernels_cannot_run_falls_back_to_the_cpu_allocator_trace() {
    let test = "a_step_meta_kernels_cannot_run_falls_back_to_the_cpu_allocator_trace";
    let Some(shared) = common::require_shared(test) else {
        return;
    };
    let Some(python) = common::require_python(test, "SEGTUNE_MMSEG_PYTHON") else {
        return;
    };
    let config = shared
        .join("mmseg-configs/configs")
        .join("mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py");
    let python_flag = python.display().to_string();
    let (e, seconds, _) = estimate(
        &config,
        &[
            "--gt-segments",
            "4",
            "--python-worker",
            "--python",
            &python_flag,
        ],
        &[],
    );
    let notes = e["notes"].to_string();
    assert!(
        notes.contains("every CPU allocation of MMSeg's own training step")
            && notes.contains("meta trace could not run the step"),
        "{notes}"
    );
    let peak = predicted(&e, "predicted_peak_allocated_bytes");
    assert!(peak > 100 << 20, "{e}");
    eprintln!("{test}: predicted {peak} bytes in {seconds:.1} s");
}

/// ERFNet's encoder drops out (`nn.Dropout`, p 0.1) in its 13 non-bottleneck
/// blocks: on CUDA ATen's fused `native_dropout` keeps a bool mask, and the
/// Python worker's meta trace takes that path too (on the meta device ATen
/// would keep a float noise tensor: 216 MiB more at the recipe's batch 4 x
/// 512x1024, 3.3 MiB at batch 2 x 128x128). MMSeg's own step then replays
/// as segtune's rebuild.
#[test]
fn erfnets_dropout_is_traced_as_cuda_keeps_it() {
    let test = "erfnets_dropout_is_traced_as_cuda_keeps_it";
    let Some(shared) = common::require_shared(test) else {
        return;
    };
    let Some(python) = common::require_python(test, "SEGTUNE_MMSEG_PYTHON") else {
        return;
    };
    let config =
        shared.join("mmseg-configs/configs/erfnet/erfnet_fcn_4xb4-160k_cityscapes-512x1024.py");
    let python_flag = python.display().to_string();
    let (native, _, _) = estimate(&config, &["--trace", "meta"], &[]);
    let (by_python, _, _) = estimate(
        &config,
        &[
            "--trace",
            "meta",
            "--python-worker",
            "--python",
            &python_flag,
        ],
        &[],
    );
    for key in [
        "predicted_min_peak_allocated_bytes",
        "predicted_peak_allocated_bytes",
    ] {
        let (n, p) = (predicted(&native, key), predicted(&by_python, key));
        assert!(
            within(p, n, 0.005),
            "{key}: Python worker {p} vs native {n} ({:+.2}%)",
            100.0 * (p - n) as f64 / n as f64
        );
    }
}
