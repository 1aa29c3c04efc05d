//! `segtune search`'s text: the budget and recipe, the ranked table of
//! feasible candidates (and the infeasible ones with `--all`), the trials
//! run or resumed, the winner and what was written.

use super::{gib, gib_or_dash, table_of};
use crate::search::knobs::{self, spec, Knob};
use crate::search::{Mode, SearchResult, Step};

/// The feasible table's columns (`--all`); [`SHORT_COLUMNS`] without it.
/// `points` only where the search lowered Mask2Former's point count.
const FEASIBLE_COLUMNS: [&str; 16] = [
    "rank",
    spec(Knob::BatchSize).column,
    spec(Knob::Crop).column,
    spec(Knob::Accumulation).column,
    "eff. batch",
    spec(Knob::Amp).column,
    spec(Knob::Checkpoint).column,
    spec(Knob::NumPoints).column,
    "allocated GiB",
    "first line GiB",
    "reserved GiB",
    "device GiB",
    "predicted GiB",
    "% budget",
    "images/s",
    "how",
];

/// The columns shown without `--all`: the device total, not allocated and
/// reserved (a measured first step's peak where there is one).
const SHORT_COLUMNS: [usize; 14] = [0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13, 14, 15];

/// The column of [`FEASIBLE_COLUMNS`] that shows the point count.
const POINTS_COLUMN: usize = 7;

/// The column of [`FEASIBLE_COLUMNS`] that shows a measured candidate's
/// prediction.
const PREDICTED_COLUMN: usize = 12;

/// The column of [`FEASIBLE_COLUMNS`] that shows a measured trial's first
/// step (its cuDNN searches).
const FIRST_LINE_COLUMN: usize = 9;

/// Whether some candidate was predicted and then measured (then the table
/// shows the prediction beside the measurement).
fn confirmed_predictions(r: &SearchResult) -> bool {
    r.feasible
        .iter()
        .chain(&r.infeasible)
        .any(|o| o.record.predicted.is_some())
}

/// Whether the search tried a lowered Mask2Former point count (then the
/// tables show the `points` column).
fn lowered_points(r: &SearchResult) -> bool {
    r.feasible
        .iter()
        .chain(&r.infeasible)
        .any(|o| o.candidate.num_points.is_some())
}

/// The `points` cell: the config's count or the lowered one.
fn points_cell(num_points: Option<i64>) -> String {
    num_points.map_or("config's".to_string(), |k| k.to_string())
}

/// The `with_cp` cell: `-`, `yes`, or `yes (+N% time)` with its cost.
fn with_cp_cell(checkpoint: bool, cost: Option<f64>) -> String {
    match (checkpoint, cost) {
        (false, _) => "-".to_string(),
        (true, None) => "yes".to_string(),
        (true, Some(cost)) => format!("yes (+{:.0}% time)", 100.0 * cost),
    }
}

/// The progress line after a decided candidate: what was done for it (a
/// trace for a prediction, a trial for a measurement, or the journal), the
/// candidate and its status, and the counts.
pub fn progress_line(step: &Step) -> String {
    let c = step.candidate;
    let how = match (step.resumed, step.record.mode) {
        (true, _) => "from the journal",
        (false, Mode::Predicted) => "traced",
        (false, Mode::Measured) => "trial",
    };
    let knobs: String = knobs::settings(c.knobs())
        .into_iter()
        .map(|s| format!(" {}", s.label()))
        .collect();
    format!(
        "{how}: batch {} crop {}x{} {}{knobs} -> {} | {} done, at most {} left",
        c.batch_size,
        c.crop.0,
        c.crop.1,
        c.amp,
        step.record.status.name(),
        step.done,
        step.left_at_most
    )
}

/// A note on the candidates that got no verdict (killed, out of the host's
/// memory, past their deadline, each tried twice): the search ranked the
/// rest, so its winner may be below what fits.
pub(super) fn unjudged_note(r: &SearchResult) -> Option<String> {
    let unjudged: Vec<_> = r
        .infeasible
        .iter()
        .filter(|o| !o.record.status.is_verdict())
        .collect();
    let first = unjudged.first()?;
    Some(format!(
        "note: {} candidate(s) got no verdict, for a reason of this machine rather than of the candidate \
         (first: batch {} x {}x{}, {}: {}); the winner may be smaller than what fits: \
         a re-run tries them again\n",
        unjudged.len(),
        first.candidate.batch_size,
        first.candidate.crop.0,
        first.candidate.crop.1,
        first.record.status.name(),
        first.record.reason.as_deref().unwrap_or("no reason given")
    ))
}

