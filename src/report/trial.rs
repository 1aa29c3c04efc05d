//! `segtune trial`'s text: the status, the model, the candidate and setup,
//! and the measured peaks and step time.

use crate::kinds::{RunMode, TorchVersion};
use crate::trial::{TrialReport, WorkerKind};

/// A short human-readable summary of a trial.
pub fn trial(r: &TrialReport) -> String {
    let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
    let steps = match r.mode {
        RunMode::Train => format!("accumulation {}", r.accumulative_counts),
        RunMode::Infer => "inference (test steps)".to_string(),
    };
    let worker = match r.worker {
        WorkerKind::Native => "",
        WorkerKind::Python => " (Python worker)",
    };
    let mut out = format!(
        "status: {}{worker}\nmodel: {} params ({} trainable)\nbatch {} x {}x{}, amp {}, {steps}, device {}\n",
        r.status.name(),
        r.params_total,
        r.params_trainable,
        r.batch_size,
        r.crop[0],
        r.crop[1],
        r.amp,
        r.device
    );
    if r.torch != TorchVersion::NEWEST || r.gpus > 1 || r.as_cuda {
        out.push_str(&format!(
            "setup: PyTorch {}, {} GPU(s) data-parallel{}\n",
            r.torch,
            r.gpus,
            if r.as_cuda {
                ", standing in for CUDA"
            } else {
                ""
            }
        ));
    }
    if let Some(p) = &r.python {
        out.push_str(&format!(
            "python: {} (torch {}, mmsegmentation {}): MMSeg's own train_step\n",
            p.executable, p.torch, p.mmseg
        ));
    }
    if let Some(m) = &r.message {
        out.push_str(&format!("message: {m}\n"));
    }
    if let Some(p) = r.peak_bytes {
        out.push_str(&format!(
            "peak bytes (CPU tensors, measured steps): {p} ({:.1} MiB)\n",
            mib(p)
        ));
    }
    if let (Some(a), Some(res)) = (r.cuda_peak_allocated_bytes, r.cuda_peak_reserved_bytes) {
        out.push_str(&format!(
            "CUDA peak allocated: {a} ({:.1} MiB), peak reserved: {res} ({:.1} MiB) (measured)\n",
            mib(a),
            mib(res)
        ));
    }
    if let (Some(t), Some(ips)) = (r.step_time_median_s, r.images_per_s) {
        out.push_str(&format!(
            "step time (median): {t:.3} s, {ips:.2} images/s\n"
        ));
    }
    out
}
