//! `segtune report`'s page: a self-contained HTML file (and its charts as
//! SVG files) from a finished search and its journal: memory against batch
//! per crop and precision with the budget, throughput against batch, the
//! winner marked, the winner's predicted peak split into parts, and the
//! search's table. One chart point per journal row.

use super::svg::{self, escape, Line, Point, Scatter, Series};
use crate::predict::breakdown::PeakBreakdown;
use crate::search::journal::JournalRow;
use crate::search::saved::SavedSearch;
use crate::search::Mode;

/// The page and its charts (file name, SVG text).
pub struct ReportPage {
    pub html: String,
    pub svgs: Vec<(&'static str, String)>,
}

const GIB: f64 = (1u64 << 30) as f64;

/// The series a row belongs to: crop, precision, model knobs, and whether
/// it was measured.
fn series_label(row: &JournalRow) -> String {
    let c = &row.candidate;
    let mut label = format!("{}x{} {}", c.crop.0, c.crop.1, c.amp);
    for setting in crate::search::knobs::settings(c.knobs()) {
        label.push_str(&format!(" {}", setting.label()));
    }
    if let Some(mode) = c.test_mode {
        label.push_str(&format!(" {}", mode.label()));
    }
    if row.record.mode == Mode::Measured {
        label.push_str(" measured");
    }
    label
}

/// One chart over the rows: `y` picks the figure. With `above`, a row
/// that does not fit is drawn above that line even where its figure (a
/// replay stopped at the budget) is below it; its title keeps the figure.
fn chart(
    saved: &SavedSearch,
    rows: &[JournalRow],
    (title, y_label): (&str, &str),
    y: &dyn Fn(&JournalRow) -> Option<f64>,
    lines: Vec<Line>,
    above: Option<f64>,
) -> Scatter {
    let winner = saved.result.winner.as_ref();
    let mut series: Vec<Series> = Vec::new();
    for row in rows {
        let c = &row.candidate;
        let label = series_label(row);
        let drawn = match (y(row), above) {
            (Some(v), Some(line)) if !row.record.fits() && v <= line => Some(line * 1.04),
            (v, _) => v,
        };
        let point = Point {
            x: c.batch_size as f64,
            y: drawn,
            title: format!(
                "batch {}, {}x{}, {}, accumulation {}: {} ({}){}",
                c.batch_size,
                c.crop.0,
                c.crop.1,
                c.amp,
                c.accumulation,
                row.record.status.name(),
                row.record.mode.name(),
                y(row).map_or(String::new(), |v| format!(", {v:.2} {y_label}"))
            ),
            fits: row.record.fits(),
            winner: winner
                .is_some_and(|w| w.candidate.key() == c.key() && w.record.mode == row.record.mode),
            label: None,
        };
        match series.iter_mut().find(|s| s.label == label) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                label,
                points: vec![point],
            }),
        }
    }
    Scatter {
        title: title.to_string(),
        x_label: "batch size per GPU".into(),
        y_label: y_label.to_string(),
        series,
        lines,
        continuous_x: false,
    }
}

/// The report of a finished search: `rows` are its journal's rows,
/// `breakdown` the winner's predicted peak, if any.
pub fn page(
    saved: &SavedSearch,
    rows: &[JournalRow],
    breakdown: Option<&PeakBreakdown>,
) -> ReportPage {
    let r = &saved.result;
    let svgs = charts(saved, rows, breakdown);
    let mut html = heading(saved, rows.len());
    for (name, svg) in &svgs {
        let id = name.trim_end_matches(".svg");
        html.push_str(&format!("<h2>{id}</h2><div id=\"{id}\">{svg}</div>\n"));
    }
    html.push_str(&tables(r));
    html.push_str(&format!(
        "<details><summary>the search's text output</summary><pre>{}</pre></details>\n",
        escape(&super::search(r, true))
    ));
    // Lets a headless browser report what it rendered.
    html.push_str(
        "<script>document.body.dataset.points = \
         document.querySelectorAll('#memory .point').length;</script>\n</body></html>\n",
    );
    ReportPage { html, svgs }
}

/// A cell's text, escaped.
fn cell(text: &str) -> String {
    format!("<td>{}</td>", escape(text))
}

fn gib_cell(bytes: Option<u64>) -> String {
    cell(&bytes.map_or("-".to_string(), |b| format!("{:.2}", b as f64 / GIB)))
}

