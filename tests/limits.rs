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

/// Memory built in many small steps, each under every per-value limit,
/// still stops at the evaluation's budget (the allocator counts it).
#[test]
fn values_built_step_by_step_stop_at_the_memory_budget() {
    let d = tempfile::tempdir().unwrap();
    let many: String = (0..3000)
        .map(|i| format!("a{i} = [0] * 1000000\n"))
        .collect();
    let cases = [
        ("many.py", many, "= [0] * 1000000"),
        (
            "strings.py",
            "a = 'x' * 1000000\nb = [a] * 1000\n".to_string(),
            "b = [a] * 1000",
        ),
        (
            "double.rhai",
            "let s = \"ab\";\nfor i in 0..40 { s += s; }\n".to_string(),
            "for i in 0..40",
        ),
        (
            "pad.rhai",
            "let a = [];\na.pad(100000000, [1, 2, 3]);\n".to_string(),
            "a.pad(100000000",
        ),
        (
            "chars.rhai",
            "let s = \"ab\";\nfor i in 0..26 { s += s; }\nlet c = s.to_chars();\n".to_string(),
            "let c = s.to_chars()",
        ),
        (
            "split.rhai",
            "let s = \"a \";\nfor i in 0..25 { s += s; }\nlet c = s.split(\" \");\n".to_string(),
            "let c = s.split",
        ),
    ];
    for (name, text, line) in cases {
        let f = write(&d, name, &text);
        let (err, seconds) = resolve_fails(&f);
        assert!(
            err.contains("past the config's budget of 256 MiB")
                || err.contains("holds more than 256 MiB"),
            "{name}: {err}"
        );
        assert!(err.contains(line), "{name}: {err}");
        println!("{name} stopped at the memory budget in {seconds:.2} s");
    }
}

/// A Rhai loop that builds a list item by item costs linear time (Rhai's
/// own size checks, which re-measured the list after every push, are off).
#[test]
fn a_rhai_loop_pushing_200k_items_finishes() {
    let d = tempfile::tempdir().unwrap();
    let f = write(
        &d,
        "push.rhai",
        "let a = [];\nfor i in 0..200000 { a.push(i); }\nlet n = a.len();\n",
    );
    let started = Instant::now();
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .args(["resolve", "--format", "json"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"n\": 200000"));
    println!(
        "200000 pushes resolved in {:.2} s",
        started.elapsed().as_secs_f64()
    );
}

/// A closure is not a config value: it is refused where it is bound
/// (it used to vanish from the config without a word).
#[test]
fn a_closure_in_a_rhai_config_is_an_error_at_its_line() {
    let d = tempfile::tempdir().unwrap();
    let f = write(
        &d,
        "closure.rhai",
        "// helpers\nlet y = 2;\nlet scale = |x| x * 2;\n",
    );
    let (err, _) = resolve_fails(&f);
    assert!(err.contains("variable `scale` holds a closure"), "{err}");
    assert!(err.contains("fn scale("), "{err}");
    assert!(err.contains("closure.rhai:3:"), "{err}");
}

#[test]
fn a_config_value_of_two_million_items_is_a_limit_error() {
    let d = tempfile::tempdir().unwrap();
    let f = write(
        &d,
        "chars.rhai",
        "let s = \"ab\"; for i in 0..20 { s += s; } let c = s.to_chars();\n",
    );
    let (err, seconds) = resolve_fails(&f);
    assert!(err.contains("limit exceeded"), "{err}");
    assert!(err.contains("variable `c`"), "{err}");
    assert!(err.contains("more than 1048576 values"), "{err}");
    println!("a 2 097 152-item value refused in {seconds:.2} s");
}

