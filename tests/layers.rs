//! The layers of `docs/architecture.md`, checked on the source: every
//! `crate::x` a module of `src/` names (in a `use`, a path or a doc link) is
//! on its own floor or one below it. Data flows one way; an import that runs
//! back up is a design error, found here instead of by a reviewer.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The floors, lowest first; a module may use its own floor and those below.
/// The ground floor's rooms use nothing of segtune's but `named` (and the
/// shim calls back into `models` only through a C symbol, never a path).
const FLOORS: &[&[&str]] = &[
    &["named", "status", "shim"],
    &["kinds"],
    &["config"],
    &["models"],
    &["error"],
    &["trial"],
    &["worker"],
    &["predict"],
    &["search"],
    &["report"],
    &["cli"],
];

fn floor_of(module: &str) -> Option<usize> {
    FLOORS.iter().position(|rooms| rooms.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `text` names through `crate::`: `crate::a::b`,
/// `crate::{a, b::c}`.
fn named_modules(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        if at > 0 && text[..at].ends_with('$') {
            continue;
        }
        let rest = &text[at + "crate::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .collect(),
            None => vec![rest],
        };
        for name in names {
            let module: String = name
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !module.is_empty() {
                found.insert(module);
            }
        }
    }
    found
}

#[test]
fn no_module_imports_one_from_a_higher_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    let mut seen_floors = BTreeSet::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src");
        let first = relative.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_str()
            .expect("UTF-8")
            .trim_end_matches(".rs");
        if matches!(module, "lib" | "main" | "bin") {
            continue;
        }
        let Some(own) = floor_of(module) else {
            panic!("src/{module} is on no floor: add it to FLOORS and docs/architecture.md");
        };
        seen_floors.insert(module.to_string());
        let text = std::fs::read_to_string(file).expect("a source file");
        // Comments may name any layer (a doc link says where a thing went).
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for used in named_modules(&code) {
            match floor_of(&used) {
                Some(floor) if floor <= own => {}
                Some(_) => upward.push(format!("{}: {module} uses {used}", relative.display())),
                None => {}
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that run up the layers:\n{}",
        upward.join("\n")
    );
    assert!(
        seen_floors.len() >= 12,
        "every floor was read: {seen_floors:?}"
    );
}

#[test]
fn the_error_type_names_no_trial() {
    let error = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/error.rs"))
        .expect("src/error.rs");
    let code: Vec<&str> = error
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    assert!(!named_modules(&code.join("\n")).contains("trial"));
}