/// A note on a report page in `--out` made for an earlier search.
pub(super) fn stale_report_note(r: &SearchResult) -> Option<String> {
    let page = r.stale_report.as_ref()?;
    let dir = std::path::Path::new(page)
        .parent()
        .and_then(|p| p.parent())
        .map_or(String::new(), |d| d.display().to_string());
    Some(format!(
        "note: {page} shows the search saved here before this one; `segtune report {dir}` writes it for this one\n"
    ))
}

/// The result as text: the ranked table, infeasible ones with `all`.
pub fn search(r: &SearchResult, all: bool) -> String {
    if r.run_mode == crate::kinds::RunMode::Infer {
        return super::infer::inference(r, all);
    }
    let mut out = heading(r);
    out.push_str(&recipe_row(r));
    out.push_str(&feasible_table(r, all));
    out.push_str(&infeasible_table(r, all));
    out.push_str(&counts_and_notes(r));
    out.push_str(&winner_lines(r));
    out
}

/// The budget, the PyTorch release and the recipe.
fn heading(r: &SearchResult) -> String {
    let gpus = if r.gpus > 1 {
        format!("{} x ", r.gpus)
    } else {
        String::new()
    };
    let mut out = format!(
        "segtune search: {} on {gpus}{} ({}{} GiB, usable {} GiB after a {:.0}% margin; CUDA context {} GiB)\n",
        r.config,
        r.budget.gpu,
        r.budget
            .gpu_description
            .as_deref()
            .map(|d| format!("{d}, "))
            .unwrap_or_default(),
        gib(r.budget.vram_bytes),
        gib(r.budget.usable_bytes),
        r.budget.margin * 100.0,
        gib(r.budget.cuda_context_bytes)
    );
    out.push_str(&super::torch_line(r));
    out.push_str(&format!(
        "recipe: batch {}, crop {}x{}, {}{}, effective batch {} (from {}); objective {}; {} trials\n",
        r.recipe.batch_size,
        r.recipe.crop.0,
        r.recipe.crop.1,
        r.recipe.amp.precision_name(),
        if r.recipe.accumulation > 1 {
            format!(", accumulation {}", r.recipe.accumulation)
        } else {
            String::new()
        },
        r.recipe.effective_batch,
        r.recipe.effective_batch_source,
        r.objective.name(),
        r.mode.name()
    ));
    if let Some(note) = &r.recipe.name_note {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

/// The user's own recipe as a row: fits or not, and why.
fn recipe_row(r: &SearchResult) -> String {
    let Some(o) = &r.recipe_outcome else {
        return String::new();
    };
    let c = o.candidate;
    let verdict = match o.record.status {
        crate::search::CandidateStatus::Fits => format!(
            "fits, {} GiB on the device ({:.0}% of the usable {} GiB)",
            gib_or_dash(o.record.device_bytes),
            100.0 * o.record.device_bytes.unwrap_or(0) as f64 / r.budget.usable_bytes as f64,
            gib(r.budget.usable_bytes)
        ),
        status => format!(
            "{}{}",
            if status == crate::search::CandidateStatus::Oom {
                "does not fit".to_string()
            } else {
                status.name().to_string()
            },
            o.record
                .reason
                .as_deref()
                .map(|why| format!(": {why}"))
                .unwrap_or_default()
        ),
    };
    format!(
        "your recipe: batch {} x crop {}x{}, {}, accumulation {} (effective batch {}): {} ({})\n",
        c.batch_size,
        c.crop.0,
        c.crop.1,
        c.amp.precision_name(),
        c.accumulation,
        c.effective_batch(r.gpus),
        verdict,
        o.record.mode.name()
    )
}

/// The ranked feasible candidates (the device total only, without `all`),
/// or the sentence that none fits.
fn feasible_table(r: &SearchResult, all: bool) -> String {
    let mut out = String::new();
    if r.feasible.is_empty() {
        out.push_str("no candidate fits this budget.\n");
    } else {
        let rows: Vec<[String; 16]> = r
            .feasible
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let c = o.candidate;
                let device = o.record.device_bytes.unwrap_or(0) as f64;
                [
                    (i + 1).to_string(),
                    c.batch_size.to_string(),
                    format!("{}x{}", c.crop.0, c.crop.1),
                    c.accumulation.to_string(),
                    c.effective_batch(r.gpus).to_string(),
                    c.amp.to_string(),
                    with_cp_cell(c.checkpoint, o.record.checkpoint_cost),
                    points_cell(c.num_points),
                    gib_or_dash(o.record.peak_allocated_bytes),
                    gib_or_dash(o.record.first_interval_allocated_bytes),
                    gib_or_dash(o.record.peak_reserved_bytes),
                    gib_or_dash(o.record.device_bytes),
                    gib_or_dash(o.record.predicted.and_then(|p| p.device_bytes)),
                    format!("{:.0}%", 100.0 * device / r.budget.usable_bytes as f64),
                    o.record
                        .images_per_s
                        .map_or("-".into(), |v| format!("{v:.2}")),
                    match &o.record.alloc_conf {
                        Some(conf) => format!("{}, with {conf}", o.record.mode.name()),
                        None => o.record.mode.name().to_string(),
                    },
                ]
            })
            .collect();
        // Without --all: the device total only (allocated and reserved dropped).
        let shown: Vec<usize> = if all {
            (0..FEASIBLE_COLUMNS.len()).collect()
        } else {
            SHORT_COLUMNS.to_vec()
        }
        .into_iter()
        .filter(|k| lowered_points(r) || *k != POINTS_COLUMN)
        .filter(|k| confirmed_predictions(r) || *k != PREDICTED_COLUMN)
        .filter(|k| {
            *k != FIRST_LINE_COLUMN
                || r.feasible
                    .iter()
                    .any(|o| o.record.first_interval_allocated_bytes.is_some())
        })
        .collect();
        let header: Vec<&str> = shown.iter().map(|k| FEASIBLE_COLUMNS[*k]).collect();
        out.push_str(&table_of(
            &header,
            rows.iter()
                .map(|row| shown.iter().map(|k| row[*k].clone()).collect()),
        ));
        out.push_str(&format!(
            "\ndevice GiB: the peak memory PyTorch's caching allocator reserves plus the CUDA context ({} GiB), \
             what nvidia-smi shows; % budget: of the usable {} GiB{}\n",
            gib(r.budget.cuda_context_bytes),
            gib(r.budget.usable_bytes),
            if all {
                "; allocated GiB: torch.cuda.max_memory_allocated() after the first step (MMEngine's later log lines); first line GiB: the first step's, with cudnn_benchmark's searches; reserved GiB: max_memory_reserved()"
            } else {
                " (--all adds the allocated and reserved peaks)"
            }
        ));
        out.push('\n');
    }
    out
}

