//! `segtune report`: the page of a finished search, rendered by headless
//! Chromium (Debian's `chromium`): it renders, its memory chart has one
//! point per journal row, and a screenshot is left under `target/`.

mod common;

use assert_cmd::Command;
use std::path::Path;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_report_page_renders_one_point_per_journal_row_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("search");
    run(Command::cargo_bin("segtune")
        .unwrap()
        .arg("search")
        .arg(common::readme_example())
        .arg("--out")
        .arg(&out));
    let said = run(Command::cargo_bin("segtune")
        .unwrap()
        .arg("report")
        .arg(&out));
    let journal = std::fs::read_to_string(out.join("trials.jsonl")).unwrap();
    let rows = journal.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(rows >= 3, "{journal}");
    assert!(said.contains(&format!("({rows} journal rows)")), "{said}");
    let report = out.join("report");
    let memory = std::fs::read_to_string(report.join("memory.svg")).unwrap();
    assert_eq!(memory.matches(r#"class="point"#).count(), rows);
    assert_eq!(memory.matches("winner-mark").count(), 1);
    assert!(memory.contains("usable 3.80 GiB"), "the budget line");
    let breakdown = std::fs::read_to_string(report.join("breakdown.svg")).unwrap();
    assert!(breakdown.contains("activations: backbone.stage1"));
    let page = report.join("report.html");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<svg") && html.contains("winner"));

    let Some(browser) = common::chromium() else {
        return;
    };
    let dom = common::headless(
        &browser,
        &["--dump-dom"],
        &format!("file://{}", page.display()),
    );
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains(&format!("data-points=\"{rows}\"")),
        "Chromium rendered another number of points than the {rows} journal rows"
    );
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("segtune-report.png");
    let _ = std::fs::remove_file(&shot);
    let screenshot = format!("--screenshot={}", shot.display());
    let taken = common::headless(
        &browser,
        &[&screenshot, "--window-size=1100,2200"],
        &format!("file://{}", page.display()),
    );
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot at {} ({e}): {}",
            shot.display(),
            String::from_utf8_lossy(&taken.stderr)
        )
    });
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    println!(
        "report screenshot: {} ({} bytes)",
        shot.display(),
        png.len()
    );
}

#[test]
fn a_directory_without_a_finished_search_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("segtune")
        .unwrap()
        .arg("report")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("search.json") && err.contains("segtune search"),
        "{err}"
    );
    assert!(!dir.path().join("report").exists(), "nothing written");
}
