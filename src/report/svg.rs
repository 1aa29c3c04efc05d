//! Small, self-contained SVG charts for `segtune report`: a scatter of
//! points by series over integer x (the batch size), with horizontal
//! reference lines (the budget), and a horizontal bar chart (the breakdown).
//! Every point is one `class="point"` element, so a page can be checked
//! point for point; text is plain SVG `<text>`, no fonts embedded.

use std::fmt::Write;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Colours of the series, in turn.
const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// One point: `y` absent for a row without the figure (drawn as a cross
/// on the top edge).
#[derive(Debug, Clone)]
pub struct Point {
    pub x: f64,
    pub y: Option<f64>,
    /// The tooltip.
    pub title: String,
    pub fits: bool,
    pub winner: bool,
    /// A name drawn beside the point (the tooltip holds the rest).
    pub label: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<Point>,
}

/// A horizontal reference line.
#[derive(Debug, Clone)]
pub struct Line {
    pub y: f64,
    pub label: String,
    pub color: &'static str,
}

#[derive(Debug, Clone)]
pub struct Scatter {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub lines: Vec<Line>,
    /// x from 0 with round ticks (a continuous figure such as mIoU), not
    /// every integer from 1 (the batch size).
    pub continuous_x: bool,
}

/// Escapes text for SVG/HTML.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// About five round tick values from 0 to at least `max`.
fn ticks(max: f64) -> Vec<f64> {
    let max = if max > 0.0 { max } else { 1.0 };
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    (0..)
        .map(|i| i as f64 * step)
        .take_while(|t| *t < max + step)
        .collect()
}

fn number(v: f64) -> String {
    if v == v.round() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn svg_open(out: &mut String, title: &str, height: f64) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12"><title>{}</title><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" font-weight="bold">{}</text>"#,
        escape(title),
        LEFT,
        escape(title)
    );
}

/// A scatter's plot area and the scales into it.
struct Frame {
    x_max: f64,
    y_top: f64,
    plot_w: f64,
    plot_h: f64,
}

impl Frame {
    fn sx(&self, x: f64) -> f64 {
        LEFT + self.plot_w * x / self.x_max
    }

    fn sy(&self, y: f64) -> f64 {
        TOP + self.plot_h * (1.0 - y / self.y_top)
    }
}

/// The scatter as an SVG document.
pub fn scatter(chart: &Scatter) -> String {
    let all = chart.series.iter().flat_map(|s| &s.points);
    let x_max = if chart.continuous_x {
        *ticks(all.clone().map(|p| p.x).fold(1.0, f64::max) * 1.05)
            .last()
            .unwrap_or(&1.0)
    } else {
        all.clone().map(|p| p.x).fold(1.0, f64::max) + 1.0
    };
    let y_max = all
        .filter_map(|p| p.y)
        .chain(chart.lines.iter().map(|l| l.y))
        .fold(0.0, f64::max)
        * 1.08;
    let y_ticks = ticks(y_max);
    let frame = Frame {
        x_max,
        y_top: *y_ticks.last().unwrap_or(&1.0),
        plot_w: WIDTH - LEFT - RIGHT,
        plot_h: HEIGHT - TOP - BOTTOM,
    };
    let mut out = String::new();
    svg_open(&mut out, &chart.title, HEIGHT);
    scatter_axes(&mut out, chart, &frame, &y_ticks);
    for (i, series) in chart.series.iter().enumerate() {
        scatter_series(&mut out, series, i, chart.series.len(), &frame);
    }
    let ly = TOP + 14.0 + 18.0 * chart.series.len() as f64 + 8.0;
    let _ = write!(
        out,
        r##"<text x="{}" y="{ly}" fill="#555">filled: fits; hollow: does not;</text><text x="{}" y="{}" fill="#555">cross on top: no figure; circle fp32, square fp16, diamond bf16</text></svg>"##,
        WIDTH - RIGHT + 14.0,
        WIDTH - RIGHT + 14.0,
        ly + 16.0
    );
    out
}

