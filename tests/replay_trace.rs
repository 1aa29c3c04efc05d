//! Replays a recorded SegFormer-B0 trace (tests/fixtures) through the CUDA
//! caching allocator model.

use segtune::predict::allocator::round_size;
use segtune::predict::replay::{replay, ReplayInputs};
use segtune::trial::trace::{from_text, phase_of, Phase};

fn fixture() -> Vec<segtune::trial::trace::TraceEvent> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/segformer_b0_1x128.trace"
    ))
    .unwrap();
    from_text(&text).unwrap()
}

#[test]
fn the_trace_reproduces_the_trials_cpu_peak() {
    let events = fixture();
    let last = events.iter().map(|e| phase_of(e.phase).0).max().unwrap();
    let (mut current, mut peak) = (0i64, 0i64);
    let mut live = std::collections::HashMap::new();
    for e in &events {
        let (step, _) = phase_of(e.phase);
        if e.bytes > 0 {
            live.insert(e.id, e.bytes);
            current += e.bytes;
        } else if let Some(b) = live.remove(&e.id) {
            current -= b;
        }
        if step == last && phase_of(e.phase).1 != Phase::Data {
            peak = peak.max(current);
        }
    }
    // The trial reported this peak for the measured step (fixtures/README.md).
    assert_eq!(peak, 95_759_580);
}

#[test]
fn replaying_the_trace_gives_the_caching_allocators_peaks() {
    let events = fixture();
    let image = 3 * 128 * 128 * 4;
    let label = 128 * 128 * 8;
    let workspace = 4096 * 1024 * 2 + 16 * 1024 * 8;
    let inputs = ReplayInputs {
        batch_copies: segtune::predict::estimate::batch_tensors(
            1,
            (128, 128),
            segtune::kinds::RunMode::Train,
        ),
        cublas_workspace: workspace,
        capacity: None,
        settings: Default::default(),
    };
    let r = replay(&events, &inputs);
    // The data loading on the CPU is not on the GPU, the copies and workspace are.
    let cpu_peak_without_batch = 95_759_580u64 - (image + label);
    let lower = cpu_peak_without_batch + image + label + workspace;
    assert!(r.peak_allocated >= lower, "{} < {lower}", r.peak_allocated);
    // 512-byte rounding and unsplit remainders add little at this size.
    let rounding_bound: u64 = events
        .iter()
        .filter(|e| e.bytes > 0)
        .map(|e| round_size(e.bytes as u64) - e.bytes as u64)
        .sum();
    assert!(
        r.peak_allocated <= lower + rounding_bound + (1 << 20) * 8,
        "{}",
        r.peak_allocated
    );
    assert!(r.peak_reserved >= r.peak_allocated);
    assert!(!r.out_of_memory);
    println!(
        "B0 1x128: CPU peak {} B; predicted CUDA peak allocated {} B, reserved {} B ({:?})",
        95_759_580, r.peak_allocated, r.peak_reserved, r.peak_phase
    );
    // A capacity below the peak makes the replay run out of memory.
    let tight = ReplayInputs {
        capacity: Some(r.peak_allocated / 2),
        settings: Default::default(),
        ..inputs
    };
    assert!(replay(&events, &tight).out_of_memory);
}
