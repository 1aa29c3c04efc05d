//! Allocation traces of a training trial: every CPU tensor allocation and
//! free, in order, tagged with the step and phase it happened in, and a
//! compact text form to pass them (and the kernel calls recorded with them,
//! `kernel_calls.rs`) between processes.

use super::kernel_calls::KernelCall;
use super::op_work::OpWork;
use std::fmt::Write as _;

/// One allocator event: an allocation (`bytes > 0`) or a free (`bytes < 0`)
/// of the allocation numbered `id`, during `phase` (see [`phase_of`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceEvent {
    pub id: u64,
    pub bytes: i64,
    pub phase: u32,
    /// The model part running at the event (`models::scope` ids; 0:
    /// outside any part).
    #[serde(default)]
    pub scope: u32,
}

/// The phases of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[repr(u32)]
pub enum Phase {
    Setup = 0,
    Forward = 1,
    Backward = 2,
    Optimizer = 3,
    /// Building the synthetic batch on the CPU (the data loader's work).
    Data = 4,
    /// The data preprocessor (part of the forward pass).
    Preprocess = 5,
}

/// The phase code recorded in traces: `step * 8 + phase` (step 0 is the
/// model build).
pub fn phase_code(step: usize, phase: Phase) -> u32 {
    (step as u32) * 8 + phase as u32
}

/// `(step, phase)` of a phase code.
pub fn phase_of(code: u32) -> (usize, Phase) {
    let phase = match code % 8 {
        0 => Phase::Setup,
        1 => Phase::Forward,
        2 => Phase::Backward,
        3 => Phase::Optimizer,
        4 => Phase::Data,
        _ => Phase::Preprocess,
    };
    ((code / 8) as usize, phase)
}

const HEADER_V1: &str = "# segtune trace v1: id bytes phase";
const HEADER_V2: &str = "# segtune trace v2: id bytes phase scope";
const HEADER_V3: &str =
    "# segtune trace v3: id bytes phase scope; kernel calls: k at phase scope op args";
// Op work lines (`w phase op in out view`) ride in v3 traces: older readers skip them.

/// Writes events as text: a header line, then `id bytes phase scope` per line.
pub fn to_text(events: &[TraceEvent]) -> String {
    to_text_with_calls(events, &[])
}

/// Writes events and the kernel calls recorded with them: the events as
/// [`to_text`] does, then one `k ...` line per call ([`KernelCall::to_line`]).
pub fn to_text_with_calls(events: &[TraceEvent], calls: &[KernelCall]) -> String {
    to_text_with_work(events, calls, &[])
}

/// [`to_text_with_calls`], then one `w ...` line per op ([`OpWork::to_line`]).
pub fn to_text_with_work(events: &[TraceEvent], calls: &[KernelCall], work: &[OpWork]) -> String {
    let mut out =
        String::with_capacity(events.len() * 26 + calls.len() * 80 + work.len() * 40 + 96);
    out.push_str(if calls.is_empty() && work.is_empty() {
        HEADER_V2
    } else {
        HEADER_V3
    });
    out.push('\n');
    for e in events {
        let _ = writeln!(out, "{} {} {} {}", e.id, e.bytes, e.phase, e.scope);
    }
    for c in calls {
        out.push_str(&c.to_line());
        out.push('\n');
    }
    for w in work {
        out.push_str(&w.to_line());
        out.push('\n');
    }
    out
}

/// The ops' work of a trace written with it (none in older traces).
pub fn work_from_text(text: &str) -> Result<Vec<OpWork>, TraceParseError> {
    text.lines()
        .skip(1)
        .filter(|l| l.starts_with("w "))
        .map(|l| OpWork::from_line(l).map_err(TraceParseError::from))
        .collect()
}

/// The kernel calls of a v3 trace (none in v1 and v2).
pub fn calls_from_text(text: &str) -> Result<Vec<KernelCall>, TraceParseError> {
    text.lines()
        .skip(1)
        .filter(|l| l.starts_with("k "))
        .map(|l| KernelCall::from_line(l).map_err(TraceParseError::from))
        .collect()
}

