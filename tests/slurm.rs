//! `segtune search --launcher slurm` on a real one-node Slurm
//! (`scripts/slurm-local`: Debian's munge, slurmctld and slurmd, started
//! here as root): the same winner and table as the local search, every
//! trial its own job (job ids in the journal), never more than
//! `--max-parallel` at once, a trial cancelled with `scancel` reported as
//! such while the search goes on, SIGINT cancelling the search's jobs, and
//! nothing of a search left in `squeue` after it. Where Slurm cannot be
//! started the test says why, and fails under `CI=true`.
//!
//! The tests share one cluster (2 CPUs): they run one at a time.

mod common;

use common::scale::{
    atlas_json, journal, most_at_once, processes_mentioning, search_json, spawn_search, table,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One test at a time on the cluster.
static CLUSTER: Mutex<()> = Mutex::new(());

/// Starts the cluster (idempotent); its `SLURM_CONF`, or why not.
fn cluster() -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm-local");
    let output = Command::new(&script)
        .arg("start")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout.trim().strip_prefix("export SLURM_CONF=") {
        Some(conf) if output.status.success() => Ok(PathBuf::from(conf)),
        _ => Err(format!(
            "scripts/slurm-local start failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
}

/// The cluster's `SLURM_CONF`, or `None` (said) where Slurm cannot start;
/// under `CI=true` that is a failure.
fn require_cluster(test: &str) -> Option<PathBuf> {
    common::require_shared(test)?;
    match cluster() {
        Ok(conf) => {
            // The tests' children (segtune, srun, squeue) find the cluster so.
            std::env::set_var("SLURM_CONF", &conf);
            Some(conf)
        }
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{test}: Slurm is needed and could not be started: {why}")
        }
        Err(why) => {
            eprintln!("{test}: skipped, Slurm could not be started: {why}");
            None
        }
    }
}

fn b0(shared: &Path) -> PathBuf {
    shared.join("mmseg-configs/configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py")
}

/// `squeue`'s jobs (id, name, state) whose name starts with `prefix`.
fn queued(prefix: &str) -> Vec<(String, String, String)> {
    let output = Command::new("squeue")
        .args(["-h", "-o", "%i %j %T"])
        .output()
        .expect("squeue runs");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.into(), f.next()?.into(), f.next()?.into()))
        })
        .filter(|(_, name, _): &(String, String, String)| name.starts_with(prefix))
        .collect()
}

/// Waits until `squeue` lists no job of `prefix` (cancellation is
/// asynchronous: a job completes within Slurm's KillWait).
fn wait_for_no_jobs(prefix: &str) -> Vec<(String, String, String)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let jobs = queued(prefix);
        if jobs.is_empty() || Instant::now() > deadline {
            return jobs;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

const SLURM: [&str; 8] = [
    "--device",
    "cpu",
    "--launcher",
    "slurm",
    "--partition",
    "segtune",
    "--cpus-per-trial",
    "1",
];

#[test]
fn a_search_on_slurm_runs_every_trial_as_its_own_job_and_finds_the_local_winner() {
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_conf) = require_cluster("slurm") else {
        return;
    };
    let shared = common::shared_dir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (local, local_time) = search_json(&b0(&shared), &dir.path().join("local"), &[]);
    let mut args = SLURM.to_vec();
    args.extend(["--max-parallel", "2"]);
    let (slurm, slurm_time) = search_json(&b0(&shared), &dir.path().join("slurm"), &args);
    eprintln!(
        "slurm: local {:.1} s, on Slurm (2 at once) {:.1} s",
        local_time.as_secs_f64(),
        slurm_time.as_secs_f64()
    );
    assert_eq!(table(&slurm), table(&local));
    let rows = journal(&dir.path().join("slurm"));
    assert_eq!(rows.len(), slurm["trials_run"].as_u64().unwrap() as usize);
    let mut jobs: Vec<String> = Vec::new();
    for r in &rows {
        let ids = r["run"]["slurm_jobs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(!ids.is_empty(), "a trial without a Slurm job: {r}");
        jobs.extend(ids.iter().map(|j| j.as_str().unwrap().to_string()));
    }
    let all = jobs.len();
    jobs.sort();
    jobs.dedup();
    assert_eq!(jobs.len(), all, "each trial its own job: {jobs:?}");
    let at_once = most_at_once(&rows);
    assert!(
        at_once <= 2,
        "{at_once} trials at once with --max-parallel 2"
    );
    assert_eq!(at_once, 2, "two slots were used side by side");
    let left = wait_for_no_jobs("segtune-");
    assert!(left.is_empty(), "squeue still lists {left:?}");
}

#[test]
fn a_trial_cancelled_with_scancel_is_reported_and_the_search_goes_on() {
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_conf) = require_cluster("slurm") else {
        return;
    };
    let shared = common::shared_dir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut args = SLURM.to_vec();
    args.extend(["--max-parallel", "1", "--json"]);
    let child = spawn_search(&b0(&shared), &out, &args, true);
    // The second trial's job, once it runs: cancelled by hand.
    let deadline = Instant::now() + Duration::from_secs(300);
    let cancelled = loop {
        assert!(Instant::now() < deadline, "no second job ran within 300 s");
        let running: Vec<_> = queued("segtune-")
            .into_iter()
            .filter(|(_, name, state)| state == "RUNNING" && !name.ends_with("-1"))
            .collect();
        if let Some((id, name, _)) = running.first() {
            let status = Command::new("scancel").arg(id).status().unwrap();
            assert!(status.success());
            break name.clone();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the search went on after {cancelled} was cancelled: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows = journal(&out);
    let said: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| {
            let first = r["run"]["first_failure"].as_str().unwrap_or("");
            let reason = r["record"]["reason"].as_str().unwrap_or("");
            // From srun's or slurmstepd's words, or `scontrol show job`'s
            // state; where neither said, the SIGTERM Slurm sends.
            ["Slurm cancelled", "Slurm terminated"]
                .iter()
                .any(|said| first.contains(said) || reason.contains(said))
        })
        .collect();
    assert_eq!(said.len(), 1, "the cancelled trial says so: {rows:#?}");
    eprintln!(
        "slurm: {cancelled} cancelled: {}",
        said[0]["run"]["first_failure"]
    );
    // Retried once: two jobs for that trial.
    assert_eq!(said[0]["run"]["slurm_jobs"].as_array().unwrap().len(), 2);
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(result["winner"]["candidate"].is_object());
    let left = wait_for_no_jobs("segtune-");
    assert!(left.is_empty(), "squeue still lists {left:?}");
}

#[test]
fn sigint_cancels_the_searchs_jobs_and_the_rerun_resumes() {
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_conf) = require_cluster("slurm") else {
        return;
    };
    let shared = common::shared_dir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut args = SLURM.to_vec();
    args.extend(["--max-parallel", "2"]);
    let mut child = spawn_search(&b0(&shared), &out, &args, false);
    // Interrupted with jobs running after some trials finished.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        assert!(Instant::now() < deadline, "no trial finished in 300 s");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the search ended early"
        );
        if journal(&out).len() >= 2 && !queued("segtune-").is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = child.id();
    // SAFETY: kill(2) of our own child.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let finished = journal(&out).len();
    let left = wait_for_no_jobs("segtune-");
    assert!(left.is_empty(), "squeue still lists {left:?}");
    let needle = format!("segtune-{pid}-");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !processes_mentioning(&needle).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    let workers = processes_mentioning(&needle);
    assert!(workers.is_empty(), "left running: {workers:?}");
    let (again, _) = search_json(&b0(&shared), &out, &args);
    assert_eq!(again["trials_resumed"].as_u64().unwrap() as usize, finished);
    let left = wait_for_no_jobs("segtune-");
    assert!(left.is_empty(), "squeue still lists {left:?}");
}

