//! Every bad config input ends with exit code 2, a message on stderr that
//! names the file:line (or the value), and nothing on stdout.

use assert_cmd::Command;
use std::path::PathBuf;

mod common;

use common::write;

/// Runs `segtune resolve --format json FILE`.
fn resolve_json(file: &PathBuf) -> std::process::Output {
    Command::cargo_bin("segtune")
        .unwrap()
        .args(["resolve", "--format", "json"])
        .arg(file)
        .output()
        .unwrap()
}

/// Runs `segtune resolve FILE`; asserts exit 2, empty stdout; returns stderr.
fn resolve_fails(file: &PathBuf) -> String {
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("resolve")
        .arg(file)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "exit code; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "stdout must be empty, got {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.lines().count() <= 24, "one screen at most:\n{err}");
    err
}

#[test]
fn syntax_error_points_at_line_and_column() {
    let d = tempfile::tempdir().unwrap();
    let f = write(&d, "syn.py", "a = 1\nb = dict(x=1,, y=2)\n");
    let err = resolve_fails(&f);
    assert!(err.contains("syntax error"), "{err}");
    assert!(err.contains("syn.py:2:14"), "{err}");
    assert!(err.contains("b = dict(x=1,, y=2)"), "{err}");
}

#[test]
fn missing_base_names_the_file() {
    let d = tempfile::tempdir().unwrap();
    let f = write(&d, "child.py", "_base_ = ['./nope.py']\n");
    let err = resolve_fails(&f);
    assert!(err.contains("base config `./nope.py` not found"), "{err}");
    assert!(err.contains("child.py:1:"), "{err}");
}

#[test]
fn base_cycle_names_the_cycle() {
    let d = tempfile::tempdir().unwrap();
    let a = write(&d, "a.py", "_base_ = './b.py'\n");
    write(&d, "b.py", "_base_ = './c.py'\n");
    write(&d, "c.py", "_base_ = './a.py'\n");
    let err = resolve_fails(&a);
    assert!(err.contains("cycle"), "{err}");
    let line = err.lines().next().unwrap();
    let order: Vec<usize> = ["a.py", "b.py", "c.py"]
        .iter()
        .map(|n| line.find(n).expect(n))
        .collect();
    assert!(order[0] < order[1] && order[1] < order[2], "{line}");
    assert!(line.trim_end().ends_with("a.py"), "{line}");
}

#[test]
fn self_inheritance_is_a_cycle() {
    let d = tempfile::tempdir().unwrap();
    let a = write(&d, "a.py", "_base_ = './a.py'\n");
    assert!(resolve_fails(&a).contains("cycle"));
}

#[test]
fn duplicate_keys_across_bases_are_named() {
    let d = tempfile::tempdir().unwrap();
    write(&d, "b1.py", "a = 1\nnorm_cfg = dict(type='BN')\n");
    write(&d, "b2.py", "norm_cfg = dict(type='SyncBN')\nz = 2\n");
    let f = write(&d, "child.py", "_base_ = ['./b1.py', './b2.py']\n");
    let err = resolve_fails(&f);
    assert!(
        err.contains("Duplicate key") && err.contains("`norm_cfg`"),
        "{err}"
    );
    assert!(!err.contains("`a`") && !err.contains("`z`"), "{err}");
}

#[test]
fn dict_over_base_list_names_the_key() {
    let d = tempfile::tempdir().unwrap();
    write(
        &d,
        "base.py",
        "train_pipeline = [dict(type='LoadImageFromFile')]\n",
    );
    let f = write(
        &d,
        "child.py",
        "_base_ = './base.py'\nx = 1\ntrain_pipeline = dict(type='Resize')\n",
    );
    let err = resolve_fails(&f);
    assert!(
        err.contains("`train_pipeline` is a dict in the child config but a list"),
        "{err}"
    );
    assert!(err.contains("child.py:3:1"), "{err}");
    assert!(err.contains("_delete_=True"), "{err}");
}

