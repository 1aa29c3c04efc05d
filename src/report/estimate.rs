//! `segtune estimate`'s text: the predicted peaks, the fixed terms with
//! their sources, whether it fits, and the notes. Every figure says
//! "predicted".

use super::columns;
use crate::predict::Estimate;

fn gib3(bytes: u64) -> String {
    format!("{:.3} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The estimate as text.
pub fn estimate(e: &Estimate) -> String {
    let mut out = format!(
        "predicted for {} ({:.2} GiB), batch {} x {}x{}, amp {}, cudnn_benchmark {}\n",
        e.gpu,
        e.vram_bytes as f64 / (1u64 << 30) as f64,
        e.batch_size,
        e.crop[0],
        e.crop[1],
        e.amp,
        e.cudnn_benchmark
    );
    out.push_str(&format!("  {}\n", in_words(e)));
    let peaks = [
        [
            "predicted least needed (decides an OOM):".to_string(),
            gib3(e.predicted_min_peak_allocated_bytes),
        ],
        [
            "predicted peak allocated (max_memory_allocated):".to_string(),
            format!(
                "{} (range {} to {}; steady state, as MMEngine's log after its first line)",
                gib3(e.predicted_peak_allocated_bytes),
                gib2(e.predicted_peak_allocated_low_bytes),
                gib2(e.predicted_peak_allocated_high_bytes)
            ),
        ],
        [
            "predicted peak reserved  (max_memory_reserved):".to_string(),
            gib3(e.predicted_peak_reserved_bytes),
        ],
        [
            "predicted device memory (reserved + context):".to_string(),
            gib3(e.predicted_device_bytes),
        ],
        [
            "allocator settings (PYTORCH_CUDA_ALLOC_CONF):".to_string(),
            match (&e.alloc_conf, e.default_peak_reserved_bytes) {
                (conf, Some(default)) => format!(
                    "{conf} (peak reserved with the defaults: {})",
                    gib3(default)
                ),
                _ => "defaults".to_string(),
            },
        ],
        [
            "predicted peak phase:".to_string(),
            e.predicted_peak_phase.clone(),
        ],
    ];
    out.push_str(&indent(&columns(peaks)));
    out.push_str("  fixed terms (predicted):\n");
    let terms = e.fixed_terms.iter().map(|t| {
        [
            t.name.to_string(),
            gib3(t.bytes),
            if t.in_allocated {
                "in allocated".to_string()
            } else {
                "outside the allocator".to_string()
            },
            format!("({})", t.source),
        ]
    });
    out.push_str(&indent(&indent(&columns(terms))));
    out.push_str(&format!(
        "  fits in {}: {} (predicted)\n",
        e.gpu,
        if e.fits { "yes" } else { "no" }
    ));
    if let Some(words) = step_time_words(e) {
        out.push_str(&format!("  {words}\n"));
    }
    if let Some(schedule) = &e.speed.predicted_schedule {
        out.push_str(&format!("  {}\n", schedule.words(&e.gpu)));
    }
    for n in &e.notes {
        out.push_str(&format!("  note: {n}\n"));
    }
    out
}

/// "step time: 39 ms per iteration (30 to 53 ms), 405 images/s
/// (predicted)": what MMEngine's log will show as `time` less `data_time`.
pub fn step_time_words(e: &Estimate) -> Option<String> {
    let t = e.speed.predicted_step_time?;
    Some(format!(
        "step time: {} per iteration ({} to {}; `time` less `data_time` in MMEngine's log), {:.1} images/s (predicted)",
        crate::predict::speed::seconds_words(t.step_s),
        crate::predict::speed::seconds_words(t.low_s),
        crate::predict::speed::seconds_words(t.high_s),
        t.images_per_s(e.batch_size)
    ))
}

fn gib2(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
}

/// The two figures in one sentence: what the step needs, and what the
/// user's log will show on this card (with its range and, when cuDNN's
/// workspaces make the difference, why).
pub fn in_words(e: &Estimate) -> String {
    let card = format!(
        "{} ({:.0} GB)",
        e.gpu,
        e.vram_bytes as f64 / (1u64 << 30) as f64
    );
    let mut s = format!(
        "needs {} GiB; on the {card} your log will show about {} GiB",
        gib2(e.predicted_min_peak_allocated_bytes),
        gib2(e.predicted_peak_allocated_bytes)
    );
    let (low, high) = (
        e.predicted_peak_allocated_low_bytes,
        e.predicted_peak_allocated_high_bytes,
    );
    if gib2(high) != gib2(e.predicted_peak_allocated_bytes) || gib2(low) != gib2(high) {
        s.push_str(&format!(" ({} to {})", gib2(low), gib2(high)));
    }
    let workspace_share = e
        .predicted_peak_allocated_bytes
        .saturating_sub(e.predicted_min_peak_allocated_bytes);
    if workspace_share > (16 << 20) {
        s.push_str(if e.cudnn_benchmark {
            ": cuDNN takes free memory for faster convolutions"
        } else {
            ": cuDNN's heuristic algorithms take workspace where it is free"
        });
    }
    // The first log line's figure (cudnn_benchmark's searches, the first
    // step) is not printed: public logs' first `memory:` lines sit far
    // below it (SegFormer-B0 16x256x256 fp16 on a 4090: 1115 MiB logged,
    // 9.7 GiB predicted), so it would mislead more than it tells.
    s.push_str(" (predicted)");
    s
}

/// Every line indented by two spaces (tabled's blank style pads one more).
fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {}\n", l.trim_end()))
        .collect()
}