/// A list nested 99 deep resolves; one nested 101 deep is the nesting
/// error (it used to be Rhai's "maximum complexity" from 85 levels on).
#[test]
fn a_99_deep_list_resolves_and_101_deep_is_the_nesting_error() {
    let d = tempfile::tempdir().unwrap();
    let nested = |n: usize| format!("a = 1\nx = {}1{}\n", "[".repeat(n), "]".repeat(n));
    let f = write(&d, "deep99.py", &nested(99));
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .args(["resolve", "--format", "json"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let f = write(&d, "deep101.py", &nested(101));
    let (err, _) = resolve_fails(&f);
    assert!(
        err.starts_with("error: this expression is nested more than 100 levels deep"),
        "{err}"
    );
    assert!(err.contains("deep101.py:2:"), "{err}");
    // A flat chain that Rhai nests (`1 and 1 and ...`) counts the same.
    let f = write(&d, "chain.py", &format!("x = 1{}\n", " and 1".repeat(150)));
    let (err, _) = resolve_fails(&f);
    assert!(err.contains("nested more than 100 levels deep"), "{err}");
}

/// `segtune resolve FILE --cfg-options OPTIONS...`: exit 2, empty stdout,
/// the stderr, and the seconds it took.
fn resolve_with_options_fails(file: &PathBuf, options: &[String]) -> (String, f64) {
    let started = Instant::now();
    let mut cmd = Command::cargo_bin("segtune").unwrap();
    cmd.arg("resolve").arg(file);
    if !options.is_empty() {
        cmd.arg("--cfg-options").args(options);
    }
    let out = cmd.output().unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert!(err.lines().count() <= 24, "one screen:\n{err}");
    (err, seconds)
}

/// A `--cfg-options` key of 5000 levels used to write 100 MB of Python
/// that Python cannot parse; it is bounded as a config's nesting is.
#[test]
fn a_cfg_options_key_deeper_than_100_levels_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let f = write(&d, "small.py", "b = 1\n");
    let key = |levels: usize| vec!["a"; levels].join(".");
    let (err, seconds) = resolve_with_options_fails(&f, &[format!("{}=1", key(5000))]);
    let first = err.lines().next().unwrap();
    assert!(first.contains("--cfg-options key `a.a.a.a"), "{err}");
    assert!(first.contains("5000 levels deep"), "{err}");
    assert!(first.contains("limit of 100 levels"), "{err}");
    assert!(first.len() < 300, "the key is shortened: {first}");
    println!("a 5000-level key refused in {seconds:.2} s");
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .args(["resolve", "--format", "json"])
        .arg(&f)
        .args(["--cfg-options", &format!("{}=1", key(100))])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Five lines of lists of lists sharing one long string hold a few MB
/// while evaluated but would print 1.1 GB (and ten times that abort on a
/// failed allocation): refused at once, from the measure of the shared
/// values, before any copy of them is made.
#[test]
fn shared_lists_that_would_print_a_gigabyte_are_refused_at_once() {
    let d = tempfile::tempdir().unwrap();
    let five = |exponent: u32, ext: &str| -> String {
        let tens = |v: &str| [v; 10].join(", ");
        let (s, let_) = if ext == "py" {
            (format!("s = 'a' * 10**{exponent}"), "")
        } else {
            (
                format!("let s = \"\"; s.pad({}, 'a');", 10u64.pow(exponent)),
                "let ",
            )
        };
        let end = if ext == "py" { "" } else { ";" };
        format!(
            "{s}\n{let_}x = [{}]{end}\n{let_}y = [{}]{end}\n{let_}z = [{}]{end}\n{let_}w = [{}]{end}\n",
            tens("s"),
            tens("x"),
            tens("y"),
            tens("z")
        )
    };
    for (name, text, mib) in [
        ("five.py", five(5, "py"), "about 1060 MiB"),
        ("ten_times.py", five(6, "py"), "about 10597 MiB"),
        ("five.rhai", five(5, "rhai"), "about 1060 MiB"),
        ("ten_times.rhai", five(6, "rhai"), "about 10597 MiB"),
    ] {
        let f = write(&d, name, &text);
        let (err, seconds) = resolve_fails(&f);
        let first = err.lines().next().unwrap();
        assert!(first.starts_with("error: limit exceeded: "), "{err}");
        assert!(first.contains(&format!("{mib} when written")), "{err}");
        assert!(first.contains("past the limit of 64 MiB"), "{err}");
        assert!(first.contains(name), "{err}");
        assert!(err.contains(&format!("{name}:5:")), "{err}");
        println!("{name} refused in {seconds:.2} s");
        assert!(seconds < 10.0, "{name} took {seconds} s");
    }
    // Written with `*` (`x = [s] * 10`), the lists are copies, and the
    // evaluation's budget stops them first.
    let f = write(
        &d,
        "repeat.py",
        "s = 'a' * 10**6\nx = [s] * 10\ny = [x] * 10\nz = [y] * 10\nw = [z] * 10\n",
    );
    let (err, seconds) = resolve_fails(&f);
    assert!(err.contains("limit exceeded"), "{err}");
    println!("repeat.py refused in {seconds:.2} s");
}

/// `--cfg-options` merge after the config is evaluated; the resolved
/// config is measured again after them.
#[test]
fn cfg_options_cannot_take_a_config_past_the_written_limit() {
    use segtune::config::{self, written};
    let d = tempfile::tempdir().unwrap();
    let f = write(&d, "near.py", "s = 'a' * 1000000\nx = [s] * 66\n");
    let cfg = config::resolve(&f, &[]).unwrap_or_else(|e| panic!("{e}"));
    let room = written::MAX_WRITTEN_BYTES - written::written_bytes(&cfg);
    assert!(room < 1 << 20, "{room} bytes of room left");
    let options: Vec<String> = (0..=room / 100_000)
        .map(|i| format!("extra{i}={}", "b".repeat(100_000)))
        .collect();
    let (err, _) = resolve_with_options_fails(&f, &options);
    assert!(err.contains("limit exceeded"), "{err}");
    assert!(err.contains("near.py with its --cfg-options"), "{err}");
    assert!(err.contains("MiB when written"), "{err}");
    assert!(err.contains("past the limit of 64 MiB"), "{err}");
}

/// `x = [x]` line after line nests a value deeper than any expression
/// may; past the same 100 levels it is refused (Python could not read the
/// written config back).
#[test]
fn a_value_built_deeper_than_100_levels_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let text = format!("x = [1]\n{}", "x = [x]\n".repeat(150));
    let f = write(&d, "built.py", &text);
    let (err, _) = resolve_fails(&f);
    assert!(err.contains("limit exceeded"), "{err}");
    assert!(
        err.contains("`x` in ") && err.contains("nests containers 151 levels deep"),
        "{err}"
    );
    assert!(err.contains("limit of 100 levels"), "{err}");
}
