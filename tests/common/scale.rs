//! Helpers of the scale tests (`tests/scale.rs`, `tests/slurm.rs`): a
//! search's JSON and time, its journal, how many trials overlapped, and the
//! processes still running.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `search CONFIG --preset rtx3050ti --quiet --out OUT EXTRA...` started,
/// its stdout and stderr piped (to be read) or dropped.
pub fn spawn_search(config: &Path, out: &Path, extra: &[&str], piped: bool) -> std::process::Child {
    let pipe = || {
        if piped {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        }
    };
    Command::new(segtune())
        .arg("search")
        .arg(config)
        .args(["--preset", "rtx3050ti", "--quiet", "--out"])
        .arg(out)
        .args(extra)
        .stdout(pipe())
        .stderr(pipe())
        .spawn()
        .unwrap()
}

pub fn segtune() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("segtune")
}

/// `search --json` with `extra`, its JSON and how long it took.
pub fn search_json(config: &Path, out: &Path, extra: &[&str]) -> (serde_json::Value, Duration) {
    let started = Instant::now();
    let output = Command::new(segtune())
        .arg("search")
        .arg(config)
        .args(["--preset", "rtx3050ti", "--quiet", "--json", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        serde_json::from_slice(&output.stdout).unwrap(),
        started.elapsed(),
    )
}

/// `atlas FILES --preset rtx3050ti --quiet --json --out OUT EXTRA...`'s JSON.
pub fn atlas_json(files: &[std::path::PathBuf], out: &Path, extra: &[&str]) -> serde_json::Value {
    let output = Command::new(segtune())
        .arg("atlas")
        .args(files)
        .args(["--preset", "rtx3050ti", "--quiet", "--json", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The journal's rows.
pub fn journal(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("trials.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The most rows whose [started, ended] intervals overlap at one moment.
pub fn most_at_once(rows: &[serde_json::Value]) -> usize {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for r in rows {
        let run = &r["run"];
        edges.push((run["started_ms"].as_u64().unwrap(), 1));
        edges.push((run["ended_ms"].as_u64().unwrap(), -1));
    }
    // An end before a start at the same millisecond: back to back is not overlap.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

/// The winner and the feasible table of a search's JSON.
pub fn table(result: &serde_json::Value) -> (serde_json::Value, Vec<serde_json::Value>) {
    let rows = result["feasible"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            serde_json::json!([
                o["candidate"],
                o["record"]["status"],
                o["record"]["device_bytes"],
                o["record"]["images_per_s"]
            ])
        })
        .collect();
    (result["winner"]["candidate"].clone(), rows)
}

/// Processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) && !text.contains("/proc") {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}
