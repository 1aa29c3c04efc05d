//! Everything a person reads: the text and tables of `search`, `estimate`,
//! `explain`, `trial`, `inspect` and `presets`, rendered from the typed results of the
//! layers below (their JSON is the same results, serialised). Nothing here
//! computes a figure; it only shows them.

pub mod atlas;
mod doctor;
mod estimate;
mod explain;
mod html;
mod infer;
mod inspect;
mod presets;
mod search;
mod svg;
mod trial;

pub use doctor::doctor;
pub use estimate::estimate;
pub use explain::{explain, why};
pub use html::{page, ReportPage};
pub use inspect::inspect;
pub use presets::{presets, presets_json};
pub use search::{progress_line, search};
pub use trial::trial;

/// Bytes as GiB with two decimals.
fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
}

/// An optional byte count as GiB, `-` when absent.
fn gib_or_dash(bytes: Option<u64>) -> String {
    bytes.map_or("-".into(), gib)
}

/// A table of `rows` under `header`, in the project's one table style:
/// compact (psql's: a rule under the header, none between rows).
fn table<const N: usize>(header: [&str; N], rows: impl IntoIterator<Item = [String; N]>) -> String {
    table_of(header.as_slice(), rows.into_iter().map(|r| r.to_vec()))
}

/// [`table`] with the number of columns known at run time.
fn table_of(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut b = tabled::builder::Builder::default();
    b.push_record(header.iter().copied());
    for row in rows {
        b.push_record(row);
    }
    let mut t = b.build();
    t.with(tabled::settings::Style::psql());
    t.to_string()
}

/// A table without a header row and without borders: aligned columns.
fn columns<const N: usize>(rows: impl IntoIterator<Item = [String; N]>) -> String {
    let mut b = tabled::builder::Builder::default();
    for row in rows {
        b.push_record(row);
    }
    let mut t = b.build();
    t.with(tabled::settings::Style::blank());
    t.to_string()
}

/// The PyTorch a search's figures stand for: predicted for a release (and
/// why that one), or measured with the libtorch segtune links.
pub fn torch_line(r: &crate::search::SearchResult) -> String {
    match r.mode {
        crate::search::Mode::Measured => format!(
            "PyTorch {}: measured with the libtorch segtune links\n",
            crate::kinds::TorchVersion::NEWEST
        ),
        crate::search::Mode::Predicted => format!(
            "{}\n",
            crate::predict::from_config::torch_note(r.torch, &r.torch_source)
        ),
    }
}
