//! Any batch size from two: every tensor of a training step is affine in
//! the batch size (parameters, buffers and optimizer state do not change;
//! activations, their gradients and the loss machinery grow linearly), so
//! two traces of the same step at batch sizes 1 and 2 give each allocation's
//! size as a function of the batch, and a trace for any batch size follows
//! without running it.

use super::trace::{phase_of, Phase, TraceEvent};

/// Events that take part in the alignment (data loading and preprocessing
/// are per image and handled by the replay's batch tensors).
fn aligned(events: &[TraceEvent]) -> Vec<TraceEvent> {
    events
        .iter()
        .filter(|e| !matches!(phase_of(e.phase).1, Phase::Data | Phase::Preprocess))
        .copied()
        .collect()
}

/// Builds the trace of batch size `n` from traces at batch sizes 1 and 2.
pub fn extrapolate(
    batch1: &[TraceEvent],
    batch2: &[TraceEvent],
    n: i64,
) -> Result<Vec<TraceEvent>, String> {
    let a = aligned(batch1);
    let b = aligned(batch2);
    if a.len() != b.len() {
        return Err(format!(
            "the traces at batch 1 and 2 have different event counts ({} vs {}); the step is not batch-affine",
            a.len(),
            b.len()
        ));
    }
    // Allocation ids differ between the traces; map both to the order of allocation.
    let mut order_a = std::collections::HashMap::new();
    let mut order_b = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(a.len());
    let mut next = 0u64;
    let mut sizes = std::collections::HashMap::new();
    for (x, y) in a.iter().zip(&b) {
        if x.phase != y.phase || (x.bytes > 0) != (y.bytes > 0) {
            return Err(format!(
                "the traces diverge at an event of phase {:?}",
                phase_of(x.phase)
            ));
        }
        if x.bytes > 0 {
            let size = (x.bytes + (y.bytes - x.bytes) * (n - 1)).max(1);
            order_a.insert(x.id, next);
            order_b.insert(y.id, next);
            sizes.insert(next, size);
            out.push(TraceEvent {
                id: next,
                bytes: size,
                phase: x.phase,
                pad: 0,
            });
            next += 1;
        } else {
            match (order_a.get(&x.id), order_b.get(&y.id)) {
                (Some(i), Some(j)) if i == j => {
                    out.push(TraceEvent {
                        id: *i,
                        bytes: -sizes[i],
                        phase: x.phase,
                        pad: 0,
                    });
                }
                (None, None) => {} // allocated before the trace or in data loading
                _ => return Err("the traces free different allocations".into()),
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::predict::trace::phase_code;

    fn ev(id: u64, bytes: i64, phase: Phase) -> TraceEvent {
        TraceEvent {
            id,
            bytes,
            phase: phase_code(1, phase),
            pad: 0,
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
        let b5 = extrapolate(&b1, &b2, 5).unwrap();
        assert_eq!(
            b5.iter().map(|e| e.bytes).collect::<Vec<_>>(),
            vec![100, 160, -160]
        );
        assert!(extrapolate(&b1, &b2[..3], 5).is_err());
    }
}
