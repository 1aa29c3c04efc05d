//! Any batch size from two: every tensor of a training step is affine in
//! the batch size (parameters, buffers and optimizer state do not change;
//! activations, their gradients and the loss machinery grow linearly), so
//! two traces of the same step at batch sizes 1 and 2 give each allocation's
//! size as a function of the batch, and a trace for any batch size follows
//! without running it.

use crate::trial::kernel_calls::KernelCall;
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

    fn conv(at: usize, batch: i64) -> KernelCall {
        use crate::trial::kernel_calls::{KernelArg, Layout};
        KernelCall {
            at,
            phase: phase_code(1, Phase::Forward),
            scope: 3,
            op: "aten::convolution".into(),
            args: vec![
                KernelArg::Tensor {
                    dtype: "f32".into(),
                    sizes: vec![batch, 64, 32, 32],
                    layout: Layout::Contiguous,
                },
                KernelArg::Ints(vec![1, 1]),
                KernelArg::Int(batch * 10),
                KernelArg::Bool(false),
            ],
        }
    }

    #[test]
    fn aligned_steps_give_any_batch_with_their_kernel_calls() {
        // Batch 2 and 4: a parameter, the batch (left out), an activation of
        // 40 bytes per image made by a convolution, freed in the backward.
        let step = |b: i64| {
            let events = vec![
                ev(0, 100, Phase::Setup),
                ev(1, 1000 * b, Phase::Data),
                ev(2, 40 * b + 8, Phase::Forward),
                ev(2, -(40 * b + 8), Phase::Backward),
                ev(1, -1000 * b, Phase::Backward),
            ];
            (events, vec![conv(2, b)])
        };
        let (a, b) = (step(2), step(4));
        let (events, calls) = extrapolate_aligned((&a.0, &a.1), (&b.0, &b.1), 8).unwrap();
        assert_eq!(
            events.iter().map(|e| e.bytes).collect::<Vec<_>>(),
            vec![100, 328, -328]
        );
        // The call sat before the activation (after the parameter; the data
        // loader's event is not in the output).
        assert_eq!(
            calls,
            vec![KernelCall {
                at: 1,
                ..conv(0, 8)
            }]
        );
    }

    #[test]
    fn frees_in_another_order_still_align() {
        // Two activations freed together, in either order.
        let step = |b: i64, swapped: bool| {
            let (first, second) = if swapped { (3, 2) } else { (2, 3) };
            let bytes = |id: u64| if id == 2 { 10 * b } else { 30 * b };
            vec![
                ev(2, bytes(2), Phase::Forward),
                ev(3, bytes(3), Phase::Forward),
                ev(first, -bytes(first), Phase::Backward),
                ev(second, -bytes(second), Phase::Backward),
            ]
        };
        let (events, _) = extrapolate_aligned((&step(2, false), &[]), (&step(4, true), &[]), 8)
            .expect("the same tensors are freed");
        assert_eq!(
            events.iter().map(|e| e.bytes).collect::<Vec<_>>(),
            vec![80, 240, -240, -80]
        );
    }

    #[test]
    fn steps_that_do_not_align_are_traced_instead() {
        // A loss looping over the images: one more allocation per image.
        let step = |b: i64| {
            let mut events = vec![ev(0, 100, Phase::Setup)];
            for i in 0..b {
                events.push(ev(10 + i as u64, 8, Phase::Forward));
            }
            events
        };
        assert!(extrapolate_aligned((&step(2), &[]), (&step(4), &[]), 6).is_none());
        // The same events, but a call's op differs.
        let events = step(2);
        let mut other = conv(1, 4);
        other.op = "aten::cudnn_batch_norm".into();
        assert!(extrapolate_aligned((&events, &[conv(1, 2)]), (&events, &[other]), 6).is_none());
    }
}

/// One item of a traced step, in order: an event (outside the data loader
/// and preprocessing) or a kernel call.
#[derive(Clone, Copy)]
enum Item<'a> {
    Event(&'a TraceEvent),
    Call(&'a KernelCall),
}

impl Item<'_> {
    /// What must match between the two traces: the phase, and an
    /// allocation, a free or the call's op.
    fn same_kind(&self, other: &Item) -> bool {
        match (self, other) {
            (Item::Event(a), Item::Event(b)) => {
                a.phase == b.phase && (a.bytes > 0) == (b.bytes > 0)
            }
            (Item::Call(a), Item::Call(b)) => a.phase == b.phase && a.op == b.op,
            _ => false,
        }
    }
}

/// The items of a step, or `None` where a kernel call belongs to the data
/// loader or preprocessing (per image: their number follows the batch).
fn items<'a>(events: &'a [TraceEvent], calls: &'a [KernelCall]) -> Option<Vec<Item<'a>>> {
    let per_image = |phase: u32| matches!(phase_of(phase).1, Phase::Data | Phase::Preprocess);
    if calls.iter().any(|c| per_image(c.phase)) {
        return None;
    }
    let mut out = Vec::with_capacity(events.len() + calls.len());
    let mut next_call = 0;
    // The data loader's and preprocessing's tensors (one per image), freed
    // later in any phase: the replay leaves them out, frees included.
    let mut loaded = std::collections::HashSet::new();
    for (i, e) in events.iter().enumerate() {
        while next_call < calls.len() && calls[next_call].at <= i {
            out.push(Item::Call(&calls[next_call]));
            next_call += 1;
        }
        if per_image(e.phase) {
            if e.bytes > 0 {
                loaded.insert(e.id);
            }
        } else if !(e.bytes < 0 && loaded.remove(&e.id)) {
            out.push(Item::Event(e));
        }
    }
    out.extend(calls[next_call..].iter().map(Item::Call));
    Some(out)
}