/// Why a trace file does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceParseError {
    #[error("not a segtune trace (v1, v2 or v3)")]
    NotATrace,
    /// `line` is 1-based, the header included.
    #[error("trace line {line}: {what}")]
    BadLine { line: usize, what: String },
    #[error(transparent)]
    KernelCall(#[from] super::kernel_calls::KernelCallParseError),
    #[error(transparent)]
    OpWork(#[from] super::op_work::OpWorkParseError),
}

/// Parses [`to_text`]'s output (and v1 traces, without scopes); the kernel
/// calls of a v3 trace are left out (see [`calls_from_text`]).
pub fn from_text(text: &str) -> Result<Vec<TraceEvent>, TraceParseError> {
    let mut lines = text.lines();
    let scoped = match lines.next() {
        Some(HEADER_V2 | HEADER_V3) => true,
        Some(HEADER_V1) => false,
        _ => return Err(TraceParseError::NotATrace),
    };
    lines
        .enumerate()
        .filter(|(_, line)| !line.starts_with("k ") && !line.starts_with("w "))
        .map(|(i, line)| {
            let mut parts = line.split_ascii_whitespace();
            let bad = |what: String| TraceParseError::BadLine { line: i + 2, what };
            let mut next = || parts.next().ok_or_else(|| bad("too short".into()));
            let id = next()?
                .parse()
                .map_err(|e: std::num::ParseIntError| bad(e.to_string()))?;
            let bytes = next()?
                .parse()
                .map_err(|e: std::num::ParseIntError| bad(e.to_string()))?;
            let phase = next()?
                .parse()
                .map_err(|e: std::num::ParseIntError| bad(e.to_string()))?;
            let scope = if scoped {
                next()?
                    .parse()
                    .map_err(|e: std::num::ParseIntError| bad(e.to_string()))?
            } else {
                0
            };
            Ok(TraceEvent {
                id,
                bytes,
                phase,
                scope,
            })
        })
        .collect()
}

/// An op-level trace in a form two runs of the same step can be compared
/// in: ids renumbered by first appearance, and each run of consecutive frees
/// sorted (autocast's weight cache is a hash map: its frees come in pointer
/// order, which differs run to run; the set freed at that point does not).
pub fn canonical(events: &[TraceEvent]) -> Vec<(usize, i64, u32)> {
    let mut ids = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(events.len());
    let mut frees: Vec<(usize, i64, u32)> = Vec::new();
    for e in events {
        let next = ids.len();
        let id = *ids.entry(e.id).or_insert(next);
        if e.bytes < 0 {
            frees.push((id, e.bytes, e.phase));
        } else {
            frees.sort_unstable();
            out.append(&mut frees);
            out.push((id, e.bytes, e.phase));
        }
    }
    frees.sort_unstable();
    out.append(&mut frees);
    out
}

/// Where two canonical traces first differ, described, or `None` when they
/// are equal event for event.
pub fn first_difference(a: &[(usize, i64, u32)], b: &[(usize, i64, u32)]) -> Option<String> {
    let at = a.iter().zip(b).position(|(x, y)| x != y);
    match at {
        Some(i) => Some(format!(
            "event {i} of {}/{}: {:?} vs {:?} (context {:?} vs {:?})",
            a.len(),
            b.len(),
            a[i],
            b[i],
            &a[i.saturating_sub(2)..(i + 3).min(a.len())],
            &b[i.saturating_sub(2)..(i + 3).min(b.len())]
        )),
        None if a.len() != b.len() => Some(format!("{} events vs {}", a.len(), b.len())),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let events = vec![
            TraceEvent {
                id: 0,
                bytes: 100,
                phase: 0,
                scope: 0,
            },
            TraceEvent {
                id: 0,
                bytes: -100,
                phase: 5,
                scope: 3,
            },
        ];
        assert_eq!(from_text(&to_text(&events)).unwrap(), events);
        assert_eq!(phase_of(phase_code(1, Phase::Forward)), (1, Phase::Forward));
        assert_eq!(phase_of(phase_code(2, Phase::Data)), (2, Phase::Data));
        let call =
            KernelCall::from_line("k 1 5 3 aten::sum.dim_IntList t:f32:4x4 l:1 b:0 -").unwrap();
        let text = to_text_with_calls(&events, std::slice::from_ref(&call));
        assert_eq!(from_text(&text).unwrap(), events);
        assert_eq!(calls_from_text(&text).unwrap(), vec![call]);
        assert!(calls_from_text(&to_text(&events)).unwrap().is_empty());
    }

    #[test]
    fn canonical_traces_ignore_ids_and_the_order_within_a_run_of_frees() {
        let e = |id, bytes| TraceEvent {
            id,
            bytes,
            phase: 1,
            scope: 0,
        };
        let a = [e(5, 10), e(6, 20), e(5, -10), e(6, -20), e(7, 30)];
        let b = [e(0, 10), e(1, 20), e(1, -20), e(0, -10), e(2, 30)];
        assert_eq!(first_difference(&canonical(&a), &canonical(&b)), None);
        let c = [e(0, 10), e(1, 20), e(1, -20), e(2, 30), e(0, -10)];
        assert!(first_difference(&canonical(&a), &canonical(&c)).is_some());
    }
}