/// The grid, the ticks, the frame with its labels, and the reference lines.
fn scatter_axes(out: &mut String, chart: &Scatter, frame: &Frame, y_ticks: &[f64]) {
    let (plot_w, plot_h) = (frame.plot_w, frame.plot_h);
    for t in y_ticks {
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{y}" y2="{y}" stroke="#e5e5e5"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            frame.sy(*t) + 4.0,
            number(*t),
            y = frame.sy(*t)
        );
    }
    let x_ticks: Vec<f64> = if chart.continuous_x {
        ticks(frame.x_max)
    } else {
        (1..(frame.x_max as i64)).map(|x| x as f64).collect()
    };
    for x in x_ticks {
        let _ = write!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            frame.sx(x),
            TOP + plot_h + 16.0,
            number(x)
        );
    }
    let _ = write!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/><text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>"##,
        LEFT + plot_w / 2.0,
        HEIGHT - 12.0,
        escape(&chart.x_label),
        TOP + plot_h / 2.0,
        escape(&chart.y_label)
    );
    for line in &chart.lines {
        let _ = write!(
            out,
            r#"<line class="reference" x1="{LEFT}" x2="{}" y1="{y}" y2="{y}" stroke="{c}" stroke-dasharray="6 4" stroke-width="1.5"/><text x="{}" y="{}" fill="{c}" text-anchor="end">{}</text>"#,
            LEFT + plot_w,
            LEFT + plot_w - 4.0,
            frame.sy(line.y) - 4.0,
            escape(&line.label),
            y = frame.sy(line.y),
            c = line.color
        );
    }
}

/// The `i`-th of `count` series: its points (the winner ringed, a missing
/// figure crossed at the top) and its legend entry.
fn scatter_series(out: &mut String, series: &Series, i: usize, count: usize, frame: &Frame) {
    let color = PALETTE[i % PALETTE.len()];
    // Series at the same batch are spread apart, and each precision has its
    // own marker (fp32 circle, fp16 square, bf16 diamond): points of equal
    // memory stay visible side by side.
    let spread = (42.0 / count.max(1) as f64).clamp(1.5, 7.0);
    let dx = (i as f64 - (count as f64 - 1.0) / 2.0) * spread;
    let shape = Marker::of(&series.label);
    for p in &series.points {
        let x = frame.sx(p.x) + dx;
        let title = format!("<title>{}</title>", escape(&p.title));
        match p.y {
            Some(y) => {
                let fill = if p.fits { color } else { "white" };
                let _ = write!(
                    out,
                    "{}",
                    shape.element(
                        &format!(
                            r#"class="point" fill="{fill}" stroke="{color}" stroke-width="2""#
                        ),
                        (x, frame.sy(y)),
                        &title
                    )
                );
                if let Some(label) = &p.label {
                    let _ = write!(
                        out,
                        r##"<text class="point-label" x="{:.1}" y="{:.1}" font-size="10" fill="#444">{}</text>"##,
                        x + 6.0,
                        frame.sy(y) - 4.0,
                        escape(label)
                    );
                }
                if p.winner {
                    let _ = write!(
                        out,
                        r##"<circle class="winner-mark" cx="{x:.1}" cy="{:.1}" r="10" fill="none" stroke="#000" stroke-width="2"/><text x="{:.1}" y="{:.1}" font-weight="bold">winner</text>"##,
                        frame.sy(y),
                        x + 12.0,
                        frame.sy(y) - 8.0
                    );
                }
            }
            None => {
                let y = TOP + 8.0;
                let _ = write!(
                    out,
                    r#"<path class="point missing" d="M{:.1} {:.1} l8 8 m0 -8 l-8 8" stroke="{color}" stroke-width="2">{title}</path>"#,
                    x - 4.0,
                    y - 4.0
                );
            }
        }
    }
    let ly = TOP + 14.0 + 18.0 * i as f64;
    let _ = write!(
        out,
        r#"{}<text x="{}" y="{}">{}</text>"#,
        shape.element(
            &format!(r#"fill="{color}""#),
            (WIDTH - RIGHT + 20.0, ly),
            ""
        ),
        WIDTH - RIGHT + 30.0,
        ly + 4.0,
        escape(&series.label)
    );
}

/// A point's marker, by the precision its series names.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Marker {
    Circle,
    Square,
    Diamond,
}