/// The infeasible candidates with their reason (`all`), else their count.
fn infeasible_table(r: &SearchResult, all: bool) -> String {
    let mut out = String::new();
    if all && !r.infeasible.is_empty() {
        const INFEASIBLE_COLUMNS: [&str; 9] = [
            spec(Knob::BatchSize).column,
            spec(Knob::Crop).column,
            spec(Knob::Amp).column,
            spec(Knob::Accumulation).column,
            spec(Knob::Checkpoint).column,
            spec(Knob::NumPoints).column,
            "status",
            "reason",
            "how",
        ];
        let rows = r.infeasible.iter().map(|o| {
            let c = o.candidate;
            [
                c.batch_size.to_string(),
                format!("{}x{}", c.crop.0, c.crop.1),
                c.amp.to_string(),
                c.accumulation.to_string(),
                with_cp_cell(c.checkpoint, None),
                points_cell(c.num_points),
                o.record.status.name().to_string(),
                o.record.reason.clone().unwrap_or_default(),
                o.record.mode.name().to_string(),
            ]
        });
        let shown: Vec<usize> = (0..INFEASIBLE_COLUMNS.len())
            .filter(|k| lowered_points(r) || *k != 5)
            .collect();
        out.push_str("infeasible:\n");
        out.push_str(&table_of(
            &shown
                .iter()
                .map(|k| INFEASIBLE_COLUMNS[*k])
                .collect::<Vec<_>>(),
            rows.map(|row| shown.iter().map(|k| row[*k].clone()).collect()),
        ));
        out.push('\n');
    } else if !r.infeasible.is_empty() {
        out.push_str(&format!(
            "{} infeasible candidates (--all lists them with the reason)\n",
            r.infeasible.len()
        ));
    }
    out
}

/// How many trials ran and were resumed, and the notes on what the user
/// should know (candidates without a verdict, a stale report, skipped
/// journal lines, auto_scale_lr).
fn counts_and_notes(r: &SearchResult) -> String {
    let mut out = String::new();
    if r.predictions_confirmed_from > 0 {
        out.push_str(&format!(
            "predicted first: {} candidates predicted from CPU traces ({} traces), the best confirmed by real trials from the top down (predicted GiB: the device total predicted for a measured one)\n",
            r.predictions_confirmed_from, r.traces_run
        ));
    }
    out.push_str(&format!(
        "trials: {} run now, {} from the journal ({}), of a grid of {}\n",
        r.trials_run, r.trials_resumed, r.journal, r.grid_size
    ));
    if let Some(note) = unjudged_note(r) {
        out.push_str(&note);
    }
    if let Some(note) = stale_report_note(r) {
        out.push_str(&note);
    }
    if r.journal_skipped_lines > 0 {
        out.push_str(&format!(
            "note: {} line(s) of the journal were not trial records (torn by a killed run, or foreign) and were skipped\n",
            r.journal_skipped_lines
        ));
    }
    out.push_str(&journal_not_reused_notes(&r.journal_not_reused));
    if r.auto_scale_lr {
        out.push_str("note: no batch size keeps the recipe's effective batch; auto_scale_lr is enabled in the emitted config\n");
    }
    out
}

