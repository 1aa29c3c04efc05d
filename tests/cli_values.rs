//! Every command-line value is checked when it is parsed, before any config
//! is read or any worker starts: a bad one ends with exit code 2, one
//! `error:` line on stderr naming the option and the value, and nothing on
//! stdout. The config path given is never created or touched.

use assert_cmd::Command;

/// Runs `segtune ARGS`; asserts exit 2, empty stdout; returns stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        out.stdout.is_empty(),
        "{args:?}: stdout must be empty, got {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.starts_with("error: "), "{args:?}: {err}");
    assert!(!err.contains("error: error:"), "{args:?}: {err}");
    err
}

/// `trial`, `estimate` and `search` with one bad value each: the option and
/// the reason appear in the message.
#[test]
fn bad_counts_sizes_and_fractions_are_refused_at_parse_time() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("never-read.py");
    let config = config.to_str().unwrap();
    for (args, want) in [
        (
            vec!["trial", config, "--batch-size", "0"],
            "must be at least 1, not 0",
        ),
        (
            vec!["trial", config, "--batch-size", "-3"],
            "must be at least 1, not -3",
        ),
        (
            vec!["trial", config, "--batch-size", "2.5"],
            "`2.5` is not a whole number",
        ),
        (vec!["trial", config, "--accum", "0"], "--accum"),
        (vec!["trial", config, "--steps", "0"], "--steps"),
        (vec!["trial", config, "--threads", "0"], "--threads"),
        (
            vec!["trial", config, "--ignore-fraction", "2"],
            "must be between 0 and 1",
        ),
        (
            vec!["trial", config, "--ignore-fraction", "NaN"],
            "must be between 0 and 1",
        ),
        (
            vec!["trial", config, "--crop", "1x1"],
            "each side must be 32 to 8192 pixels, not 1",
        ),
        (
            vec!["trial", config, "--crop", "99999x99999"],
            "each side must be 32 to 8192 pixels, not 99999",
        ),
        (
            vec!["trial", config, "--crop", "512y512"],
            "is not a crop size",
        ),
        (
            vec!["estimate", config, "--vram", "4G", "--batch-size", "0"],
            "--batch-size",
        ),
        (
            vec!["estimate", config, "--vram", "4G", "--crop", "16x16"],
            "--crop",
        ),
        (
            vec!["search", config, "--vram", "4G", "--margin", "1.5"],
            "must be between 0 and 0.9",
        ),
        (
            vec!["search", config, "--vram", "4G", "--gpus", "0"],
            "--gpus",
        ),
        (
            vec!["search", config, "--vram", "4G", "--trial-timeout", "0"],
            "--trial-timeout",
        ),
    ] {
        let err = refused(&args);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert!(
        !dir.path().join("never-read.py").exists(),
        "the config path is not created"
    );
}

/// A VRAM size must be a finite, positive size below 16 EiB: a typo is not
/// clamped to a huge GPU.
#[test]
fn unusable_vram_sizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // A config of its own, so that the test needs nothing from ../shared.
    let config = dir.path().join("c.py");
    std::fs::write(&config, "model = dict(type='EncoderDecoder')\n").unwrap();
    let config = config.to_str().unwrap();
    for (vram, want) in [
        ("99999999999G", "is beyond any memory size"),
        ("NaN", "is not a memory size"),
        ("infG", "is not a memory size"),
        ("0.1", "must be a positive size"),
        ("-4G", "must be a positive size"),
        ("4X", "unknown unit"),
    ] {
        let err = refused(&["search", config, &format!("--vram={vram}"), "--quiet"]);
        assert!(err.contains(want), "--vram {vram}: {err}");
        assert!(
            err.contains(vram),
            "--vram {vram}: the value is named: {err}"
        );
    }
}
