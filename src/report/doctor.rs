//! `segtune doctor`'s page: what the machine check found, one fact per
//! line, then what to do ("action needed" where segtune cannot work here).

use crate::predict::doctor::Doctor;
use std::fmt::Write;

pub fn doctor(d: &Doctor) -> String {
    let mut out = String::new();
    segtune_and_libtorch(&mut out, d);
    driver_and_gpus(&mut out, d);
    pythons(&mut out, d);
    advice(&mut out, d);
    out
}

/// The build, the libtorch found and the worker's start.
fn segtune_and_libtorch(out: &mut String, d: &Doctor) {
    let b = &d.segtune;
    let _ = writeln!(
        out,
        "segtune {} ({} {} build, {}){}",
        b.version,
        b.kind,
        b.profile,
        b.target,
        b.executable
            .as_deref()
            .map(|e| format!(" at {e}"))
            .unwrap_or_default()
    );
    match (&d.libtorch, &d.libtorch_error) {
        (Some(lib), _) => {
            let _ = writeln!(
                out,
                "libtorch: torch {} at {} ({}); CUDA {}",
                lib.version.as_deref().unwrap_or("(release unknown)"),
                lib.lib_dir.display(),
                lib.source,
                lib.cuda
                    .map_or("none (a CPU build)".into(), |c| c.to_string())
            );
        }
        (None, _) => {
            let _ = writeln!(out, "libtorch: not found (below)");
        }
    }
    match (d.worker_cuda_devices, &d.worker_error) {
        (Some(n), _) => {
            let _ = writeln!(
                out,
                "worker: segtune-torch starts; libtorch sees {n} CUDA device(s)"
            );
        }
        (None, Some(_)) => {
            let _ = writeln!(out, "worker: segtune-torch does not start (below)");
        }
        (None, None) => {}
    }
}

fn driver_and_gpus(out: &mut String, d: &Doctor) {
    match &d.driver {
        Some(driver) => {
            let _ = writeln!(
                out,
                "NVIDIA driver: {}, runs CUDA up to {}",
                driver.version,
                driver
                    .cuda
                    .map_or("(not reported)".into(), |c| c.to_string())
            );
        }
        None => {
            let _ = writeln!(out, "NVIDIA driver: none found (nvidia-smi)");
        }
    }
    if d.gpus.is_empty() {
        let _ = writeln!(out, "GPUs: none");
    }
    for g in &d.gpus {
        let _ = writeln!(
            out,
            "GPU {}: {}, {} MiB, compute capability {}, preset {}",
            g.index,
            g.name,
            g.memory_mib,
            g.compute_capability.as_deref().unwrap_or("(not reported)"),
            g.preset.unwrap_or("none")
        );
    }
}

fn pythons(out: &mut String, d: &Doctor) {
    for p in &d.pythons {
        let listed: Vec<String> = p
            .packages
            .iter()
            .filter_map(|(n, v)| v.as_ref().map(|v| format!("{n} {v}")))
            .collect();
        let _ = writeln!(
            out,
            "Python ({}): {}: {}",
            p.role,
            p.python,
            if !p.answered {
                "did not answer".to_string()
            } else if listed.is_empty() {
                "no torch, no MMSeg".to_string()
            } else {
                listed.join(", ")
            }
        );
    }
    let _ = writeln!(out, "predictions are for PyTorch {}", d.predicts_for_torch);
}

fn advice(out: &mut String, d: &Doctor) {
    if d.advice.is_empty() {
        let _ = writeln!(out, "\nall set: nothing to do");
    }
    for a in &d.advice {
        let _ = writeln!(
            out,
            "\n{}: {}",
            if a.blocking { "action needed" } else { "note" },
            a.text
        );
    }
}
