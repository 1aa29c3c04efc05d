//! `segtune search --mode infer`'s text: the budget and the test images,
//! the inference settings that fit ranked by images/s (test batch, whole
//! or slide, precision, device memory), the winner and what was written.

use super::{gib, gib_or_dash, table_of};
use crate::search::space::TestMode;
use crate::search::SearchResult;

/// The result of an inference search as text.
pub fn inference(r: &SearchResult, all: bool) -> String {
    let b = &r.budget;
    let mut out = format!(
        "segtune search --mode infer: {} on {} ({}{} GiB, usable {} GiB after a {:.0}% margin; CUDA context {} GiB)\n",
        r.config,
        b.gpu,
        b.gpu_description
            .as_deref()
            .map(|d| format!("{d}, "))
            .unwrap_or_default(),
        gib(b.vram_bytes),
        gib(b.usable_bytes),
        b.margin * 100.0,
        gib(b.cuda_context_bytes)
    );
    out.push_str(&super::torch_line(r));
    out.push_str(&format!(
        "test images {}x{}, config's test batch {}; objective images/s; every figure {}\n",
        r.recipe.crop.0,
        r.recipe.crop.1,
        r.recipe.batch_size,
        match r.mode {
            crate::search::Mode::Predicted => "predicted (traced test steps)",
            crate::search::Mode::Measured => "measured (real inference trials)",
        }
    ));
    let row = |rank: String, o: &crate::search::Outcome| {
        let c = o.candidate;
        vec![
            rank,
            c.batch_size.to_string(),
            c.test_mode.unwrap_or(TestMode::Whole).label(),
            c.amp.to_string(),
            gib_or_dash(o.record.device_bytes),
            o.record
                .images_per_s
                .map_or("-".into(), |v| format!("{v:.2}")),
            o.record.status.name().to_string(),
        ]
    };
    let header = [
        "rank",
        "test batch",
        "test_cfg",
        "amp",
        "device GiB",
        "images/s",
        "status",
    ];
    if r.feasible.is_empty() {
        out.push_str("no setting fits this budget.\n");
    } else {
        let rows = r
            .feasible
            .iter()
            .enumerate()
            .map(|(i, o)| row((i + 1).to_string(), o));
        out.push_str(&table_of(&header, rows));
        out.push('\n');
    }
    if all && !r.infeasible.is_empty() {
        out.push_str("infeasible:\n");
        out.push_str(&table_of(
            &header,
            r.infeasible.iter().map(|o| row("-".into(), o)),
        ));
        out.push('\n');
    }
    out.push_str(&format!(
        "traces: {} run now, {} from the journal ({})\n",
        r.trials_run, r.trials_resumed, r.journal
    ));
    if let Some(note) = super::search::unjudged_note(r) {
        out.push_str(&note);
    }
    if let Some(note) = super::search::stale_report_note(r) {
        out.push_str(&note);
    }
    if let Some(w) = &r.winner {
        let c = w.candidate;
        out.push_str(&format!(
            "winner: test batch {}, {} inference, amp {} ({})\n",
            c.batch_size,
            c.test_mode.unwrap_or(TestMode::Whole).label(),
            c.amp,
            w.record.mode.name()
        ));
        for p in &r.emitted {
            out.push_str(&format!("wrote {p}\n"));
        }
        if let Some(o) = &r.cfg_options {
            out.push_str(&format!("tools/test.py equivalent: {o}\n"));
        }
    }
    out
}
