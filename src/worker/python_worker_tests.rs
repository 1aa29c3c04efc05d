use super::*;
use crate::kinds::{Amp, DeviceChoice};
use crate::trial::WorkerKind;

/// A stand-in interpreter: a shell script that ignores its arguments,
/// prints `stdout` and exits with `code`.
fn fake_python(dir: &tempfile::TempDir, stdout: &str, code: i32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.path().join("python");
    let text = format!("#!/bin/sh\ncat <<'JSON'\n{stdout}\nJSON\nexit {code}\n");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The script's `--request`: the request as every worker reads it.
fn python_request(request: &TrialRequest) -> serde_json::Value {
    serde_json::from_str(&request.to_python_request().unwrap()).unwrap()
}

#[test]
fn a_request_becomes_the_scripts_request() {
    let request = TrialRequest {
        cfg_options: vec!["model.decode_head.num_classes=5".into()],
        batch_size: 3,
        crop: (256, 128),
        amp: Amp::Bf16,
        accumulative_counts: Some(2),
        device: DeviceChoice::Cuda(1),
        threads: Some(1),
        gt_segments: None,
        ..TrialRequest::new("cfg.py")
    };
    let sent = python_request(&request);
    for (field, value) in [
        ("config", serde_json::json!("cfg.py")),
        ("batch_size", 3.into()),
        ("crop", serde_json::json!([256, 128])),
        ("amp", "bf16".into()),
        ("accumulative_counts", 2.into()),
        ("warmup_steps", 1.into()),
        ("measured_steps", 2.into()),
        ("device", "cuda:1".into()),
        ("seed", 0.into()),
        ("ignore_fraction", 0.05.into()),
        ("gt_segments", serde_json::Value::Null),
        ("threads", 1.into()),
        (
            "cfg_options",
            serde_json::json!(["model.decode_head.num_classes=5"]),
        ),
        ("inspect", false.into()),
    ] {
        assert_eq!(sent[field], value, "{field} in {sent}");
    }
    // The script reads the request the native worker reads, field for field.
    let back: TrialRequest = serde_json::from_value({
        let mut v = sent.clone();
        let map = v.as_object_mut().unwrap();
        map.remove("inspect");
        map.remove("record_ops");
        v
    })
    .unwrap();
    assert_eq!(back, request);
}

/// A CPU-allocator trace for a prediction: the trace file, and torch.optim's
/// foreach implementation as CUDA would run it.
#[test]
fn a_traced_step_for_a_prediction_passes_the_trace_file_and_foreach() {
    let request = TrialRequest {
        as_cuda: true,
        trace_out: Some(PathBuf::from("/tmp/step.trace")),
        op_trace: OpTrace::Meta,
        ..TrialRequest::new("cfg.py")
    };
    let sent = python_request(&request);
    assert_eq!(sent["trace_out"], "/tmp/step.trace", "{sent}");
    assert_eq!(sent["as_cuda"], true, "{sent}");
    assert_eq!(sent["op_trace"], "meta", "{sent}");
    let ops: Vec<&str> = sent["record_ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap())
        .collect();
    assert!(
        ops.starts_with(&["aten::convolution", "aten::convolution_backward"]),
        "{ops:?}"
    );
    let on_gpu = TrialRequest {
        device: DeviceChoice::Cuda(0),
        ..request
    };
    let err = on_gpu.to_python_request().unwrap_err().to_string();
    assert!(
        err.contains("--as-cuda on a GPU") && err.contains("--trace-out on a GPU"),
        "{err}"
    );
}

#[test]
fn settings_only_the_native_worker_has_are_refused_by_name() {
    let request = TrialRequest {
        mode: RunMode::Infer,
        as_cuda: true,
        amp: Amp::Bf16,
        vram_budget_bytes: Some(1 << 30),
        op_trace: OpTrace::Cpu,
        ..TrialRequest::new("cfg.py")
    };
    let err = request.to_python_request().unwrap_err().to_string();
    for name in [
        "--mode infer",
        "--as-cuda with --amp",
        "--vram",
        "--op-trace cpu",
    ] {
        assert!(err.contains(name), "{err}");
    }
    assert!(!err.contains("--gpus"), "{err}");
    let fp16 = TrialRequest {
        amp: Amp::Fp16,
        ..TrialRequest::new("cfg.py")
    };
    let err = fp16.to_python_request().unwrap_err().to_string();
    assert!(err.contains("--amp fp16 on the CPU"), "{err}");
    let on_cuda = TrialRequest {
        device: DeviceChoice::Cuda(0),
        ..fp16
    };
    assert!(on_cuda.to_python_request().is_ok());
}

#[test]
fn a_python_without_mmseg_is_an_environment_error_with_the_pip_line() {
    let dir = tempfile::tempdir().unwrap();
    let refusal = r#"{"python_worker_error": {"kind": "missing_mmseg", "message": "no mmseg", "missing": ["mmengine", "mmseg"]}}"#;
    let python = fake_python(&dir, refusal, 2);
    let err = PythonWorker::at(&python)
        .trial(&TrialRequest::new("cfg.py"), None)
        .unwrap_err();
    assert!(matches!(err, Error::Environment { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(&python.display().to_string()), "{text}");
    assert!(text.contains("cannot import mmengine, mmseg"), "{text}");
    assert!(text.contains(MMSEG_PIP), "{text}");
}

#[test]
fn the_report_is_read_after_lines_a_users_module_printed() {
    let dir = tempfile::tempdir().unwrap();
    let mut report = TrialReport::new(&TrialRequest::new("cfg.py"), "cpu".into());
    report.worker = WorkerKind::Python;
    report.peak_bytes = Some(123);
    let stdout = format!(
        "registering MyResNet\n{}",
        serde_json::to_string(&report).unwrap()
    );
    let python = fake_python(&dir, &stdout, 0);
    let got = PythonWorker::at(&python)
        .trial(&TrialRequest::new("cfg.py"), None)
        .unwrap();
    assert_eq!(got.worker, WorkerKind::Python);
    assert_eq!(got.peak_bytes, Some(123));
}

#[test]
fn a_python_worker_that_dies_without_a_report_is_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let python = fake_python(&dir, "Segmentation fault", 3);
    let report = PythonWorker::at(&python)
        .trial(&TrialRequest::new("cfg.py"), None)
        .unwrap();
    assert_eq!(report.status, TrialStatus::Crash);
    assert_eq!(report.worker, WorkerKind::Python);
    let message = report.message.unwrap();
    assert!(
        message.contains("Python worker") && message.contains("code 3"),
        "{message}"
    );
}

/// A report whose fields do not read (a script of another version) is an
/// error that says why, not a crash "without a report".
#[test]
fn a_report_segtune_cannot_read_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let python = fake_python(
        &dir,
        r#"{"status": "ok", "meta_stand_ins": ["aten::x"]}"#,
        0,
    );
    let report = PythonWorker::at(&python)
        .trial(&TrialRequest::new("cfg.py"), None)
        .unwrap();
    assert_eq!(report.status, TrialStatus::Error);
    let message = report.message.unwrap();
    assert!(message.contains("cannot read"), "{message}");
}

#[test]
fn the_script_speaks_the_reports_field_names() {
    for field in [
        "peak_bytes",
        "bytes_before_step1",
        "cuda_peak_allocated_bytes",
        "optimizer_state_bytes",
        "step_time_median_s",
        "worker='python'",
        "missing_mmseg",
        MMSEG_PIP,
    ] {
        assert!(SCRIPT.contains(field), "{field}");
    }
}

/// A Python that starts a grandchild holding the pipes (issue 46: it hung
/// 956 s) stops at the deadline given, the grandchild with it, and the
/// timeout names that deadline (no start allowance added to it).
#[test]
fn a_python_worker_and_its_grandchild_stop_at_the_deadline_given() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    let python = dir.path().join("python");
    std::fs::write(
        &python,
        format!(
            "#!/bin/sh\nsleep 3600 & echo $! > {}\nexec sleep 3600\n",
            pidfile.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let started = std::time::Instant::now();
    let report = PythonWorker::at(&python)
        .trial(&TrialRequest::new("cfg.py"), Some(Duration::from_secs(1)))
        .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(11), "took {took:?}");
    assert_eq!(report.status, TrialStatus::Timeout);
    let message = report.message.unwrap();
    assert!(message.contains("within 1 s"), "{message}");
    let grandchild = std::fs::read_to_string(&pidfile).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let alive = std::fs::read_to_string(format!("/proc/{}/stat", grandchild.trim()))
        .is_ok_and(|s| !s.contains(") Z "));
    assert!(!alive, "the grandchild {} still runs", grandchild.trim());
}
