//! `segtune atlas`'s outputs: `atlas.csv` (one row per config and GPU),
//! `atlas.html` (one self-contained page: the table, sortable by any column
//! and filterable by GPU, family, dataset, "fits" and text; a chart per GPU
//! of published mIoU against the predicted hours to train, each point
//! named), and the summary printed at the end.
//!
//! The page's filters also read the address's fragment
//! (`atlas.html#gpu=rtx3050ti&fits=yes`), and the page says how many rows
//! it shows in `<body data-visible="N">`: a browser test checks a filter
//! through the DOM.

use super::svg::{self, escape, Point, Scatter, Series};
use crate::search::atlas::{Atlas, AtlasRow, AtlasStatus};
use std::collections::BTreeSet;
use std::fmt::Write;

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// The row's settings in a few words (`b4 512x512 bf16 acc4 cp`).
fn settings(r: &AtlasRow) -> String {
    let Some(batch) = r.batch_size else {
        return String::new();
    };
    let mut s = format!("b{batch}");
    if let Some((h, w)) = r.crop {
        let _ = write!(s, " {h}x{w}");
    }
    if let Some(amp) = &r.amp {
        let _ = write!(s, " {amp}");
    }
    if let Some(a) = r.accumulation.filter(|a| *a > 1) {
        let _ = write!(s, " acc{a}");
    }
    if r.checkpoint {
        s.push_str(" with_cp");
    }
    if let Some(p) = r.num_points {
        let _ = write!(s, " points{p}");
    }
    s
}

fn status_name(s: AtlasStatus) -> &'static str {
    match s {
        AtlasStatus::Fits => "fits",
        AtlasStatus::NothingFits => "nothing fits",
        AtlasStatus::Failed => "failed",
    }
}

/// `atlas.csv`: a header and one line per row.
pub fn csv(atlas: &Atlas) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    let _ = w.write_record([
        "config",
        "family",
        "dataset",
        "miou",
        "other_metric",
        "gpu",
        "vram_gib",
        "status",
        "batch_size",
        "crop",
        "amp",
        "accumulation",
        "with_cp",
        "num_points",
        "device_gib",
        "images_per_s",
        "training_hours",
        "mode",
        "reason",
    ]);
    let opt = |v: Option<String>| v.unwrap_or_default();
    for r in &atlas.rows {
        let _ = w.write_record([
            r.config.clone(),
            r.family.clone(),
            opt(r.dataset.clone()),
            opt(r.miou.map(|m| format!("{m}"))),
            opt(r.other_metric.clone()),
            r.gpu.clone(),
            format!("{:.2}", gib(r.vram_bytes)),
            status_name(r.status).to_string(),
            opt(r.batch_size.map(|b| b.to_string())),
            opt(r.crop.map(|(h, w)| format!("{h}x{w}"))),
            opt(r.amp.clone()),
            opt(r.accumulation.map(|a| a.to_string())),
            r.checkpoint.to_string(),
            opt(r.num_points.map(|p| p.to_string())),
            opt(r.device_bytes.map(|b| format!("{:.3}", gib(b)))),
            opt(r.images_per_s.map(|v| format!("{v:.2}"))),
            opt(r.training_hours.map(|h| format!("{h:.2}"))),
            opt(r.mode.map(|m| m.name().to_string())),
            opt(r.reason.clone()),
        ]);
    }
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

/// The summary printed when the atlas is done: per GPU, how many configs
/// fit, and where the files are.
pub fn summary(atlas: &Atlas, out: &std::path::Path) -> String {
    let mut s = format!(
        "atlas: {} configs x {} GPUs = {} rows in {:.1} s ({} reused; trace cache {} hits, {} traced)\n",
        atlas.configs,
        atlas.gpus.len(),
        atlas.rows.len(),
        atlas.seconds,
        atlas.rows_reused,
        atlas.trace_cache_hits,
        atlas.trace_cache_misses
    );
    for g in &atlas.gpus {
        let of = |st: AtlasStatus| {
            atlas
                .rows
                .iter()
                .filter(|r| r.gpu == g.label && r.status == st)
                .count()
        };
        let _ = writeln!(
            s,
            "  {:<18} {:>6.2} GiB: {} fit, {} do not, {} failed",
            g.label,
            gib(g.vram_bytes),
            of(AtlasStatus::Fits),
            of(AtlasStatus::NothingFits),
            of(AtlasStatus::Failed)
        );
    }
    let _ = writeln!(
        s,
        "published results: {} of {} configs have an mIoU{}",
        atlas.configs_with_results,
        atlas.configs,
        if atlas.metafile_errors.is_empty() {
            String::new()
        } else {
            format!(" ({} metafiles unreadable)", atlas.metafile_errors.len())
        }
    );
    let _ = writeln!(
        s,
        "wrote {}/atlas.html, atlas.csv, atlas.json (figures are predicted unless the mode column says measured)",
        out.display()
    );
    s
}