/// The batch sizes whose op-level traces predict the larger batches
/// ([`extrapolate_aligned`]): both are batches a search tries anyway (the
/// binary search over 1, 2, 4, ... passes through them), so the pair costs
/// no trace of its own.
pub const ALIGNED_PAIR: (i64, i64) = (2, 4);

/// An integer of batch size `n` from its values at [`ALIGNED_PAIR`].
fn affine(at_a: i64, at_b: i64, n: i64) -> i64 {
    let (ba, bb) = ALIGNED_PAIR;
    at_a + (at_b - at_a) * (n - ba) / (bb - ba)
}

/// A kernel call's arguments at batch size `n`: every integer (sizes,
/// int lists, ints) affine between the two traced calls.
fn call_at(a: &KernelCall, b: &KernelCall, n: i64, at: usize) -> KernelCall {
    use crate::trial::kernel_calls::KernelArg;
    let ints = |x: &[i64], y: &[i64]| -> Option<Vec<i64>> {
        (x.len() == y.len()).then(|| x.iter().zip(y).map(|(p, q)| affine(*p, *q, n)).collect())
    };
    let args = a
        .args
        .iter()
        .zip(&b.args)
        .map(|pair| match pair {
            (
                KernelArg::Tensor { sizes: x, .. },
                KernelArg::Tensor {
                    dtype,
                    sizes: y,
                    layout,
                },
            ) => KernelArg::Tensor {
                dtype: dtype.clone(),
                sizes: ints(x, y).unwrap_or_else(|| y.clone()),
                layout: *layout,
            },
            (KernelArg::Ints(x), KernelArg::Ints(y)) => {
                KernelArg::Ints(ints(x, y).unwrap_or_else(|| y.clone()))
            }
            (KernelArg::Int(x), KernelArg::Int(y)) => KernelArg::Int(affine(*x, *y, n)),
            (_, y) => y.clone(),
        })
        .collect();
    KernelCall {
        at,
        args,
        ..b.clone()
    }
}

/// The step at batch size `n` from the steps traced at [`ALIGNED_PAIR`],
/// with their kernel calls, where the two align item for item: the same
/// events (allocation or free, phase) and calls (op, phase) in the same
/// order outside the data loader and preprocessing, and the same number of
/// arguments to each call. Every size is then affine in the batch: each
/// allocation's bytes and each call's integers are interpolated. `None`
/// where they do not align (a loop over the images in the loss, for
/// example): such a step is traced at `n` itself.
pub fn extrapolate_aligned(
    a: (&[TraceEvent], &[KernelCall]),
    b: (&[TraceEvent], &[KernelCall]),
    n: i64,
) -> Option<(Vec<TraceEvent>, Vec<KernelCall>)> {
    let (ia, ib) = (items(a.0, a.1)?, items(b.0, b.1)?);
    if ia.len() != ib.len() || ia.iter().zip(&ib).any(|(x, y)| !x.same_kind(y)) {
        return None;
    }
    let mut events = Vec::with_capacity(b.0.len());
    let mut calls = Vec::with_capacity(b.1.len());
    // Each allocation's id in the output, by its id in the second trace
    // (and its bytes there, for its free).
    let mut ids: HashMap<u64, (u64, i64)> = HashMap::new();
    let mut freed_a: HashMap<u64, u64> = HashMap::new();
    let is_free = |item: &Item| matches!(item, Item::Event(e) if e.bytes < 0);
    let mut i = 0;
    while i < ia.len() {
        match (&ia[i], &ib[i]) {
            (Item::Event(x), Item::Event(y)) if y.bytes > 0 => {
                let id = events.len() as u64;
                let bytes = affine(x.bytes, y.bytes, n).max(1);
                ids.insert(y.id, (id, bytes));
                freed_a.insert(x.id, id);
                events.push(TraceEvent { id, bytes, ..**y });
                i += 1;
            }
            (Item::Event(_), Item::Event(_)) => {
                // A run of frees: the same tensors in both traces, perhaps
                // in another order (frees walk hash maps and the autograd
                // graph); the second trace's order is kept. The data
                // loader's tensors are not in the output.
                let end = (i..ia.len())
                    .find(|&k| !(is_free(&ia[k]) && is_free(&ib[k])))
                    .unwrap_or(ia.len());
                let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
                for k in i..end {
                    let (Item::Event(x), Item::Event(y)) = (&ia[k], &ib[k]) else {
                        return None;
                    };
                    from_a.push(freed_a.remove(&x.id));
                    let freed = ids.remove(&y.id);
                    from_b.push(freed.map(|(id, _)| id));
                    if let Some((id, bytes)) = freed {
                        events.push(TraceEvent {
                            id,
                            bytes: -bytes,
                            ..**y
                        });
                    }
                }
                from_a.sort_unstable();
                from_b.sort_unstable();
                if from_a != from_b {
                    return None;
                }
                i = end;
            }
            (Item::Call(x), Item::Call(y)) => {
                if x.args.len() != y.args.len() {
                    return None;
                }
                calls.push(call_at(x, y, n, events.len()));
                i += 1;
            }
            _ => return None,
        }
    }
    Some((events, calls))
}
