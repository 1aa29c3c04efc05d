//! The allocation meter of a config evaluation: the memory it may hold,
//! counted by the allocator (not the GPU's budget, which is
//! `predict::budget`'s).
//!
//! A config is a program, and a hostile one can build memory in many small
//! steps (3000 variables of a million items each) that no per-value size
//! check sees. So segtune's global allocator counts the bytes that the
//! thread evaluating a config holds ([`Metered`]), and the evaluator stops
//! with a limit error once they pass [`EVALUATION_BUDGET_BYTES`]: Rhai checks
//! [`exceeded`] before every operation, and the operators that build a value
//! in one go (`[x] * n`, `"s" * n`, `pad`) ask [`reserve`] first, so that
//! no single step can overshoot by more than the size of one existing value.
//!
//! The count is per thread and costs one thread-local read per allocation
//! on the other threads.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a config's evaluation may hold at once. The largest MMSeg config
/// resolves in under 4 MB; this leaves room for any real config and keeps a
/// hostile one well away from the host's memory.
pub const EVALUATION_BUDGET_BYTES: usize = 256 << 20;

thread_local! {
    // `const` initialisers without destructors: safe to touch from inside
    // the allocator (no lazy initialisation, no allocation).
    static METERED: Cell<bool> = const { Cell::new(false) };
    static HELD: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

static HARD_CAP: AtomicUsize = AtomicUsize::new(usize::MAX);
static LAST_PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting what a metered thread holds.
pub struct Metered;

fn add(bytes: usize) -> bool {
    METERED
        .try_with(|m| {
            if !m.get() {
                return true;
            }
            let held = HELD.with(|h| {
                let n = h.get().saturating_add(bytes);
                h.set(n);
                n
            });
            PEAK.with(|p| p.set(p.get().max(held)));
            held <= HARD_CAP.load(Ordering::Relaxed)
        })
        .unwrap_or(true)
}

fn sub(bytes: usize) {
    let _ = METERED.try_with(|m| {
        if m.get() {
            HELD.with(|h| h.set(h.get().saturating_sub(bytes)));
        }
    });
}

// SAFETY: every call forwards to `System` with the caller's layout; the
// bookkeeping touches only `const` thread-locals and never allocates.
unsafe impl GlobalAlloc for Metered {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !add(layout.size()) {
            sub(layout.size());
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            sub(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !add(layout.size()) {
            sub(layout.size());
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            sub(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        sub(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old && !add(new_size - old) {
            sub(new_size - old);
            return std::ptr::null_mut();
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new_size > old {
                sub(new_size - old);
            }
        } else if new_size < old {
            sub(old - new_size);
        }
        p
    }
}

/// Counts this thread's allocations from now on, from zero.
pub fn start_metering() {
    HELD.with(|h| h.set(0));
    PEAK.with(|p| p.set(0));
    METERED.with(|m| m.set(true));
}

/// The most this thread held at once since [`start_metering`].
pub fn peak_bytes() -> usize {
    PEAK.with(Cell::get)
}

/// Stops counting on this thread and keeps its peak for
/// [`last_peak_bytes`].
pub fn stop_metering() {
    METERED.with(|m| m.set(false));
    LAST_PEAK.store(peak_bytes(), Ordering::Relaxed);
}

/// The peak of the metered thread that stopped last (the last config
/// evaluation), for the fuzz harness's report.
pub fn last_peak_bytes() -> usize {
    LAST_PEAK.load(Ordering::Relaxed)
}

/// Makes a metered thread's allocations fail (and so abort the process)
/// past `bytes` held: a crash detector for fuzzing, never set by segtune.
pub fn set_hard_cap(bytes: usize) {
    HARD_CAP.store(bytes, Ordering::Relaxed);
}

fn held() -> usize {
    HELD.with(Cell::get)
}

/// Whether this thread holds more than the evaluation budget.
pub fn exceeded() -> bool {
    METERED.with(Cell::get) && held() > EVALUATION_BUDGET_BYTES
}

/// The message of a config that ran out of budget.
pub fn exceeded_message() -> String {
    format!(
        "limit exceeded: the config holds more than {} MiB of values while evaluating; \
         a real config needs a few MB (is something repeated millions of times?)",
        EVALUATION_BUDGET_BYTES >> 20
    )
}

/// Refuses to build a value of about `bytes` that would take this thread
/// past the budget (before it is built).
pub fn reserve(bytes: usize) -> Result<(), String> {
    if METERED.with(Cell::get) && held().saturating_add(bytes) > EVALUATION_BUDGET_BYTES {
        Err(format!(
            "this would build a value of about {} MiB, past the config's budget of {} MiB",
            bytes >> 20,
            EVALUATION_BUDGET_BYTES >> 20
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_the_metered_thread_holds() {
        std::thread::spawn(|| {
            start_metering();
            let v = vec![0u8; 10 << 20];
            assert!(peak_bytes() >= 10 << 20);
            assert!(reserve(EVALUATION_BUDGET_BYTES).is_err());
            drop(v);
            assert!(reserve(EVALUATION_BUDGET_BYTES / 2).is_ok());
            assert!(!exceeded());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn other_threads_are_not_counted() {
        assert!(reserve(usize::MAX).is_ok());
        assert!(!exceeded());
    }
}