/// The winner, what was written and how to train it.
fn winner_lines(r: &SearchResult) -> String {
    let mut out = String::new();
    if let Some(w) = &r.winner {
        out.push_str(&format!(
            "winner: batch {} x crop {}x{}, amp {}, accumulation {}{}{} ({})\n",
            w.candidate.batch_size,
            w.candidate.crop.0,
            w.candidate.crop.1,
            w.candidate.amp,
            w.candidate.accumulation,
            if w.candidate.checkpoint {
                ", gradient checkpointing (with_cp)"
            } else {
                ""
            },
            w.candidate
                .num_points
                .map(|k| format!(", {k} mask-loss points"))
                .unwrap_or_default(),
            w.record.mode.name()
        ));
        if !r.emitted.iter().any(|p| p.ends_with("training_args.json")) {
            out.push_str(&crate::search::changes_words(&r.changes));
            out.push('\n');
            if let Some(schedule) = &r.schedule {
                out.push_str(&format!("schedule: {schedule}\n"));
            }
        }
        for p in &r.emitted {
            out.push_str(&format!("wrote {p}\n"));
        }
        if let Some(o) = &r.cfg_options {
            out.push_str(&format!("tools/train.py equivalent: {o}\n"));
        }
        if let Some(args) = r.emitted.iter().find(|p| p.ends_with("training_args.json")) {
            let dir = std::path::Path::new(args)
                .parent()
                .map_or(String::new(), |d| d.display().to_string());
            out.push_str(&format!(
                "transformers: TrainingArguments(**json.load(open(\"{args}\"))) and \
                 SegformerImageProcessor.from_pretrained(\"{dir}\")\n"
            ));
        }
        if let Some(conf) = &w.record.alloc_conf {
            out.push_str(&format!(
                "environment: the winner fits only with PyTorch's allocator set so (predicted); run training with\n  PYTORCH_CUDA_ALLOC_CONF={conf}\n"
            ));
        }
    }
    out
}

/// Notes on journal rows a search did not reuse (other inputs, a failed
/// checksum): their candidates ran again, and the user hears why.
fn journal_not_reused_notes(n: &crate::search::journal::NotReused) -> String {
    let mut out = String::new();
    if n.other_inputs > 0 {
        out.push_str(&format!(
            "note: {} journal row(s) were recorded with other inputs ({}): not reused, run again\n",
            n.other_inputs,
            n.differences.as_deref().unwrap_or("unknown")
        ));
    }
    if n.checksum_failed > 0 {
        out.push_str(&format!(
            "note: {} journal row(s) failed their checksum (edited or damaged) and were ignored\n",
            n.checksum_failed
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::space::{Amp, Candidate};
    use crate::search::{CandidateStatus, TrialRecord};

    #[test]
    fn the_progress_line_says_what_ran_for_which_candidate_and_how_many_are_left() {
        let c = Candidate {
            batch_size: 4,
            crop: (512, 512),
            amp: Amp::Bf16,
            accumulation: 4,
            checkpoint: true,
            num_points: Some(3136),
            test_mode: None,
        };
        let record = TrialRecord::failed(CandidateStatus::Oom, "big".into(), Mode::Measured);
        let line = progress_line(&Step {
            candidate: &c,
            record: &record,
            resumed: false,
            done: 3,
            left_at_most: 7,
        });
        assert_eq!(
            line,
            "trial: batch 4 crop 512x512 bf16 with_cp points 3136 -> oom | 3 done, at most 7 left"
        );
        let predicted = TrialRecord::failed(CandidateStatus::Oom, "big".into(), Mode::Predicted);
        let step = Step {
            candidate: &c,
            record: &predicted,
            resumed: false,
            done: 1,
            left_at_most: 0,
        };
        assert!(progress_line(&step).starts_with("traced: "));
        let resumed = Step {
            resumed: true,
            ..step
        };
        assert!(progress_line(&resumed).starts_with("from the journal: "));
    }
}
