//! Hostile configs meet bounded resources: a list that would copy a
//! billion values, nesting deep enough to overflow a stack, a 100 000-term
//! expression and a 50 MB config each end with a limit error naming the
//! file and line (exit 2, nothing on stdout) within seconds and without
//! eating memory, instead of an abort or the kernel's OOM killer.

use assert_cmd::Command;
use std::path::PathBuf;
use std::time::Instant;

mod common;

use common::write;

/// `segtune resolve FILE`: exit 2, empty stdout, the stderr, and the
/// seconds it took.
fn resolve_fails(file: &PathBuf) -> (String, f64) {
    let started = Instant::now();
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("resolve")
        .arg(file)
        .output()
        .unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert!(err.lines().count() <= 24, "one screen:\n{err}");
    (err, seconds)
}

#[test]
fn a_list_that_would_copy_a_billion_values_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let f = write(&d, "big.py", "a = 1\nx = [[0] * 1000000] * 1000\n");
    let (err, seconds) = resolve_fails(&f);
    assert!(err.contains("limit exceeded"), "{err}");
    assert!(err.contains("1000001000 values"), "{err}");
    assert!(err.contains("big.py:2:"), "{err}");
    println!("[[0]*1000000]*1000 refused in {seconds:.2} s");
}

#[test]
fn deep_nesting_and_long_expressions_are_limit_errors_not_aborts() {
    let d = tempfile::tempdir().unwrap();
    for (name, text) in [
        (
            "deep.py",
            format!("x = {}{}\n", "[".repeat(100_000), "]".repeat(100_000)),
        ),
        ("long.py", format!("x = {}\n", vec!["1"; 100_000].join("+"))),
        (
            "calls.py",
            format!("x = {}1{}\n", "abs(".repeat(5_000), ")".repeat(5_000)),
        ),
    ] {
        let f = write(&d, name, &text);
        let (err, seconds) = resolve_fails(&f);
        assert!(
            err.contains("nested more than 100 levels deep"),
            "{name}: {err}"
        );
        assert!(err.contains(&format!("{name}:1:")), "{name}: {err}");
        println!("{name} refused in {seconds:.2} s");
    }
}

#[test]
fn nesting_as_deep_as_real_configs_is_fine() {
    let d = tempfile::tempdir().unwrap();
    let f = write(
        &d,
        "ok.py",
        &format!("x = {}1{}\n", "[".repeat(40), "]".repeat(40)),
    );
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("resolve")
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_50_mb_config_stops_at_the_size_limit_at_once() {
    let d = tempfile::tempdir().unwrap();
    let mut text = String::with_capacity(50 << 20);
    let mut i = 0;
    while text.len() < 50 << 20 {
        text.push_str(&format!("key_{i} = dict(a={i}, b=[1, 2, 3], c='text')\n"));
        i += 1;
    }
    let f = write(&d, "huge.py", &text);
    let (err, seconds) = resolve_fails(&f);
    assert!(err.contains("more than the limit of 4 MiB"), "{err}");
    assert!(err.contains("huge.py"), "{err}");
    println!(
        "a 50 MB config ({i} assignments) stopped with the size-limit error in {seconds:.3} s"
    );
    assert!(seconds < 5.0, "took {seconds} s");
}

#[test]
fn a_config_that_is_a_device_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("zero.py");
    std::os::unix::fs::symlink("/dev/zero", &f).unwrap();
    let (err, _) = resolve_fails(&f);
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn generated_configs_of_many_names_or_keys_stop_at_the_limit_quickly() {
    let d = tempfile::tempdir().unwrap();
    let names: String = (0..20_000).map(|i| format!("k{i} = {i}\n")).collect();
    let keys = format!(
        "d = dict({})\n",
        (0..20_000)
            .map(|i| format!("k{i}={i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let display = format!(
        "d = {{{}}}\n",
        (0..20_000)
            .map(|i| format!("'k{i}': {i}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (name, text, want) in [
        ("names.py", names, "more than 5000 top-level statements"),
        ("keys.py", keys, "this call has more than 5000 arguments"),
        ("display.py", display, "this dict has more than 5000 items"),
    ] {
        let f = write(&d, name, &text);
        let (err, seconds) = resolve_fails(&f);
        assert!(err.contains(want), "{name}: {err}");
        println!("{name}: 20000 names/keys refused in {seconds:.2} s");
    }
}
