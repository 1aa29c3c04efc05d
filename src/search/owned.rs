//! Which files in an `--out` directory segtune wrote, told by their content:
//! segtune replaces its own outputs (an earlier search's `search.json`, its
//! report page, an atlas's tables) and never a file of the user's that has
//! one of their names. Every command that writes into `--out` checks its
//! targets here first, before any trial, so that nothing is written
//! half-way either.

use crate::error::{Error, Result};
use std::io::Read;
use std::path::{Path, PathBuf};

/// How much of a file is read to tell whose it is.
const SNIFF_BYTES: u64 = 8 << 10;

/// The files a command writes into its `--out`, by how segtune's own
/// version of each is recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// `search.json`: a saved search, which segtune reads back.
    SavedSearch,
    /// `atlas.json`: an atlas, read back as one.
    AtlasJson,
    /// `trials.jsonl`: the journal, one record per line.
    Journal,
    /// A page of segtune's (`report/report.html`, `atlas.html`).
    Page,
    /// A chart of the report page (`report/*.svg`).
    Chart,
    /// `atlas.csv`, whose header segtune writes.
    AtlasCsv,
}

impl Output {
    /// Whether `head` (a file's first bytes, `whole` when that is all of
    /// it) is segtune's own version of this output.
    fn is_segtunes(self, head: &str, whole: bool) -> bool {
        let head = head.trim_start_matches('\u{feff}');
        // An empty file holds nothing of anyone's.
        if whole && head.trim().is_empty() {
            return true;
        }
        match self {
            // The result comes first, its budget near its top.
            Output::SavedSearch => {
                head.trim_start().starts_with('{')
                    && head.contains("\"result\"")
                    && head.contains("\"budget\"")
            }
            Output::AtlasJson => head.trim_start().starts_with('{') && head.contains("\"gpus\""),
            Output::Journal => head
                .lines()
                .next()
                .is_none_or(|l| l.starts_with("{\"config_hash\":")),
            Output::Page => head.starts_with("<!doctype html>") && head.contains("<title>segtune "),
            Output::Chart => head.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            Output::AtlasCsv => head.starts_with("config,family,dataset,"),
        }
    }
}

/// Refuses, before anything is written, to replace any of `targets` (a
/// path and what segtune writes there) that exists and is not segtune's:
/// a file of the user's, or something that is not a regular file.
pub fn check_replaceable(out: &Path, targets: &[(PathBuf, Output)]) -> Result<()> {
    for (path, kind) in targets {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        let what = if meta.file_type().is_symlink() {
            Some("is a symbolic link, which is not a regular file".to_string())
        } else if !meta.is_file() {
            Some("is not a regular file".to_string())
        } else {
            match sniff(path) {
                Ok((head, whole)) if kind.is_segtunes(&head, whole) => None,
                Ok(_) => Some(format!(
                    "exists and segtune did not write it (it is not {})",
                    describe(*kind)
                )),
                Err(e) => Some(format!("cannot be read ({e})")),
            }
        };
        if let Some(what) = what {
            return Err(Error::Input(format!(
                "{} {what}; segtune never replaces a file it did not write: move it away or \
                 give another --out (now {})",
                path.display(),
                out.display()
            )));
        }
    }
    Ok(())
}

/// The first bytes of `path` as text, and whether they are the whole file.
fn sniff(path: &Path) -> std::io::Result<(String, bool)> {
    let mut bytes = Vec::new();
    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    file.take(SNIFF_BYTES).read_to_end(&mut bytes)?;
    Ok((
        String::from_utf8_lossy(&bytes).into_owned(),
        len <= SNIFF_BYTES,
    ))
}

fn describe(kind: Output) -> &'static str {
    match kind {
        Output::SavedSearch => "a search segtune saved",
        Output::AtlasJson => "an atlas segtune wrote",
        Output::Journal => "a segtune journal",
        Output::Page => "a page segtune wrote",
        Output::Chart => "a chart segtune drew",
        Output::AtlasCsv => "an atlas table segtune wrote",
    }
}

/// What a search writes into `out` besides its winner's config: the saved
/// search, the journal, and (through `segtune report`) the report page,
/// which a search calls out of date.
pub fn search_outputs(out: &Path) -> Vec<(PathBuf, Output)> {
    vec![
        (out.join(super::saved::SEARCH_FILE), Output::SavedSearch),
        (out.join("trials.jsonl"), Output::Journal),
        (out.join("report").join("report.html"), Output::Page),
    ]
}

/// What `segtune report` writes: the page and its charts.
pub fn report_outputs(out: &Path, charts: &[&str]) -> Vec<(PathBuf, Output)> {
    let dir = out.join("report");
    let mut targets = vec![(dir.join("report.html"), Output::Page)];
    targets.extend(charts.iter().map(|c| (dir.join(c), Output::Chart)));
    targets
}

/// What `segtune atlas` writes at the top of its `--out`.
pub fn atlas_outputs(out: &Path) -> Vec<(PathBuf, Output)> {
    vec![
        (out.join("atlas.json"), Output::AtlasJson),
        (out.join("atlas.csv"), Output::AtlasCsv),
        (out.join("atlas.html"), Output::Page),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(dir: &Path, name: &str, text: &str, kind: Output) -> Option<String> {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        check_replaceable(dir, &[(path, kind)])
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn a_users_file_with_segtunes_name_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let why = refused(d, "search.json", "{\"my\": \"notes\"}", Output::SavedSearch).unwrap();
        assert!(
            why.contains("search.json exists and segtune did not write it")
                && why.contains("move it away or give another --out"),
            "{why}"
        );
        let page = "<!doctype html><html><head><title>My results</title>";
        assert!(refused(d, "report.html", page, Output::Page).is_some());
        assert!(refused(d, "trials.jsonl", "step,loss\n1,0.5\n", Output::Journal).is_some());
        assert!(refused(d, "atlas.csv", "a,b\n", Output::AtlasCsv).is_some());
    }

    #[test]
    fn segtunes_own_outputs_and_empty_files_are_replaceable() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let saved = "{\n  \"result\": {\n    \"config\": \"x.py\",\n    \"budget\": {}}}";
        assert_eq!(refused(d, "search.json", saved, Output::SavedSearch), None);
        let page = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>segtune search: x.py</title>";
        assert_eq!(refused(d, "report.html", page, Output::Page), None);
        let atlas_page =
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>segtune atlas</title>";
        assert_eq!(refused(d, "atlas.html", atlas_page, Output::Page), None);
        let journal = "{\"config_hash\":\"h\",\"device\":\"d\"\n";
        assert_eq!(refused(d, "trials.jsonl", journal, Output::Journal), None);
        assert_eq!(refused(d, "search.json", "", Output::SavedSearch), None);
    }

    #[test]
    fn links_and_directories_are_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::os::unix::fs::symlink("/etc/passwd", d.join("search.json")).unwrap();
        std::fs::create_dir(d.join("atlas.csv")).unwrap();
        let err = check_replaceable(
            d,
            &[
                (d.join("search.json"), Output::SavedSearch),
                (d.join("atlas.csv"), Output::AtlasCsv),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("is a symbolic link"), "{err}");
        let err = check_replaceable(d, &[(d.join("atlas.csv"), Output::AtlasCsv)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a regular file"), "{err}");
    }
}
