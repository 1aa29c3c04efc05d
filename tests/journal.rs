//! The search journal and `--out` as a hostile environment leaves them: a
//! journal of random bytes or a device, an `--out` that cannot be written,
//! an unsupported model: each is refused before any trial runs (exit 2, one
//! screen on stderr, nothing on stdout, no file written). The torn-line and
//! lock cases are `search::journal`'s unit tests.

mod common;

use std::path::Path;

fn b0(shared: &Path) -> std::path::PathBuf {
    shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py")
}

/// `segtune search CONFIG --preset rtx3050ti --device cpu --out OUT`:
/// asserts exit 2 and empty stdout, returns stderr.
fn search_refused(config: &Path, out: &Path) -> String {
    let run = common::search_command(config, out)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let err = String::from_utf8(run.stderr).unwrap();
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(run.stdout.is_empty());
    assert!(err.lines().count() <= 24, "{err}");
    err
}

#[test]
fn a_foreign_journal_is_refused_and_left_as_it_was() {
    let Some(shared) = common::require_shared("a_foreign_journal_is_refused_and_left_as_it_was")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("trials.jsonl");
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&journal, &bytes).unwrap();
    let err = search_refused(&b0(&shared), dir.path());
    assert!(err.contains("is not a segtune journal"), "{err}");
    assert_eq!(
        std::fs::read(&journal).unwrap(),
        bytes,
        "the file is untouched"
    );
}

#[test]
fn a_journal_that_is_a_device_is_refused() {
    let Some(shared) = common::require_shared("a_journal_that_is_a_device_is_refused") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("trials.jsonl")).unwrap();
    let err = search_refused(&b0(&shared), dir.path());
    assert!(err.contains("is not a regular file"), "{err}");
}

#[test]
fn an_out_that_cannot_be_written_is_found_before_any_trial() {
    let Some(shared) =
        common::require_shared("an_out_that_cannot_be_written_is_found_before_any_trial")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let started = std::time::Instant::now();
    let err = search_refused(&b0(&shared), &file.join("out"));
    assert!(err.contains("is a file"), "{err}");
    assert!(started.elapsed().as_secs() < 30, "no trial ran");
}

#[test]
fn an_unsupported_model_is_refused_before_any_trial() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("odd.py");
    std::fs::write(
        &config,
        "model = dict(type='EncoderDecoder', backbone=dict(type='NoSuchNet'), \
         decode_head=dict(type='FCNHead', num_classes=2))\n\
         train_dataloader = dict(batch_size=2)\ncrop_size = (512, 512)\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let err = search_refused(&config, &out);
    assert!(err.contains("unknown backbone type `NoSuchNet`"), "{err}");
    assert!(err.contains("segtune supports:"), "{err}");
    assert!(!out.join("trials.jsonl").exists(), "no trial journalled");
}

/// SIGTERM (or Ctrl-C) during a search stops its workers at once and
/// removes their temporary trace files; SIGKILL still takes the workers
/// down with it (PR_SET_PDEATHSIG).
#[test]
fn a_stopped_search_leaves_no_worker_and_no_temporary_file() {
    let Some(shared) =
        common::require_shared("a_stopped_search_leaves_no_worker_and_no_temporary_file")
    else {
        return;
    };
    let workers = |pid: u32| {
        std::process::Command::new("pgrep")
            .args(["-P", &pid.to_string(), "-f", "segtune-torch"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
            .unwrap_or(0)
    };
    for signal in ["-TERM", "-KILL"] {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("segtune"))
            .arg("search")
            .arg(b0(&shared))
            .args([
                "--preset",
                "rtx3050ti",
                "--device",
                "cpu",
                "--quiet",
                "--out",
            ])
            .arg(dir.path().join("out"))
            .env("TMPDIR", &tmp)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        // Wait until a traced step (a worker) is running; segtune's other
        // children (the Python asked for its torch version) do not count.
        let started = std::time::Instant::now();
        while workers(pid) == 0 && started.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(workers(pid) > 0, "{signal}: no worker started");
        let worker_pids: Vec<String> = String::from_utf8_lossy(
            &std::process::Command::new("pgrep")
                .args(["-P", &pid.to_string(), "-f", "segtune-torch"])
                .output()
                .unwrap()
                .stdout,
        )
        .lines()
        .map(str::to_string)
        .collect();
        std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        let status = child.wait().unwrap();
        if signal == "-TERM" {
            assert_eq!(status.code(), Some(143), "{signal}: 128 + SIGTERM");
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        for w in &worker_pids {
            assert!(
                !Path::new(&format!("/proc/{w}")).exists()
                    || std::fs::read_to_string(format!("/proc/{w}/stat"))
                        .is_ok_and(|s| s.contains(") Z ")),
                "{signal}: worker {w} still runs"
            );
        }
        if signal == "-KILL" {
            // A killed segtune cannot clean up; the next one removes what a
            // dead segtune left, and nothing of a live process.
            let live = tmp.join(format!("segtune-{}-keep", std::process::id()));
            std::fs::create_dir(&live).unwrap();
            let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("segtune"))
                .arg("estimate")
                .arg(b0(&shared))
                .args(["--batch-size", "1", "--crop", "64x64", "--vram", "4G"])
                .env("TMPDIR", &tmp)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::remove_dir(&live).unwrap();
        }
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
        assert!(left.is_empty(), "{signal}: temporary files left: {left:?}");
    }
}
