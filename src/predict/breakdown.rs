//! Where a predicted peak goes (`segtune explain`): the tensors live on the
//! device at the instant of the last step's allocated peak, grouped by what
//! they are, read from when and where each was allocated: the model build
//! (parameters and buffers), an earlier step's optimizer (its state), this
//! step's forward by model part (`backbone.stage1`, `decode_head`,
//! `decode_head.loss`: what autograd saved and the outputs still held), this
//! step's backward (the parameters' gradients, which live into the
//! optimizer step, and the gradients in flight, which do not), the input
//! batch, the cuBLAS workspace, the cuDNN workspace and the CUDA kernels'
//! scratch of the call running at the peak; then the allocator's rounding, the
//! reserved-but-free memory (fragmentation and cached blocks) and the CUDA
//! context. The parts add up to the predicted device total.

use super::allocator::round_size;
use super::replay::{ReplayInputs, ReplayResult};
use crate::trial::trace::{phase_of, Phase, TraceEvent};
use std::collections::HashMap;

/// One part of the peak.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PeakPart {
    pub name: String,
    pub bytes: u64,
    /// Whether it counts in `torch.cuda.max_memory_allocated()` (else it is
    /// reserved-only, or outside PyTorch's allocator).
    pub in_allocated: bool,
}

/// The peak split into parts (all predicted).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PeakBreakdown {
    pub parts: Vec<PeakPart>,
}

impl PeakBreakdown {
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }
}

/// What a tensor live at the peak is, from when and where it was allocated.
fn part_of(phase_code: u32, scope: &str, last_step: usize) -> String {
    let (step, phase) = phase_of(phase_code);
    match phase {
        _ if step == 0 => "parameters and buffers".into(),
        Phase::Optimizer if step < last_step => "optimizer state".into(),
        Phase::Optimizer => "optimizer step temporaries".into(),
        Phase::Backward if step < last_step => "gradients kept from the last step".into(),
        Phase::Forward if step == last_step && !scope.is_empty() => {
            format!("activations: {scope}")
        }
        Phase::Forward if step == last_step => "activations: outside the model parts".into(),
        _ => "other (held across steps)".into(),
    }
}

/// Splits `replayed`'s peak (a replay of `events` with `inputs`); `scopes`
/// names the events' model parts; `context` is the CUDA context.
pub fn breakdown(
    events: &[TraceEvent],
    scopes: &[String],
    inputs: &ReplayInputs,
    replayed: &ReplayResult,
    context: u64,
) -> PeakBreakdown {
    let mut by_part = tensors_at_peak(events, scopes, replayed);
    let mut add = |name: &str, bytes: u64| match by_part.iter_mut().find(|(n, _)| n == name) {
        Some((_, b)) => *b += bytes,
        None => by_part.push((name.to_string(), bytes)),
    };
    let batch: u64 = inputs.batch_copies.iter().map(|b| round_size(*b)).sum();
    add("input batch (device copies)", batch);
    if inputs.cublas_workspace > 0 {
        add("cuBLAS workspace", round_size(inputs.cublas_workspace));
    }
    // The kernels' scratch at their calls (a replay with kernel calls).
    for (name, bytes) in [
        ("cuBLAS workspace", replayed.cublas_at_peak),
        ("cuDNN workspace", replayed.cudnn_workspace_at_peak),
        ("CUDA kernels' scratch", replayed.kernel_scratch_at_peak),
    ] {
        if bytes > 0 {
            add(name, round_size(bytes));
        }
    }
    by_part.retain(|(_, bytes)| *bytes > 0);
    by_part.sort_by_key(|p| std::cmp::Reverse(p.1));
    let mut parts: Vec<PeakPart> = by_part
        .into_iter()
        .map(|(name, bytes)| PeakPart {
            name,
            bytes,
            in_allocated: true,
        })
        .collect();
    let counted: u64 = parts.iter().map(|p| p.bytes).sum();
    if replayed.peak_allocated > counted {
        parts.push(PeakPart {
            name: "allocator rounding (whole blocks handed out)".into(),
            bytes: replayed.peak_allocated - counted,
            in_allocated: true,
        });
    }
    parts.push(PeakPart {
        name: "reserved, not allocated (fragmentation, cached blocks)".into(),
        bytes: replayed
            .peak_reserved
            .saturating_sub(replayed.peak_allocated),
        in_allocated: false,
    });
    parts.push(PeakPart {
        name: "CUDA context".into(),
        bytes: context,
        in_allocated: false,
    });
    PeakBreakdown { parts }
}