impl Marker {
    fn of(label: &str) -> Marker {
        if label.split(' ').any(|w| w == "bf16") {
            Marker::Diamond
        } else if label.split(' ').any(|w| w == "fp16") {
            Marker::Square
        } else {
            Marker::Circle
        }
    }

    /// The marker at `(x, y)` with `attributes` and `inner` (a title).
    fn element(self, attributes: &str, (x, y): (f64, f64), inner: &str) -> String {
        match self {
            Marker::Circle => {
                format!(r#"<circle {attributes} cx="{x:.1}" cy="{y:.1}" r="5">{inner}</circle>"#)
            }
            Marker::Square => format!(
                r#"<rect {attributes} x="{:.1}" y="{:.1}" width="9" height="9">{inner}</rect>"#,
                x - 4.5,
                y - 4.5
            ),
            Marker::Diamond => format!(
                r#"<path {attributes} d="M{x:.1} {:.1} l6 6 l-6 6 l-6 -6 z">{inner}</path>"#,
                y - 6.0
            ),
        }
    }
}

/// A horizontal bar per `(label, value)`, largest first as given, with
/// the value written by `format`.
pub fn bars(title: &str, rows: &[(String, f64)], format: &dyn Fn(f64) -> String) -> String {
    let row_h = 22.0;
    let label_w = 360.0;
    let height = TOP + 20.0 + row_h * rows.len() as f64;
    let max = rows.iter().map(|r| r.1).fold(0.0, f64::max).max(1e-9);
    let bar_w = WIDTH - label_w - 110.0;
    let mut out = String::new();
    svg_open(&mut out, title, height);
    for (i, (label, value)) in rows.iter().enumerate() {
        let y = TOP + row_h * i as f64;
        let w = bar_w * value / max;
        let _ = write!(
            out,
            r##"<text x="{}" y="{}" text-anchor="end">{}</text><rect class="bar" x="{label_w}" y="{}" width="{w:.1}" height="{}" fill="{}"/><text x="{}" y="{}">{}</text>"##,
            label_w - 8.0,
            y + 15.0,
            escape(label),
            y + 3.0,
            row_h - 6.0,
            PALETTE[i % PALETTE.len()],
            label_w + w + 6.0,
            y + 15.0,
            escape(&format(*value))
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_maximum() {
        assert_eq!(ticks(4.3), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let small = ticks(0.9);
        assert_eq!(small.len(), 6);
        assert!((small[5] - 1.0).abs() < 1e-9 && (small[1] - 0.2).abs() < 1e-9);
        assert!(ticks(0.0).len() > 1);
    }

    #[test]
    fn every_point_is_one_element_and_the_winner_is_marked() {
        let p = |x: f64, y: Option<f64>, winner: bool| Point {
            x,
            y,
            title: format!("b{x}"),
            fits: y.is_some_and(|y| y < 3.0),
            winner,
            label: None,
        };
        let chart = Scatter {
            title: "memory <GiB>".into(),
            x_label: "batch".into(),
            y_label: "GiB".into(),
            series: vec![Series {
                label: "512x512 fp16".into(),
                points: vec![
                    p(1.0, Some(1.0), false),
                    p(2.0, Some(2.0), true),
                    p(4.0, None, false),
                ],
            }],
            lines: vec![Line {
                y: 3.5,
                label: "usable".into(),
                color: "#d00",
            }],
            continuous_x: false,
        };
        let svg = scatter(&chart);
        assert_eq!(svg.matches(r#"class="point"#).count(), 3);
        assert_eq!(svg.matches("winner-mark").count(), 1);
        assert!(svg.contains("memory &lt;GiB&gt;"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }
}
