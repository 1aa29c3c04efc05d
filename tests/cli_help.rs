//! What `segtune` tells a user before any config: every subcommand's
//! `--help` ends with examples, and `segtune completions SHELL` prints a
//! completion script that the shell accepts and that knows the subcommands.

use assert_cmd::Command;

const SUBCOMMANDS: [&str; 10] = [
    "resolve",
    "trial",
    "inspect",
    "estimate",
    "explain",
    "search",
    "report",
    "schema",
    "presets",
    "completions",
];

#[test]
fn every_subcommands_help_shows_examples() {
    for sub in SUBCOMMANDS {
        if sub == "schema" {
            continue; // one argument, listed in its usage line
        }
        let out = Command::cargo_bin("segtune")
            .unwrap()
            .args([sub, "--help"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sub}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Example") && text.contains(&format!("segtune {sub}")),
            "{sub} --help has no example:\n{text}"
        );
    }
}

#[test]
fn completion_scripts_parse_and_know_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::cargo_bin("segtune")
            .unwrap()
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8(out.stdout).unwrap();
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell} completion lacks `{sub}`");
        }
        if shell == "bash" {
            // bash -n: parse without running.
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("segtune.bash");
            std::fs::write(&path, &script).unwrap();
            let check = std::process::Command::new("bash")
                .arg("-n")
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                check.status.success(),
                "{}",
                String::from_utf8_lossy(&check.stderr)
            );
        }
    }
    let bad = Command::cargo_bin("segtune")
        .unwrap()
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("bash"));
}
