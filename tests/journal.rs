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

/// Issue 46: a search into an `--out` whose journal was written with other
/// inputs (another compute capability) evaluates its candidates again,
/// says what differs, and equals a fresh search; a hand-edited row fails
/// its checksum and is not trusted.
#[test]
fn a_journal_of_other_inputs_is_run_again_and_said() {
    let Some(shared) = common::require_shared("a_journal_of_other_inputs_is_run_again_and_said")
    else {
        return;
    };
    let config = b0(&shared);
    let dir = tempfile::tempdir().unwrap();
    let search = |out: &Path, cc: &str| -> serde_json::Value {
        let run = common::search_command_on(&config, out, &["--vram", "4G"])
            .args(["--compute-capability", cc, "--json"])
            .timeout(std::time::Duration::from_secs(300))
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        serde_json::from_slice(&run.stdout).unwrap()
    };
    // The verdicts, not whether this run or the journal gave them.
    let table = |r: &serde_json::Value| {
        let mut t = serde_json::json!([r["winner"], r["feasible"], r["infeasible"]]);
        t[0].as_object_mut().unwrap().remove("ran_now");
        for list in [1, 2] {
            for o in t[list].as_array_mut().unwrap() {
                o.as_object_mut().unwrap().remove("ran_now");
            }
        }
        t
    };
    let out = dir.path().join("one");
    search(&out, "6.1");
    let again = search(&out, "8.6");
    let fresh = search(&dir.path().join("fresh"), "8.6");
    assert_eq!(again["trials_resumed"], 0, "{again}");
    let stale = &again["journal_not_reused"];
    assert!(stale["other_inputs"].as_u64().unwrap() > 0, "{stale}");
    assert_eq!(stale["differences"], "compute capability 6.1, now 8.6");
    assert_eq!(table(&again), table(&fresh));

    // An out-of-memory verdict edited into a fit is not trusted.
    let journal = out.join("trials.jsonl");
    let text = std::fs::read_to_string(&journal).unwrap();
    // The last one: a row of this (8.6) search's.
    let at = text.rfind("\"status\":\"oom\"").unwrap();
    let edited = format!(
        "{}{}",
        &text[..at],
        text[at..].replacen("\"status\":\"oom\"", "\"status\":\"fits\"", 1)
    );
    assert_ne!(edited, text);
    std::fs::write(&journal, edited).unwrap();
    let after = search(&out, "8.6");
    assert_eq!(after["journal_not_reused"]["checksum_failed"], 1, "{after}");
    assert_eq!(after["trials_run"], 1);
    assert_eq!(table(&after), table(&fresh));
}

/// Issue 46: trace-cache entries copied over other keys' files are traced
/// again (the winner is the undisturbed one) and overwritten; a `.failed`
/// marker linked to /etc/passwd is not read.
#[test]
fn copied_over_traces_and_linked_markers_are_not_trusted() {
    let config = common::readme_example();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let search = |out: &str| -> serde_json::Value {
        let run = common::search_command(&config, &dir.path().join(out))
            .arg("--json")
            .arg("--trace-cache")
            .arg(&cache)
            .timeout(std::time::Duration::from_secs(300))
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        serde_json::from_slice(&run.stdout).unwrap()
    };
    let first = search("a");
    let mut entries: Vec<std::path::PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
        .collect();
    entries.sort_by_key(|p| std::fs::metadata(p).unwrap().len());
    assert!(entries.len() >= 3, "{entries:?}");
    let (smallest, rest) = entries.split_first().unwrap();
    let copied = std::fs::read(smallest).unwrap();
    for e in rest {
        std::fs::copy(smallest, e).unwrap();
    }
    // The smallest's own entry gone, a link to /etc/passwd as its marker.
    let marker = smallest.to_string_lossy().replace(".json.gz", ".failed");
    std::fs::remove_file(smallest).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", &marker).unwrap();
    let again = search("b");
    assert_eq!(again["winner"], first["winner"]);
    assert_eq!(again["infeasible"], first["infeasible"]);
    let written = std::fs::read_to_string(dir.path().join("b/trials.jsonl")).unwrap();
    assert!(!written.contains("root:"), "/etc/passwd read as a reason");
    for e in rest {
        assert_ne!(std::fs::read(e).unwrap(), copied, "{e:?} not traced again");
    }
    assert!(smallest.exists(), "the missing trace was traced and stored");
}