/// The trace's tensors live at the peak, by part (in order of first
/// appearance by id): activations per model part, parameter gradients
/// (backward allocations still live when the optimizer starts), gradients
/// in flight, what is held across steps.
fn tensors_at_peak(
    events: &[TraceEvent],
    scopes: &[String],
    replayed: &ReplayResult,
) -> Vec<(String, u64)> {
    let last_step = events
        .iter()
        .map(|e| phase_of(e.phase).0)
        .max()
        .unwrap_or(0);
    let at_peak = replayed.peak_after_events.min(events.len());
    let mut live: HashMap<u64, (u64, u32, u32)> = HashMap::new();
    for e in &events[..at_peak] {
        let phase = phase_of(e.phase).1;
        if e.bytes > 0 {
            if phase != Phase::Data && phase != Phase::Preprocess {
                live.insert(e.id, (e.bytes as u64, e.phase, e.scope));
            }
        } else {
            live.remove(&e.id);
        }
    }
    let mut freed_before_optimizer = std::collections::HashSet::new();
    for e in &events[at_peak..] {
        if phase_of(e.phase) == (last_step, Phase::Optimizer) {
            break;
        }
        if e.bytes < 0 {
            freed_before_optimizer.insert(e.id);
        }
    }
    let mut by_part: Vec<(String, u64)> = Vec::new();
    let mut ids: Vec<&u64> = live.keys().collect();
    ids.sort_unstable();
    for id in ids {
        let (bytes, phase, scope) = live[id];
        let scope = scopes.get(scope as usize).map_or("", String::as_str);
        let name = if phase_of(phase) == (last_step, Phase::Backward) {
            if freed_before_optimizer.contains(id) {
                "backward temporaries (gradients in flight)".to_string()
            } else {
                "parameter gradients".to_string()
            }
        } else {
            part_of(phase, scope, last_step)
        };
        match by_part.iter_mut().find(|(n, _)| *n == name) {
            Some((_, b)) => *b += round_size(bytes),
            None => by_part.push((name, round_size(bytes))),
        }
    }
    by_part
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::replay::replay;
    use crate::trial::trace::phase_code;

    fn ev(id: u64, bytes: i64, step: usize, phase: Phase, scope: u32) -> TraceEvent {
        TraceEvent {
            id,
            bytes,
            phase: phase_code(step, phase),
            scope,
        }
    }

    #[test]
    fn the_parts_at_the_peak_add_up_to_the_replayed_peak() {
        let mib = 1i64 << 20;
        let scopes = vec![String::new(), "backbone".into(), "decode_head".into()];
        let mut events = vec![ev(0, 4 * mib, 0, Phase::Setup, 0)];
        for step in 1..=2usize {
            let base = step as u64 * 100;
            events.extend([
                ev(base + 1, 3 * mib, step, Phase::Forward, 1),
                ev(base + 2, 2 * mib, step, Phase::Forward, 2),
                ev(base + 3, 4 * mib, step, Phase::Backward, 0),
                ev(base + 1, -3 * mib, step, Phase::Backward, 0),
                ev(base + 2, -2 * mib, step, Phase::Backward, 0),
            ]);
            if step == 1 {
                events.push(ev(base + 4, 8 * mib, step, Phase::Optimizer, 0));
            }
            events.push(ev(base + 3, -4 * mib, step, Phase::Optimizer, 0));
        }
        let inputs = ReplayInputs {
            batch_copies: vec![1 << 20],
            cublas_workspace: 0,
            capacity: None,
            settings: Default::default(),
        };
        let replayed = replay(&events, &inputs);
        let b = breakdown(&events, &scopes, &inputs, &replayed, 500 << 20);
        let part = |name: &str| b.parts.iter().find(|p| p.name == name).map(|p| p.bytes);
        // At the peak (the backward's 4 MiB allocated while both activations live):
        assert_eq!(part("parameters and buffers"), Some(4 << 20));
        assert_eq!(part("optimizer state"), Some(8 << 20));
        assert_eq!(part("activations: backbone"), Some(3 << 20));
        assert_eq!(part("activations: decode_head"), Some(2 << 20));
        // Freed in the backward: in flight, not a parameter's gradient.
        assert_eq!(
            part("backward temporaries (gradients in flight)"),
            None,
            "the 4 MiB lives into the optimizer: a parameter gradient"
        );
        assert_eq!(part("parameter gradients"), Some(4 << 20));
        assert_eq!(part("input batch (device copies)"), Some(1 << 20));
        let allocated: u64 = b
            .parts
            .iter()
            .filter(|p| p.in_allocated)
            .map(|p| p.bytes)
            .sum();
        assert_eq!(allocated, replayed.peak_allocated);
        assert_eq!(
            b.total(),
            replayed.peak_reserved + (500 << 20),
            "the parts add up to the device total"
        );
    }
}