/// The changes from the recipe, the feasible candidates ranked and the
/// infeasible ones with their reason, as HTML tables.
fn tables(r: &crate::search::SearchResult) -> String {
    let mut html = String::from("<h2>changes from your recipe</h2>\n");
    if r.changes.is_empty() {
        html.push_str("<p>None: the recipe fits as it is.</p>\n");
    } else {
        html.push_str("<table class=\"changes\"><tr><th>key</th><th>recipe</th><th>written</th><th>why</th></tr>");
        for c in &r.changes {
            html.push_str(&format!(
                "<tr>{}{}{}{}</tr>",
                cell(&c.key),
                cell(&c.old),
                cell(&c.new),
                cell(&c.why)
            ));
        }
        html.push_str("</table>\n");
    }
    if let Some(schedule) = &r.schedule {
        html.push_str(&format!("<p>Schedule: {}</p>\n", escape(schedule)));
    }
    html.push_str(
        "<h2>table</h2><table class=\"feasible\"><tr><th>rank</th><th>batch</th><th>crop</th>\
         <th>accum</th><th>eff. batch</th><th>amp</th><th>with_cp</th><th>points</th>\
         <th>device GiB</th><th>% budget</th><th>images/s</th><th>how</th></tr>",
    );
    for (i, o) in r.feasible.iter().enumerate() {
        let c = o.candidate;
        html.push_str(&format!(
            "<tr>{}{}{}{}{}{}{}{}{}{}{}{}</tr>",
            cell(&(i + 1).to_string()),
            cell(&c.batch_size.to_string()),
            cell(&format!("{}x{}", c.crop.0, c.crop.1)),
            cell(&c.accumulation.to_string()),
            cell(&c.effective_batch(r.gpus).to_string()),
            cell(c.amp.precision_name()),
            cell(if c.checkpoint { "yes" } else { "-" }),
            cell(
                &c.num_points
                    .map_or("config's".to_string(), |k| k.to_string())
            ),
            gib_cell(o.record.device_bytes),
            cell(&format!(
                "{:.0}%",
                100.0 * o.record.device_bytes.unwrap_or(0) as f64 / r.budget.usable_bytes as f64
            )),
            cell(
                &o.record
                    .images_per_s
                    .map_or("-".into(), |v| format!("{v:.2}"))
            ),
            cell(&match &o.record.alloc_conf {
                Some(conf) => format!("{}, with {conf}", o.record.mode.name()),
                None => o.record.mode.name().to_string(),
            }),
        ));
    }
    html.push_str("</table>\n");
    if !r.infeasible.is_empty() {
        html.push_str(
            "<h2>infeasible</h2><table class=\"infeasible\"><tr><th>batch</th><th>crop</th>\
             <th>amp</th><th>accum</th><th>status</th><th>reason</th><th>how</th></tr>",
        );
        for o in &r.infeasible {
            let c = o.candidate;
            html.push_str(&format!(
                "<tr>{}{}{}{}{}{}{}</tr>",
                cell(&c.batch_size.to_string()),
                cell(&format!("{}x{}", c.crop.0, c.crop.1)),
                cell(c.amp.precision_name()),
                cell(&c.accumulation.to_string()),
                cell(o.record.status.name()),
                cell(o.record.reason.as_deref().unwrap_or("")),
                cell(o.record.mode.name()),
            ));
        }
        html.push_str("</table>\n");
    }
    html
}

/// The page's charts: memory and throughput against batch (the budget
/// lines drawn), and the winner's peak by part.
fn charts(
    saved: &SavedSearch,
    rows: &[JournalRow],
    breakdown: Option<&PeakBreakdown>,
) -> Vec<(&'static str, String)> {
    let b = &saved.result.budget;
    let memory = svg::scatter(&chart(
        saved,
        rows,
        ("Device memory at the peak", "GiB"),
        &|row| row.record.device_bytes.map(|v| v as f64 / GIB),
        vec![
            Line {
                y: b.usable_bytes as f64 / GIB,
                label: format!("usable {:.2} GiB", b.usable_bytes as f64 / GIB),
                color: "#d62728",
            },
            Line {
                y: b.vram_bytes as f64 / GIB,
                label: format!("VRAM {:.2} GiB", b.vram_bytes as f64 / GIB),
                color: "#7f7f7f",
            },
        ],
        Some(b.usable_bytes as f64 / GIB),
    ));
    let throughput = svg::scatter(&chart(
        saved,
        rows,
        ("Throughput", "images/s"),
        &|row| row.record.images_per_s,
        Vec::new(),
        None,
    ));
    let mut svgs = vec![("memory.svg", memory), ("throughput.svg", throughput)];
    if let Some(parts) = breakdown {
        let bars: Vec<(String, f64)> = parts
            .parts
            .iter()
            .map(|p| (p.name.clone(), p.bytes as f64 / (1u64 << 20) as f64))
            .collect();
        svgs.push((
            "breakdown.svg",
            svg::bars("The winner's peak (predicted)", &bars, &|v| {
                format!("{v:.1} MiB")
            }),
        ));
    }
    svgs
}

/// The page up to its charts: the title, the style, the search in words.
fn heading(saved: &SavedSearch, shown_rows: usize) -> String {
    let r = &saved.result;
    let b = &r.budget;
    let mut html =
        String::from("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    html.push_str(&format!(
        "<title>segtune search: {}</title>",
        escape(&r.config)
    ));
    html.push_str(
        "<style>body{font-family:sans-serif;margin:24px;max-width:1100px;color:#222}\
         h1{font-size:22px}h2{font-size:17px;margin-top:28px}\
         pre{background:#f6f6f6;padding:10px;overflow-x:auto;font-size:12px}\
         table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}\
         th{background:#f0f0f0}\
         .figures{color:#555}</style></head>\n<body>\n",
    );
    html.push_str(&format!(
        "<h1>segtune search report</h1><p><b>{}</b> on <b>{}</b>{} ({:.2} GiB, usable {:.2} GiB); \
         recipe batch {} x crop {}x{}, effective batch {}.</p>\
         <p class=\"figures\">Figures are {}: {} journal rows shown, one point each. {}</p>\n",
        escape(&r.config),
        escape(&b.gpu),
        b.gpu_description
            .as_deref()
            .map(|d| format!(" ({})", escape(d)))
            .unwrap_or_default(),
        b.vram_bytes as f64 / GIB,
        b.usable_bytes as f64 / GIB,
        r.recipe.batch_size,
        r.recipe.crop.0,
        r.recipe.crop.1,
        r.recipe.effective_batch,
        match r.mode {
            Mode::Predicted => "predicted from CPU traces (no GPU was used)",
            Mode::Measured => "measured by real trials (rows marked measured) or predicted",
        },
        shown_rows,
        match &r.winner {
            Some(w) => format!(
                "Winner: batch {} x crop {}x{}, {}, accumulation {} ({}).",
                w.candidate.batch_size,
                w.candidate.crop.0,
                w.candidate.crop.1,
                w.candidate.amp,
                w.candidate.accumulation,
                w.record.mode.name()
            ),
            None => "No candidate fits.".into(),
        }
    ));
    html
}