#[test]
fn unsupported_construct_is_named_with_its_line() {
    let d = tempfile::tempdir().unwrap();
    for (src, what, line) in [
        ("x = 1\ny = lambda: 2\n", "`lambda`", 2),
        ("import os\n", "`import`", 1),
        ("a = 1\nif a:\n    b = 2\n", "`if` statement", 2),
        ("a = dict()\na.b = 1\n", "assignment to an attribute", 2),
        ("a = {1, 2}\n", "set", 1),
    ] {
        let f = write(&d, "u.py", src);
        let err = resolve_fails(&f);
        assert!(
            err.contains("unsupported Python construct") && err.contains(what),
            "{src}: {err}"
        );
        assert!(err.contains(&format!("u.py:{line}:")), "{src}: {err}");
    }
}

#[test]
fn rhai_limits_stop_runaway_configs() {
    let d = tempfile::tempdir().unwrap();
    let endless = write(&d, "loop.rhai", "let x = 0;\nloop { x += 1; }\n");
    let err = resolve_fails(&endless);
    assert!(err.contains("operation limit"), "{err}");
    assert!(err.contains("loop.rhai:2:"), "{err}");
    let deep = write(&d, "deep.rhai", "fn f(n) { f(n + 1) }\nlet x = f(0);\n");
    assert!(resolve_fails(&deep).contains("limit"));
    let huge = write(&d, "huge.py", "x = [0] * 10**9\n");
    let err = resolve_fails(&huge);
    assert!(
        err.contains("limit exceeded") && err.contains("huge.py:1:"),
        "{err}"
    );
    let long = write(
        &d,
        "long.rhai",
        "let s = \"x\";\nfor i in 0..40 { s += s; }\n",
    );
    assert!(resolve_fails(&long).contains("limit"));
}

#[test]
fn bad_cfg_option_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let f = write(&d, "a.py", "a = [1]\n");
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .args(["resolve"])
        .arg(&f)
        .args(["--cfg-options", "novalue"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("KEY=VALUE"));
}

#[test]
fn missing_config_file_is_an_error() {
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .args(["resolve", "/nonexistent/x.py"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/x.py"));
}

#[test]
fn a_byte_order_mark_is_named_as_mmengine_refuses_it() {
    let d = tempfile::tempdir().unwrap();
    let f = write(&d, "bom.py", "\u{feff}a = 1\n");
    let err = resolve_fails(&f);
    assert!(err.contains("U+FEFF"), "{err}");
    assert!(err.contains("bom.py:1:1"), "{err}");
    assert!(err.contains("without a byte-order mark"), "{err}");
}

#[test]
fn unicode_identifiers_are_python_identifiers() {
    let d = tempfile::tempdir().unwrap();
    let f = write(&d, "uni.py", "é = 1\nnaïve = dict(größe=é + 1)\n");
    let out = resolve_json(&f);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, serde_json::json!({"é": 1, "naïve": {"größe": 2}}));
}

#[test]
fn rhai_print_and_debug_go_to_stderr() {
    let d = tempfile::tempdir().unwrap();
    let f = write(
        &d,
        "talk.rhai",
        "let x = 1;\ndebug(\"hi\");\nprint(\"p\");\n",
    );
    let out = resolve_json(&f);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, serde_json::json!({"x": 1}));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(":2: \"hi\"") && err.contains('p'), "{err}");
}