#[test]
fn inside_an_allocation_every_trial_is_a_job_step_of_it() {
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_conf) = require_cluster("slurm") else {
        return;
    };
    let shared = common::shared_dir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // `salloc` runs segtune with SLURM_JOB_ID set: trials become steps
    // (`srun --exact`) sharing the allocation's 2 CPUs.
    let output = Command::new("salloc")
        .args([
            "--partition",
            "segtune",
            "--cpus-per-task",
            "2",
            "--job-name",
            "segtune-test-alloc",
        ])
        .arg(common::scale::segtune())
        .arg("search")
        .arg(b0(&shared))
        .args(["--preset", "rtx3050ti", "--quiet", "--json", "--out"])
        .arg(&out)
        .args(SLURM)
        .args(["--max-parallel", "2"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows = journal(&out);
    let steps: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r["run"]["slurm_jobs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|j| j.as_str().unwrap().to_string())
        .collect();
    assert_eq!(steps.len(), rows.len(), "one step per trial: {steps:?}");
    let jobs: std::collections::BTreeSet<&str> =
        steps.iter().map(|s| s.split('.').next().unwrap()).collect();
    assert_eq!(jobs.len(), 1, "all steps of the one allocation: {steps:?}");
    assert!(most_at_once(&rows) <= 2);
    let left = wait_for_no_jobs("segtune-");
    assert!(left.is_empty(), "squeue still lists {left:?}");
}

/// `segtune atlas --launcher slurm`: the configs' searches run side by side
/// (`--max-parallel`), every traced step a job of the cluster, and the
/// rows are the local atlas's.
#[test]
fn an_atlas_on_slurm_spreads_its_configs_over_the_cluster() {
    let _one = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(_conf) = require_cluster("slurm atlas") else {
        return;
    };
    let shared = common::shared_dir().unwrap();
    let configs = shared.join("mmseg-configs/configs");
    let files = [
        configs.join("segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py"),
        configs.join("fcn/fcn_r18-d8_4xb2-80k_cityscapes-512x1024.py"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let local = atlas_json(&files, &dir.path().join("local"), &[]);
    let mut args = SLURM.to_vec();
    args.extend(["--max-parallel", "2"]);
    let on_slurm = dir.path().join("slurm");
    let slurm = atlas_json(&files, &on_slurm, &args);
    let settings = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                serde_json::json!([
                    r["name"],
                    r["gpu"],
                    r["status"],
                    r["batch_size"],
                    r["crop"],
                    r["amp"],
                    r["accumulation"],
                    r["device_bytes"]
                ])
            })
            .collect()
    };
    assert_eq!(settings(&slurm), settings(&local));
    let mut jobs: Vec<String> = Vec::new();
    for row in slurm["rows"].as_array().unwrap() {
        let search = on_slurm
            .join("searches")
            .join(row["family"].as_str().unwrap())
            .join(row["name"].as_str().unwrap())
            .join(row["gpu"].as_str().unwrap());
        let trials = journal(&search);
        assert!(!trials.is_empty(), "no journal in {}", search.display());
        for t in &trials {
            let ids = t["run"]["slurm_jobs"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            jobs.extend(ids.iter().filter_map(|j| j.as_str().map(str::to_string)));
        }
    }
    assert!(!jobs.is_empty(), "no traced step ran as a Slurm job");
    let left = wait_for_no_jobs("segtune-");
    assert!(left.is_empty(), "squeue still lists {left:?}");
}
