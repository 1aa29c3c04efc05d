//! Which part of the model runs now: `backbone`, `backbone.stage2`,
//! `decode_head`, `decode_head.loss`, ... The segmentor and the backbones
//! enter a scope as they call into their parts; whoever attributes memory
//! to parts (the trial's tracer, for `segtune explain`) registers a hook
//! that hears each change. Models know nothing of tracing.

use std::sync::{Mutex, OnceLock};

/// Scope names by id; id 0 is outside any part ("").
static NAMES: Mutex<Vec<String>> = Mutex::new(Vec::new());

thread_local! {
    /// The scope of the model running on this thread.
    static CURRENT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

static HOOK: OnceLock<fn(u32)> = OnceLock::new();

/// Registers the function told each scope change (its id, see [`names`]).
pub fn set_hook(hook: fn(u32)) {
    let _ = HOOK.set(hook);
}

fn switch_to(id: u32) {
    if let Some(hook) = HOOK.get() {
        hook(id);
    }
}

/// Inside a part of the model until dropped.
#[must_use = "the scope ends when this is dropped"]
pub struct Scope {
    previous: u32,
}

/// Enters the part `name` of the current one (`stage1` inside `backbone`
/// is `backbone.stage1`).
pub fn enter(name: &str) -> Scope {
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if names.is_empty() {
        names.push(String::new());
    }
    let previous = CURRENT.get();
    let parent = &names[previous as usize];
    let full = if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}.{name}")
    };
    let id = match names.iter().position(|n| *n == full) {
        Some(i) => i as u32,
        None => {
            names.push(full);
            (names.len() - 1) as u32
        }
    };
    drop(names);
    CURRENT.set(id);
    switch_to(id);
    Scope { previous }
}

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.set(self.previous);
        switch_to(self.previous);
    }
}

/// Every scope name entered so far, by id (id 0: "", outside any part).
pub fn names() -> Vec<String> {
    let names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if names.is_empty() {
        vec![String::new()]
    } else {
        names.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_scopes_are_named_by_their_path_and_restored_on_drop() {
        let outer = enter("backbone_test");
        let id_of = |name: &str| names().iter().position(|n| n == name);
        {
            let _inner = enter("stage1");
            assert!(id_of("backbone_test.stage1").is_some());
            assert_eq!(Some(CURRENT.get() as usize), id_of("backbone_test.stage1"));
        }
        assert_eq!(Some(CURRENT.get() as usize), id_of("backbone_test"));
        drop(outer);
        assert_eq!(names()[0], "");
    }
}
