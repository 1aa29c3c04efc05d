//! `segtune explain`'s text: the predicted peak of one training step split
//! into what it holds (parameters, optimizer state, activations by model
//! part, gradients, the batch, workspaces, the allocator's reserve, the
//! CUDA context), each with its share, against the GPU's memory.

use super::{table, table_of};
use crate::predict::breakdown::PeakBreakdown;
use crate::predict::Estimate;
use crate::search::space::Candidate;
use crate::search::SearchResult;

fn gib3(bytes: u64) -> String {
    format!("{:.3}", bytes as f64 / (1u64 << 30) as f64)
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

/// The breakdown as text.
pub fn explain(e: &Estimate) -> String {
    let total = e.breakdown.total();
    let mut out = format!(
        "segtune explain: batch {} x {}x{}, amp {} on {} ({:.2} GiB): every figure predicted\n",
        e.batch_size,
        e.crop[0],
        e.crop[1],
        e.amp,
        e.gpu,
        e.vram_bytes as f64 / (1u64 << 30) as f64
    );
    if let Some(torch) = e
        .notes
        .iter()
        .find(|n| n.starts_with("predicted for PyTorch"))
    {
        out.push_str(torch);
        out.push('\n');
    }
    out.push_str(&super::estimate::in_words(e));
    out.push('\n');
    out.push_str(&format!(
        "at the peak of the step (in the {} phase) the device holds:\n",
        e.predicted_peak_phase
    ));
    let rows = e.breakdown.parts.iter().map(|p| {
        [
            p.name.clone(),
            mib(p.bytes),
            format!("{:.1}%", 100.0 * p.bytes as f64 / total.max(1) as f64),
            if p.in_allocated {
                "allocated"
            } else if p.name == "CUDA context" {
                "outside PyTorch"
            } else {
                "reserved"
            }
            .to_string(),
        ]
    });
    out.push_str(&table(["part", "MiB", "share", "counted in"], rows));
    out.push('\n');
    out.push_str(&format!(
        "total {} GiB of {:.2} GiB: {}\n",
        gib3(total),
        e.vram_bytes as f64 / (1u64 << 30) as f64,
        if e.fits {
            "fits (predicted)".to_string()
        } else {
            format!(
                "does not fit (predicted): {} GiB over",
                gib3(total.saturating_sub(e.vram_bytes))
            )
        }
    ));
    out.push_str(
        "activations: what the forward of each model part still holds at the peak (saved for \
         backward, or outputs in use); with AMP this includes autocast's half-precision copies \
         of the weights the part cast. parameter gradients: the backward's allocations that \
         live into the optimizer step; gradients in flight: the backward's other allocations\n",
    );
    if let Some(t) = e.speed.predicted_step_time {
        out.push_str(&step_time_split(&t, e.batch_size));
        if let Some(schedule) = &e.speed.predicted_schedule {
            out.push_str(&schedule.words(&e.gpu));
            out.push('\n');
        }
    }
    out
}

/// The step time split into forward, backward, optimizer, communication
/// and overhead, each with its share.
fn step_time_split(t: &crate::predict::speed::StepTime, batch: i64) -> String {
    use crate::predict::speed::seconds_words;
    let ms = |s: f64| format!("{:.1}", s * 1e3);
    let share = |s: f64| format!("{:.0}%", 100.0 * s / t.step_s.max(1e-12));
    let parts = [
        (
            "forward (GPU, the data preprocessor and the batch's copy included)",
            t.forward_s,
        ),
        ("backward (GPU)", t.backward_s),
        ("optimizer (GPU, its share per iteration)", t.optimizer_s),
        (
            "communication (DDP all-reduce left exposed)",
            t.communication_s,
        ),
        (
            "overhead (the GPU waiting for the host's dispatch and syncs)",
            t.overhead_s,
        ),
    ];
    let rows = parts
        .iter()
        .map(|(name, s)| [name.to_string(), ms(*s), share(*s)]);
    format!(
        "\nstep time: {} per iteration ({} to {}), {:.1} images/s, {} kernels (predicted):\n{}\n",
        seconds_words(t.step_s),
        seconds_words(t.low_s),
        seconds_words(t.high_s),
        t.images_per_s(batch),
        t.kernels,
        table(["part", "ms", "share"], rows)
    )
}

fn candidate_name(c: &Candidate) -> String {
    format!("batch {} {}x{} {}", c.batch_size, c.crop.0, c.crop.1, c.amp)
}

/// `search --why`: the winner's parts beside the next larger batch's.
pub fn why(
    r: &SearchResult,
    winner: (&Candidate, &PeakBreakdown),
    next: Option<(&Candidate, &PeakBreakdown)>,
) -> String {
    let mut names: Vec<&str> = winner.1.parts.iter().map(|p| p.name.as_str()).collect();
    if let Some((_, b)) = next {
        for p in &b.parts {
            if !names.contains(&p.name.as_str()) {
                names.push(&p.name);
            }
        }
    }
    let bytes = |b: &PeakBreakdown, name: &str| {
        b.parts
            .iter()
            .find(|p| p.name == name)
            .map_or(0, |p| p.bytes)
    };
    let mut header = vec![
        "part (predicted MiB)".to_string(),
        format!("winner: {}", candidate_name(winner.0)),
    ];
    if let Some((c, _)) = next {
        header.push(format!("{} (does not fit)", candidate_name(c)));
    }
    let mut rows: Vec<Vec<String>> = names
        .iter()
        .map(|name| {
            let mut row = vec![name.to_string(), mib(bytes(winner.1, name))];
            if let Some((_, b)) = next {
                row.push(mib(bytes(b, name)));
            }
            row
        })
        .collect();
    let mut total = vec!["total".to_string(), mib(winner.1.total())];
    if let Some((_, b)) = next {
        total.push(mib(b.total()));
    }
    rows.push(total);
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut out = format!(
        "\nwhy (predicted, against the usable {} MiB):\n",
        mib(r.budget.usable_bytes)
    );
    out.push_str(&table_of(&header, rows));
    out.push('\n');
    out
}
