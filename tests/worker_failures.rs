//! A trial of a model that cannot be built (a config with a negative class
//! count, an empty embedding, a zero-channel head) ends with exit code 2 and
//! one line on stderr naming the key, without a C++ backtrace, and nothing
//! on stdout; a trial that does not fit or cannot train is an answer (a
//! report, exit code 1).

mod common;

use assert_cmd::Command;

fn b0(shared: &std::path::Path) -> std::path::PathBuf {
    shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py")
}

#[test]
fn a_model_that_cannot_be_built_is_one_line_naming_the_key() {
    let Some(shared) =
        common::require_shared("a_model_that_cannot_be_built_is_one_line_naming_the_key")
    else {
        return;
    };
    for (option, want) in [
        (
            "model.decode_head.num_classes=-3",
            "SegformerHead: `num_classes` = -3: a count or size must be at least 1",
        ),
        (
            "model.backbone.embed_dims=0",
            "MixVisionTransformer: `embed_dims` = 0: a count or size must be at least 1",
        ),
        (
            "model.decode_head.channels=-1",
            "SegformerHead: `channels` = -1: a count or size must be at least 1",
        ),
    ] {
        let out = Command::cargo_bin("segtune")
            .unwrap()
            .arg("trial")
            .arg(b0(&shared))
            .args([
                "--crop",
                "64x64",
                "--batch-size",
                "1",
                "--cfg-options",
                option,
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{option}: {err}");
        assert!(out.stdout.is_empty(), "{option}: stdout must be empty");
        assert!(
            err.starts_with("error: the trial failed (error): "),
            "{option}: {err}"
        );
        assert!(err.contains(want), "{option}: {err}");
        assert_eq!(err.lines().count(), 1, "{option}: one line: {err}");
        assert!(
            !err.contains("frame #"),
            "{option}: no C++ backtrace: {err}"
        );
    }
}

#[test]
fn a_shape_that_cannot_train_is_a_report_not_an_error() {
    let Some(shared) = common::require_shared("a_shape_that_cannot_train_is_a_report_not_an_error")
    else {
        return;
    };
    let config =
        shared.join("mmseg-configs/configs/pspnet/pspnet_r18-d8_4xb2-80k_cityscapes-512x1024.py");
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("trial")
        .arg(config)
        .args(["--crop", "64x64", "--batch-size", "1", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "infeasible", "{report}");
    assert!(report["message"]
        .as_str()
        .unwrap()
        .starts_with("Expected more than 1 value per channel when training"));
}

#[test]
fn a_batch_beyond_the_hosts_ram_is_refused_before_it_grows() {
    let Some(shared) =
        common::require_shared("a_batch_beyond_the_hosts_ram_is_refused_before_it_grows")
    else {
        return;
    };
    let started = std::time::Instant::now();
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("trial")
        .arg(b0(&shared))
        .args(["--batch-size", "1000000000", "--crop", "512x512"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert!(err.contains("the input batch alone is"), "{err}");
    assert!(err.contains("of RAM"), "{err}");
    println!(
        "--batch-size 1000000000 refused in {:.2} s",
        started.elapsed().as_secs_f64()
    );
}

/// The worker also runs under an OS limit on its data memory
/// (`RLIMIT_DATA`, the host's available RAM over what it uses at start;
/// `SEGTUNE_WORKER_DATA_LIMIT` lowers it here to 100 MB): memory the tensor
/// count does not see cannot grow past it either, and reaching it is a
/// `host_oom` naming the limit, exit 2, one line, nothing on stdout.
#[test]
fn a_worker_at_its_data_memory_limit_reports_host_out_of_memory() {
    let Some(shared) =
        common::require_shared("a_worker_at_its_data_memory_limit_reports_host_out_of_memory")
    else {
        return;
    };
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .env("SEGTUNE_WORKER_DATA_LIMIT", "100000000")
        .arg("trial")
        .arg(b0(&shared))
        .args(["--batch-size", "2", "--crop", "512x512"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert!(err.contains("host_oom"), "{err}");
    assert!(
        err.contains("the worker reached its memory limit of 0.1 GB"),
        "{err}"
    );
    assert!(err.lines().count() <= 3, "{err}");
}

/// A step that needs more host RAM than there is (here: told so through
/// `SEGTUNE_HOST_MEMORY`) stops at the host cap with what it needed, for
/// `trial` and for `estimate`'s CPU-traced step alike: exit 2, one line.
/// `estimate`'s default meta trace allocates no host memory for tensors:
/// the same prediction goes through on the same host.
#[test]
fn a_step_beyond_the_hosts_ram_stops_at_the_cap_and_says_what_it_needs() {
    let Some(shared) = common::require_shared(
        "a_step_beyond_the_hosts_ram_stops_at_the_cap_and_says_what_it_needs",
    ) else {
        return;
    };
    let trial = ["trial", "--batch-size", "2", "--crop", "256x256"];
    let estimate = [
        "estimate",
        "--batch-size",
        "2",
        "--crop",
        "256x256",
        "--vram",
        "8G",
        "--trace",
        "cpu",
    ];
    for args in [&trial[..], &estimate[..]] {
        let out = Command::cargo_bin("segtune")
            .unwrap()
            .env("SEGTUNE_HOST_MEMORY", "600000000")
            .arg(args[0])
            .arg(b0(&shared))
            .args(&args[1..])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(err.contains("host_oom"), "{args:?}: {err}");
        assert!(
            err.contains("host out of memory ")
                && err.contains(if args[0] == "trial" {
                    "in the CPU step"
                } else {
                    "while tracing"
                })
                && err.contains("the step needs more than"),
            "{args:?}: {err}"
        );
        assert!(err.contains("this host had 0.1 GB"), "{args:?}: {err}");
        assert!(err.lines().count() <= 3, "{args:?}: {err}");
    }
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .env("SEGTUNE_HOST_MEMORY", "600000000")
        .arg("estimate")
        .arg(b0(&shared))
        .args(&estimate[1..7])
        .args(["--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "meta trace: {err}");
    let estimate: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        estimate["cpu_trace_peak_bytes"].as_u64().unwrap() > 100_000_000,
        "the meta trace holds more than the 0.1 GB the CPU trace was refused at: {estimate}"
    );
}

/// A shell script at `dir/name` running `body`, executable.
fn script(dir: &std::path::Path, name: &str, body: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// An `srun` that exits 2 itself (slurmstepd's `chdir` failed; issue 46:
/// every candidate became "error" with an empty reason, exit 0, reused by
/// the next run) is no verdict: the search exits 2 in srun's words, and its
/// journal holds nothing a re-run would reuse.
#[test]
fn an_srun_that_exits_2_itself_is_no_verdict_and_the_search_exits_2() {
    let Some(shared) = common::require_shared("an_srun_that_exits_2_itself_is_no_verdict") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let srun = script(
        dir.path(),
        "srun",
        "echo \"slurmstepd-vm: error: couldn't chdir to \\`/nonexistent': No such file or directory\" >&2\nexit 2",
    );
    let out = dir.path().join("out");
    let started = std::time::Instant::now();
    let output = std::process::Command::new(common::scale::segtune())
        .env("SEGTUNE_SRUN", &srun)
        .env("SEGTUNE_SCANCEL", "true")
        .env("SEGTUNE_SCONTROL", "true")
        .arg("search")
        .arg(b0(&shared))
        .args([
            "--preset",
            "rtx3050ti",
            "--quiet",
            "--device",
            "cpu",
            "--launcher",
            "slurm",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(output.stdout.is_empty(), "{err}");
    assert!(
        err.contains("couldn't chdir to `/nonexistent'") && err.contains("srun exited with code 2"),
        "{err}"
    );
    let rows = common::scale::journal(&out);
    assert!(!rows.is_empty());
    for row in &rows {
        let status = row["record"]["status"].as_str().unwrap();
        assert_eq!(status, "environment", "{row}");
        assert!(!row["record"]["reason"].as_str().unwrap().is_empty());
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(120));
}

/// A Slurm controller that stops answering while a trial's job waits in
/// the queue (issue 46: a silent stall) stops the search within seconds,
/// exit 2, and each job `scancel` could not reach is named with the exact
/// command; nothing of the search is left running.
#[test]
fn a_controller_that_does_not_answer_stops_the_search_and_names_the_jobs() {
    let Some(shared) = common::require_shared("a_controller_that_does_not_answer") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Their sleeps, told apart by a length of their own.
    let marker = format!("sleep {}", 100_000 + std::process::id());
    let srun = script(
        dir.path(),
        "srun",
        &format!("echo 'srun: job 12 queued and waiting for resources' >&2\nexec {marker}"),
    );
    let scontrol = script(
        dir.path(),
        "scontrol",
        "echo 'Slurmctld(primary) at vm is DOWN'\nexit 1",
    );
    let scancel = script(dir.path(), "scancel", &format!("exec {marker}"));
    let out = dir.path().join("out");
    let started = std::time::Instant::now();
    let output = std::process::Command::new(common::scale::segtune())
        .env("SEGTUNE_SRUN", &srun)
        .env("SEGTUNE_SCANCEL", &scancel)
        .env("SEGTUNE_SCONTROL", &scontrol)
        .env("SEGTUNE_SLURM_CHECK_S", "1")
        .arg("search")
        .arg(b0(&shared))
        .args([
            "--preset",
            "rtx3050ti",
            "--quiet",
            "--device",
            "cpu",
            "--launcher",
            "slurm",
        ])
        .args(["--max-parallel", "2", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        took < std::time::Duration::from_secs(30),
        "took {took:?}: {err}"
    );
    assert!(
        err.contains("does not answer") && err.contains("Slurmctld(primary) at vm is DOWN"),
        "{err}"
    );
    assert!(
        err.contains("cancel it with: scancel --name=segtune-"),
        "{err}"
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    let left = common::scale::processes_mentioning(&marker);
    assert!(left.is_empty(), "left running: {left:?}");
}
