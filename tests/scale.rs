//! Trials at scale, here: `--devices cpu,cpu` runs a search's traces on two
//! CPU stand-ins at once and finds the serial search's winner and table;
//! a search stopped with SIGINT leaves no worker behind and its re-run
//! redoes no finished trial. (Slurm: `tests/slurm.rs`.)

mod common;

use common::scale::{
    journal, most_at_once, processes_mentioning, search_json, spawn_search, table,
};
use std::path::Path;
use std::time::{Duration, Instant};

/// SegFormer-B0 for the 3050 Ti: 9 candidates, 3 precisions searched
/// side by side.
fn b0(shared: &Path) -> std::path::PathBuf {
    shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py")
}

#[test]
fn two_cpu_stand_ins_find_the_serial_winner_side_by_side() {
    let Some(shared) = common::require_shared("scale") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (serial, serial_time) = search_json(&b0(&shared), &dir.path().join("one"), &[]);
    let (parallel, parallel_time) = search_json(
        &b0(&shared),
        &dir.path().join("two"),
        &["--devices", "cpu,cpu"],
    );
    eprintln!(
        "scale: serial {:.1} s, two CPU stand-ins {:.1} s ({:.2}x), {} trials",
        serial_time.as_secs_f64(),
        parallel_time.as_secs_f64(),
        parallel_time.as_secs_f64() / serial_time.as_secs_f64(),
        parallel["trials_run"]
    );
    assert_eq!(table(&parallel), table(&serial));
    let rows = journal(&dir.path().join("two"));
    assert_eq!(rows.len(), serial["trials_run"].as_u64().unwrap() as usize);
    let slots: std::collections::BTreeSet<u64> = rows
        .iter()
        .map(|r| r["run"]["slot"].as_u64().unwrap())
        .collect();
    assert_eq!(slots.len(), 2, "both stand-ins ran trials");
    assert_eq!(most_at_once(&rows), 2, "two at once, never more");
}

#[test]
fn an_interrupted_search_leaves_no_worker_and_its_rerun_redoes_nothing() {
    let Some(shared) = common::require_shared("scale") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut child = spawn_search(&b0(&shared), &out, &["--devices", "cpu,cpu"], false);
    let deadline = Instant::now() + Duration::from_secs(300);
    while journal(&out).len() < 2 {
        assert!(Instant::now() < deadline, "no trial finished in 300 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the search ended early"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) of our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let pid = child.id();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "SIGINT exits 130");
    let finished: Vec<serde_json::Value> = journal(&out);
    // A worker's trace goes to segtune's temporary directory, named by its pid.
    let needle = format!("segtune-{pid}-");
    // Workers are killed before segtune exits; a moment for the kernel.
    std::thread::sleep(Duration::from_millis(500));
    let left = processes_mentioning(&needle);
    assert!(left.is_empty(), "left running: {left:?}");
    let (again, _) = search_json(&b0(&shared), &out, &["--devices", "cpu,cpu"]);
    assert_eq!(
        again["trials_resumed"].as_u64().unwrap() as usize,
        finished.len(),
        "every finished trial is taken from the journal"
    );
    let rows = journal(&out);
    let mut keys: Vec<String> = rows.iter().map(|r| r["candidate"].to_string()).collect();
    let all = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), all, "no candidate ran twice: {rows:?}");
}
