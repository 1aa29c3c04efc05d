//! Any batch size from two: every tensor of a training step is affine in
//! the batch size (parameters, buffers and optimizer state do not change;
//! activations, their gradients and the loss machinery grow linearly), so
//! two traces of the same step at batch sizes 1 and 2 give each allocation's
//! size as a function of the batch, and a trace for any batch size follows
//! without running it.

use crate::trial::trace::{phase_of, Phase, TraceEvent};
use std::collections::HashMap;

/// Events that take part in the alignment (data loading and preprocessing
/// are per image and handled by the replay's batch tensors).
fn aligned(events: &[TraceEvent]) -> Vec<TraceEvent> {
    events
        .iter()
        .filter(|e| !matches!(phase_of(e.phase).1, Phase::Data | Phase::Preprocess))
        .copied()
        .collect()
}

/// The batch sizes the two traces are taken at: libtorch takes slightly
/// different paths for a batch of one (extra reorders and copies), so the
/// pair starts at two.
pub const TRACED_BATCHES: (i64, i64) = (2, 3);

/// Builds the trace of batch size `n` from traces at batch sizes
/// [`TRACED_BATCHES`].
///
/// The two traces are aligned on their sequence of (phase, allocate/free);
/// a few per-image events (more in the larger batch) make the sequences
/// differ slightly. Paired allocations get the affine size; allocations only
/// the larger batch's trace has keep their size; those only the smaller
/// batch's trace has are dropped.
pub fn extrapolate(
    batch1: &[TraceEvent],
    batch2: &[TraceEvent],
    n: i64,
) -> Result<Vec<TraceEvent>, String> {
    let a = aligned(batch1);
    let b = aligned(batch2);
    let key = |e: &TraceEvent| (e.phase, e.bytes > 0);
    let ka: Vec<(u32, bool)> = a.iter().map(key).collect();
    let kb: Vec<(u32, bool)> = b.iter().map(key).collect();
    let ops = similar::capture_diff_slices(similar::Algorithm::Myers, &ka, &kb);
    let mut out = Vec::with_capacity(b.len());
    let mut ids_b: HashMap<u64, u64> = HashMap::new();
    let mut ids_a: HashMap<u64, u64> = HashMap::new();
    let mut sizes: HashMap<u64, i64> = HashMap::new();
    let mut next = 0u64;
    let emit_alloc = |size: i64, phase: u32, out: &mut Vec<TraceEvent>, next: &mut u64| -> u64 {
        let id = *next;
        *next += 1;
        out.push(TraceEvent {
            id,
            bytes: size.max(1),
            phase,
            scope: 0,
        });
        id
    };
    for op in ops {
        for (ia, ib) in pairs(&op) {
            match (ia.map(|i| a[i]), ib.map(|i| b[i])) {
                (Some(x), Some(y)) if x.bytes > 0 => {
                    let (ba, bb) = TRACED_BATCHES;
                    let size = x.bytes + (y.bytes - x.bytes) * (n - ba) / (bb - ba);
                    let id = emit_alloc(size, y.phase, &mut out, &mut next);
                    sizes.insert(id, size.max(1));
                    ids_a.insert(x.id, id);
                    ids_b.insert(y.id, id);
                }
                (Some(x), Some(y)) => {
                    let id = ids_b.get(&y.id).or_else(|| ids_a.get(&x.id)).copied();
                    if let Some(id) = id {
                        out.push(TraceEvent {
                            id,
                            bytes: -sizes[&id],
                            phase: y.phase,
                            scope: 0,
                        });
                    }
                }
                (None, Some(y)) if y.bytes > 0 => {
                    let id = emit_alloc(y.bytes, y.phase, &mut out, &mut next);
                    sizes.insert(id, y.bytes);
                    ids_b.insert(y.id, id);
                }
                (None, Some(y)) => {
                    if let Some(id) = ids_b.get(&y.id) {
                        out.push(TraceEvent {
                            id: *id,
                            bytes: -sizes[id],
                            phase: y.phase,
                            scope: 0,
                        });
                    }
                }
                _ => {} // only in the batch-1 trace
            }
        }
    }
    // Drop frees of allocations freed twice through both mappings.
    let mut live = std::collections::HashSet::new();
    out.retain(|e| {
        if e.bytes > 0 {
            live.insert(e.id)
        } else {
            live.remove(&e.id)
        }
    });
    Ok(out)
}

fn pairs(op: &similar::DiffOp) -> Vec<(Option<usize>, Option<usize>)> {
    match *op {
        similar::DiffOp::Equal {
            old_index,
            new_index,
            len,
        } => (0..len)
            .map(|k| (Some(old_index + k), Some(new_index + k)))
            .collect(),
        similar::DiffOp::Delete {
            old_index, old_len, ..
        } => (0..old_len).map(|k| (Some(old_index + k), None)).collect(),
        similar::DiffOp::Insert {
            new_index, new_len, ..
        } => (0..new_len).map(|k| (None, Some(new_index + k))).collect(),
        similar::DiffOp::Replace {
            old_index,
            old_len,
            new_index,
            new_len,
        } => {
            let mut v: Vec<(Option<usize>, Option<usize>)> =
                (0..old_len).map(|k| (Some(old_index + k), None)).collect();
            v.extend((0..new_len).map(|k| (None, Some(new_index + k))));
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trial::trace::phase_code;

    fn ev(id: u64, bytes: i64, phase: Phase) -> TraceEvent {
        TraceEvent {
            id,
            bytes,
            phase: phase_code(1, phase),
            scope: 0,
        }
    }

    #[test]
    fn sizes_are_affine_in_the_batch() {
        let b1 = vec![
            ev(0, 100, Phase::Setup),
            ev(7, 1000, Phase::Data),
            ev(1, 40, Phase::Forward),
            ev(1, -40, Phase::Backward),
        ];
        let b2 = vec![
            ev(0, 100, Phase::Setup),
            ev(9, 2000, Phase::Data),
            ev(10, 2000, Phase::Data),
            ev(2, 70, Phase::Forward),
            ev(2, -70, Phase::Backward),
        ];
        let b5 = extrapolate(&b1, &b2, 6).unwrap();
        assert_eq!(
            b5.iter().map(|e| e.bytes).collect::<Vec<_>>(),
            vec![100, 160, -160]
        );
    }
}