/// The chart of one GPU: published mIoU (y) against the hours its winner
/// takes to train the written schedule on the card (x, predicted), each
/// point named; configs without an mIoU or a training time (nothing fits,
/// an epoch-based loop) are left out (counted).
fn chart(atlas: &Atlas, label: &str) -> (String, usize) {
    let mut fits = Series {
        label: "fits".into(),
        points: Vec::new(),
    };
    let mut left_out = 0;
    for r in atlas.rows.iter().filter(|r| r.gpu == label) {
        let (Some(miou), Some(hours)) = (r.miou, r.training_hours) else {
            left_out += 1;
            continue;
        };
        fits.points.push(Point {
            x: hours,
            y: Some(miou),
            title: format!(
                "{} ({} mIoU {miou}) {}: {:.1} h to train (predicted)",
                r.name,
                r.dataset.as_deref().unwrap_or("?"),
                settings(r),
                hours
            ),
            fits: true,
            winner: false,
            label: Some(r.name.clone()),
        });
    }
    let scatter = Scatter {
        title: format!("{label}: published mIoU against hours to train (predicted)"),
        x_label: "hours to train the written schedule (predicted)".into(),
        y_label: "published mIoU (%)".into(),
        series: vec![fits],
        lines: Vec::new(),
        continuous_x: true,
    };
    (svg::scatter(&scatter), left_out)
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:3px 6px;text-align:left}th{background:#f3f3f3;cursor:pointer;position:sticky;top:0}tr.fits td.status{color:#2ca02c}tr.nothing_fits td.status{color:#d62728}tr.failed td.status{color:#7f7f7f}td.num{text-align:right}#filters{margin:12px 0;display:flex;gap:12px;flex-wrap:wrap;align-items:center}.charts{display:flex;flex-wrap:wrap;gap:16px}";

/// The script: filters (from the controls and the address's fragment) and
/// sorting by a clicked column.
const SCRIPT: &str = r#"
(function () {
  var rows = Array.prototype.slice.call(document.querySelectorAll('#atlas tbody tr'));
  var keys = ['gpu', 'family', 'dataset', 'fits'];
  function value(id) { var e = document.getElementById('f-' + id); return e ? e.value : ''; }
  function apply() {
    var text = value('text').toLowerCase(), shown = 0;
    rows.forEach(function (r) {
      var ok = keys.every(function (k) { var v = value(k); return !v || r.dataset[k] === v; })
        && (!text || r.dataset.config.toLowerCase().indexOf(text) >= 0);
      r.hidden = !ok;
      if (ok) { shown++; }
    });
    document.body.dataset.visible = String(shown);
    document.getElementById('shown').textContent = shown + ' of ' + rows.length + ' rows';
  }
  location.hash.replace(/^#/, '').split('&').forEach(function (part) {
    var kv = part.split('='), e = document.getElementById('f-' + kv[0]);
    if (e && kv.length === 2) { e.value = decodeURIComponent(kv[1]); }
  });
  keys.concat(['text']).forEach(function (k) {
    var e = document.getElementById('f-' + k);
    if (e) { e.addEventListener(k === 'text' ? 'input' : 'change', apply); }
  });
  var order = {};
  Array.prototype.slice.call(document.querySelectorAll('#atlas th')).forEach(function (th, i) {
    th.addEventListener('click', function () {
      var up = order[i] = !order[i], body = document.querySelector('#atlas tbody');
      var numeric = th.dataset.numeric === '1';
      rows.sort(function (a, b) {
        var x = a.children[i].dataset.sort || a.children[i].textContent;
        var y = b.children[i].dataset.sort || b.children[i].textContent;
        var c = numeric ? (parseFloat(x || '-1e300') - parseFloat(y || '-1e300')) : x.localeCompare(y);
        return up ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  apply();
})();
"#;

fn select(id: &str, label: &str, values: &BTreeSet<String>) -> String {
    let mut s = format!("<label>{label} <select id=\"f-{id}\"><option value=\"\">all</option>");
    for v in values {
        let _ = write!(s, "<option value=\"{0}\">{0}</option>", escape(v));
    }
    s.push_str("</select></label>");
    s
}

/// `atlas.html`: one self-contained page.
pub fn page(atlas: &Atlas) -> String {
    let set = |f: &dyn Fn(&AtlasRow) -> String| -> BTreeSet<String> {
        atlas.rows.iter().map(f).filter(|v| !v.is_empty()).collect()
    };
    let mut html = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>segtune atlas</title><style>{STYLE}</style></head><body data-rows=\"{}\" data-visible=\"{}\">",
        atlas.rows.len(),
        atlas.rows.len()
    );
    let _ = write!(
        html,
        "<h1>segtune atlas</h1><p>{} configs on {} GPUs: for each, the best feasible setting as <code>segtune search</code> picks it, or the least memory it needs when nothing fits, beside the published mIoU ({} configs have one). Memory and images/s are <b>predicted</b> from CPU traces unless the mode column says measured.</p>",
        atlas.configs,
        atlas.gpus.len(),
        atlas.configs_with_results
    );
    html.push_str("<div id=\"filters\">");
    html.push_str(&select("gpu", "GPU", &set(&|r| r.gpu.clone())));
    html.push_str(&select("family", "family", &set(&|r| r.family.clone())));
    html.push_str(&select(
        "dataset",
        "dataset",
        &set(&|r| r.dataset.clone().unwrap_or_default()),
    ));
    html.push_str("<label>fits <select id=\"f-fits\"><option value=\"\">all</option><option value=\"yes\">fits</option><option value=\"no\">does not fit</option></select></label>");
    html.push_str("<label>config <input id=\"f-text\" placeholder=\"contains\"></label><span id=\"shown\"></span></div>");
    html.push_str("<table id=\"atlas\"><thead><tr>");
    for (name, numeric) in [
        ("config", false),
        ("family", false),
        ("dataset", false),
        ("mIoU", true),
        ("GPU", false),
        ("status", false),
        ("setting", false),
        ("device GiB", true),
        ("images/s", true),
        ("hours to train", true),
        ("mode", false),
        ("why", false),
    ] {
        let _ = write!(
            html,
            "<th data-numeric=\"{}\">{name}</th>",
            u8::from(numeric)
        );
    }
    html.push_str("</tr></thead><tbody>");
    for r in &atlas.rows {
        let status = match r.status {
            AtlasStatus::Fits => "fits",
            AtlasStatus::NothingFits => "nothing_fits",
            AtlasStatus::Failed => "failed",
        };
        let num = |v: Option<f64>, digits: usize| match v {
            Some(v) => format!("<td class=\"num\" data-sort=\"{v}\">{v:.digits$}</td>"),
            None => "<td class=\"num\" data-sort=\"\"></td>".into(),
        };
        let _ = write!(
            html,
            "<tr class=\"{status}\" data-gpu=\"{}\" data-family=\"{}\" data-dataset=\"{}\" data-fits=\"{}\" data-config=\"{}\"><td>{}</td><td>{}</td><td>{}</td>{}<td>{}</td><td class=\"status\">{}</td><td>{}</td>{}{}{}<td>{}</td><td>{}</td></tr>",
            escape(&r.gpu),
            escape(&r.family),
            escape(r.dataset.as_deref().unwrap_or("")),
            if r.status == AtlasStatus::Fits { "yes" } else { "no" },
            escape(&r.config),
            escape(&r.config),
            escape(&r.family),
            escape(r.dataset.as_deref().unwrap_or("-")),
            match (r.miou, &r.other_metric) {
                (None, Some(other)) => format!(
                    "<td class=\"num\" data-sort=\"\" title=\"no mIoU published\">({})</td>",
                    escape(other)
                ),
                _ => num(r.miou, 2),
            },
            escape(&r.gpu),
            status_name(r.status),
            escape(&settings(r)),
            num(r.device_bytes.map(gib), 2),
            num(r.images_per_s, 1),
            num(r.training_hours, 1),
            r.mode.map_or("", |m| m.name()),
            escape(r.reason.as_deref().unwrap_or("")),
        );
    }
    html.push_str(
        "</tbody></table><h2>Published mIoU against hours to train (predicted)</h2><div class=\"charts\">",
    );
    for g in &atlas.gpus {
        let (svg, left_out) = chart(atlas, &g.label);
        let _ = write!(
            html,
            "<figure id=\"chart-{}\">{svg}<figcaption>{left_out} rows without a published mIoU or a training time (nothing fits, or the loop counts epochs) are not drawn.</figcaption></figure>",
            escape(&g.label)
        );
    }
    let _ = writeln!(html, "</div><script>{SCRIPT}</script></body></html>");
    html
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::atlas::AtlasGpuBudget;

    fn row(name: &str, gpu: &str, status: AtlasStatus, miou: Option<f64>) -> AtlasRow {
        AtlasRow {
            config: format!("segformer/{name}.py"),
            name: name.into(),
            family: "segformer".into(),
            dataset: Some("ADE20K".into()),
            miou,
            other_metric: None,
            gpu: gpu.into(),
            vram_bytes: 4 << 30,
            usable_bytes: 3 << 30,
            status,
            batch_size: (status == AtlasStatus::Fits).then_some(4),
            crop: Some((512, 512)),
            amp: Some("bf16".into()),
            accumulation: Some(4),
            checkpoint: false,
            num_points: None,
            device_bytes: Some(2 << 30),
            images_per_s: Some(20.5),
            training_hours: (status == AtlasStatus::Fits).then_some(6.5),
            mode: Some(crate::search::Mode::Predicted),
            reason: None,
            unjudged: false,
            seconds: 1.0,
        }
    }

    fn atlas() -> Atlas {
        Atlas {
            gpus: vec![AtlasGpuBudget {
                label: "rtx3050ti".into(),
                gpu: "rtx3050ti-laptop".into(),
                vram_bytes: 4 << 30,
                usable_bytes: 3 << 30,
            }],
            configs: 3,
            configs_with_results: 2,
            rows: vec![
                row("b0", "rtx3050ti", AtlasStatus::Fits, Some(37.41)),
                row(
                    "b5, \"big\"",
                    "rtx3050ti",
                    AtlasStatus::NothingFits,
                    Some(49.1),
                ),
                row("odd", "rtx3050ti", AtlasStatus::Failed, None),
            ],
            rows_reused: 0,
            trace_cache_hits: 0,
            trace_cache_misses: 3,
            metafile_errors: Vec::new(),
            notes: Vec::new(),
            seconds: 3.0,
        }
    }

    #[test]
    fn the_csv_quotes_what_needs_it_and_has_a_line_per_row() {
        let text = csv(&atlas());
        let mut reader = ::csv::Reader::from_reader(text.as_bytes());
        let records: Vec<::csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
        assert_eq!(records.len(), 3);
        assert_eq!(&records[1][0], "segformer/b5, \"big\".py");
        assert_eq!(&records[0][7], "fits");
        assert_eq!(&records[0][8], "4");
        assert_eq!(&records[2][3], "");
    }

    #[test]
    fn the_page_has_a_row_per_row_the_filters_and_a_chart_per_gpu() {
        let html = page(&atlas());
        assert_eq!(html.matches("<tr class=").count(), 3);
        assert!(html.contains("data-rows=\"3\""));
        for id in ["f-gpu", "f-family", "f-dataset", "f-fits", "f-text"] {
            assert!(html.contains(&format!("id=\"{id}\"")), "{id}");
        }
        assert!(html.contains("id=\"chart-rtx3050ti\""));
        // The one row with an mIoU and a training time is drawn, named;
        // the two others are not.
        assert_eq!(html.matches("class=\"point\"").count(), 1);
        assert!(html.contains("class=\"point-label\""));
        assert!(html.contains("2 rows without a published mIoU"));
        assert!(html.contains("hours to train"));
        assert!(!html.contains("b5, \"big\"\""), "attribute text is escaped");
    }
}
