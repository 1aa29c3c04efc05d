//! Configs this process resolved already, by path and `--cfg-options`: a
//! search resolves its config for every traced step's cache key and every
//! worker request, and an atlas does so for each GPU. An entry holds the
//! text of every file the load read and the environment variables its
//! `{{'$NAME:default'}}` placeholders looked up; it answers only while all
//! of them are unchanged, so a memoized result is the one a fresh load
//! would give. Only successful loads are kept (an error is re-derived, with
//! its location, each time).

use super::Dict;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// What one load depended on, and its result.
struct Resolved {
    /// Every file read, with its text then.
    sources: Vec<(PathBuf, Option<String>)>,
    /// Every environment variable looked up, with its value then.
    env: Vec<(String, Option<String>)>,
    cfg: Dict,
}

type Key = (PathBuf, Vec<String>);

/// Entries beyond this many are dropped all at once (a process resolves a
/// few configs many times, not many configs).
const KEPT: usize = 512;

fn memo() -> &'static Mutex<HashMap<Key, Arc<Resolved>>> {
    static MEMO: OnceLock<Mutex<HashMap<Key, Arc<Resolved>>>> = OnceLock::new();
    MEMO.get_or_init(Default::default)
}

thread_local! {
    /// The environment variables the load on this thread looked up.
    static ENV_READ: RefCell<Vec<(String, Option<String>)>> = const { RefCell::new(Vec::new()) };
}

/// `std::env::var(name)`, noted for the memo of the load on this thread.
pub(super) fn env_var(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    ENV_READ.with(|read| read.borrow_mut().push((name.to_string(), value.clone())));
    value
}

/// Forgets the lookups noted on this thread (a load starts).
pub(super) fn start_noting() {
    ENV_READ.with(|read| read.borrow_mut().clear());
}

/// The lookups noted on this thread since [`start_noting`].
pub(super) fn env_read() -> Vec<(String, Option<String>)> {
    ENV_READ.with(|read| std::mem::take(&mut *read.borrow_mut()))
}

fn text_of(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The config resolved before for `path` and `cfg_options`, if nothing it
/// depended on changed since.
pub(super) fn recall(path: &Path, cfg_options: &[String]) -> Option<Dict> {
    let key = (path.to_path_buf(), cfg_options.to_vec());
    let entry = memo().lock().ok()?.get(&key).cloned()?;
    let unchanged = entry
        .sources
        .iter()
        .all(|(file, text)| text_of(file) == *text)
        && entry
            .env
            .iter()
            .all(|(name, value)| std::env::var(name).ok() == *value);
    unchanged.then(|| entry.cfg.clone())
}

/// Keeps `cfg`, resolved from `path` and `cfg_options` by reading
/// `sources` and looking up `env`.
pub(super) fn keep(
    path: &Path,
    cfg_options: &[String],
    sources: Vec<PathBuf>,
    env: Vec<(String, Option<String>)>,
    cfg: &Dict,
) {
    let Ok(mut memo) = memo().lock() else {
        return;
    };
    if memo.len() >= KEPT {
        memo.clear();
    }
    let sources = sources
        .into_iter()
        .map(|file| {
            let text = text_of(&file);
            (file, text)
        })
        .collect();
    memo.insert(
        (path.to_path_buf(), cfg_options.to_vec()),
        Arc::new(Resolved {
            sources,
            env,
            cfg: cfg.clone(),
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::super::resolve;

    #[test]
    fn a_resolved_config_is_recalled_until_a_file_it_read_changes() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.py");
        let child = dir.path().join("child.py");
        std::fs::write(&base, "a = 1\nb = dict(c=2)\n").unwrap();
        std::fs::write(&child, "_base_ = './base.py'\nb = dict(d=3)\n").unwrap();
        let first = resolve(&child, &[]).unwrap();
        assert_eq!(resolve(&child, &[]).unwrap(), first);
        // Same length, same moment: the text decides, not the file's time.
        std::fs::write(&base, "a = 7\nb = dict(c=2)\n").unwrap();
        let again = resolve(&child, &[]).unwrap();
        assert_eq!(again.get("a").and_then(|v| v.as_i64()), Some(7));
        let with_option = resolve(&child, &["a=9".to_string()]).unwrap();
        assert_eq!(with_option.get("a").and_then(|v| v.as_i64()), Some(9));
        assert_eq!(resolve(&child, &[]).unwrap(), again);
    }

    #[test]
    fn an_environment_variable_the_config_read_is_checked_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("env.py");
        let name = "SEGTUNE_MEMO_TEST_VARIABLE";
        std::fs::write(&path, format!("root = '{{{{'${name}:default'}}}}'\n")).unwrap();
        // SAFETY: no other test reads or writes this variable.
        unsafe { std::env::remove_var(name) };
        let root =
            |cfg: crate::config::Dict| cfg.get("root").and_then(|v| v.as_str().map(String::from));
        assert_eq!(
            root(resolve(&path, &[]).unwrap()).as_deref(),
            Some("default")
        );
        // SAFETY: as above.
        unsafe { std::env::set_var(name, "elsewhere") };
        assert_eq!(
            root(resolve(&path, &[]).unwrap()).as_deref(),
            Some("elsewhere")
        );
        // SAFETY: as above.
        unsafe { std::env::remove_var(name) };
    }
}