#[test]
fn bad_segtune_settings_in_a_config_name_the_setting() {
    let d = tempfile::tempdir().unwrap();
    for (text, want) in [
        ("segtune = 'fast'\n", "`segtune` must be a dict"),
        (
            "segtune = dict(vram='abc')\n",
            "`segtune.vram`: `abc` is not a memory size",
        ),
        (
            "segtune = dict(vram='4G', spped=1)\n",
            "unknown key `segtune.spped`",
        ),
        (
            "segtune = dict(vram='4G', margin=3)\n",
            "`segtune.margin` must be a number",
        ),
        (
            "segtune = dict(vram='4G', gpus=0)\n",
            "`segtune.gpus` must be a whole number",
        ),
    ] {
        let f = write(&d, "s.py", text);
        let out = Command::cargo_bin("segtune")
            .unwrap()
            .arg("search")
            .arg(&f)
            .arg("--quiet")
            .arg("--out")
            .arg(d.path().join("out"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {err}");
        assert!(out.stdout.is_empty());
        assert!(err.contains(want), "{text}: {err}");
        assert!(
            !err.contains("--vram"),
            "{text}: the config is blamed, not --vram: {err}"
        );
        assert!(!d.path().join("out").exists(), "{text}: nothing written");
    }
}

#[test]
fn top_level_names_keep_pythons_binding_order_and_json_stays_strict() {
    let d = tempfile::tempdir().unwrap();
    let f = write(
        &d,
        "order.py",
        "x = 1\ny = float('nan')\nx = 3\nz = float('-inf')\n",
    );
    let out = resolve_json(&f);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    // Strict JSON (no NaN or Infinity tokens), names in first-binding order.
    let v: serde_json::Value = serde_json::from_str(&text).expect("strict JSON");
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["x", "y", "z"], "{text}");
    assert_eq!(v["x"], 3);
    assert_eq!(v["y"], serde_json::json!({"__float__": "nan"}));
    assert_eq!(v["z"], serde_json::json!({"__float__": "-inf"}));
}

#[test]
fn a_bad_base_variable_points_at_its_line() {
    let d = tempfile::tempdir().unwrap();
    write(&d, "base.py", "a = 1\n");
    let f = write(
        &d,
        "child.py",
        "_base_ = './base.py'\nb = 2\nc = {{ _base_.nope }}\n",
    );
    let err = resolve_fails(&f);
    assert!(err.contains("the bases have no `nope`"), "{err}");
    assert!(err.contains("child.py:3:5"), "{err}");
}

/// The first line of `err` names the files in `order`, in that order, and
/// ends where it started.
fn assert_chain(err: &str, order: &[&str]) {
    let line = err.lines().next().unwrap();
    let mut from = 0;
    for name in order {
        let at = line[from..]
            .find(&format!("/{name}"))
            .unwrap_or_else(|| panic!("`{name}` after byte {from} of: {line}"));
        from += at + 1;
    }
    assert!(line.trim_end().ends_with(order[0]), "{line}");
}

#[test]
fn a_rhai_config_importing_itself_is_an_import_cycle() {
    let d = tempfile::tempdir().unwrap();
    let f = write(
        &d,
        "me.rhai",
        "let a = 1;\nimport \"me\" as me;\nlet b = 2;\n",
    );
    let err = resolve_fails(&f);
    assert!(err.starts_with("error: `import` cycle: "), "{err}");
    assert_chain(&err, &["me.rhai", "me.rhai"]);
    assert!(err.contains("me.rhai:2:"), "{err}");
    assert!(err.contains("import \"me\" as me;"), "{err}");
}

#[test]
fn rhai_configs_importing_each_other_are_an_import_cycle() {
    let d = tempfile::tempdir().unwrap();
    let a = write(&d, "a.rhai", "import \"b\" as b;\nlet x = b::y;\n");
    write(
        &d,
        "b.rhai",
        "// b\nimport \"a\" as a;\nexport const y = 1;\n",
    );
    let err = resolve_fails(&a);
    assert!(err.starts_with("error: `import` cycle: "), "{err}");
    assert_chain(&err, &["a.rhai", "b.rhai", "a.rhai"]);
    // The import that closes the cycle.
    assert!(err.contains("b.rhai:2:"), "{err}");
}

/// A cycle through both kinds of edge: an `import` and `_base_` entries
/// of a `.py` config, either way round.
#[test]
fn an_import_that_comes_back_through_python_bases_is_a_cycle() {
    // a.rhai imports m.rhai, whose base c.py lists a.rhai as its base.
    let d = tempfile::tempdir().unwrap();
    let a = write(&d, "a.rhai", "import \"m\" as m;\nlet x = 1;\n");
    write(
        &d,
        "m.rhai",
        "let _base_ = [\"c.py\"];\nexport const y = 2;\n",
    );
    write(&d, "c.py", "z = 3\n_base_ = ['a.rhai']\n");
    let err = resolve_fails(&a);
    assert!(err.starts_with("error: `_base_`/`import` cycle: "), "{err}");
    assert_chain(&err, &["a.rhai", "m.rhai", "c.py", "a.rhai"]);
    assert!(err.contains("c.py:2:"), "{err}");

    // a.rhai inherits c.py, whose base m.rhai imports a.rhai.
    let d = tempfile::tempdir().unwrap();
    let a = write(&d, "a.rhai", "let _base_ = \"c.py\";\nlet x = 1;\n");
    write(&d, "c.py", "_base_ = ['m.rhai']\n");
    write(&d, "m.rhai", "let y = 2;\nimport \"a\" as a;\n");
    let err = resolve_fails(&a);
    assert!(err.starts_with("error: `_base_`/`import` cycle: "), "{err}");
    assert_chain(&err, &["a.rhai", "c.py", "m.rhai", "a.rhai"]);
    assert!(err.contains("m.rhai:2:"), "{err}");
}

/// Runs `segtune resolve FILE` with a time limit (a FIFO must not be
/// opened: that would wait for a writer forever).
fn resolve_fails_quickly(file: &std::path::Path) -> String {
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("resolve")
        .arg(file)
        .timeout(std::time::Duration::from_secs(30))
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    err
}

/// A directory, a FIFO, a symbolic link loop and a missing file, made in `d`.
fn not_config_files(d: &tempfile::TempDir) -> Vec<(&'static str, &'static str)> {
    std::fs::create_dir(d.path().join("dir.py")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(d.path().join("fifo.py"))
        .status()
        .unwrap();
    assert!(made.success());
    std::os::unix::fs::symlink("loop.py", d.path().join("loop.py")).unwrap();
    vec![
        ("dir.py", "is a directory"),
        ("fifo.py", "is a FIFO (named pipe)"),
        ("loop.py", "is a symbolic link loop"),
        ("missing.py", "does not exist"),
    ]
}

#[test]
fn a_base_that_is_not_a_regular_file_says_what_it_is_at_its_line() {
    let d = tempfile::tempdir().unwrap();
    for (name, what) in not_config_files(&d) {
        let child = write(
            &d,
            &format!("child_{name}"),
            &format!("a = 1\n_base_ = ['./{name}']\n"),
        );
        let err = resolve_fails_quickly(&child);
        let first = err.lines().next().unwrap();
        assert!(first.contains(&format!("base config `./{name}`")), "{err}");
        assert!(first.contains(what), "{name}: {err}");
        assert!(err.contains(&format!("child_{name}:2:")), "{err}");
    }
}

#[test]
fn a_config_argument_that_is_not_a_regular_file_says_what_it_is() {
    let d = tempfile::tempdir().unwrap();
    for (name, what) in not_config_files(&d) {
        let err = resolve_fails_quickly(&d.path().join(name));
        let first = err.lines().next().unwrap();
        assert!(first.contains(name) && first.contains(what), "{err}");
    }
}

#[test]
fn slurm_options_without_the_slurm_launcher_and_odd_devices_are_named() {
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .args([
            "search",
            "x.py",
            "--vram",
            "4G",
            "--partition",
            "gpu",
            "--time",
            "10",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--partition, --time apply to Slurm jobs: add --launcher slurm"),
        "{err}"
    );
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .args(["search", "x.py", "--vram", "4G", "--devices", "cpu,cuda:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`--devices cpu,cuda:0`") && err.contains("mixed"),
        "{err}"
    );
}
