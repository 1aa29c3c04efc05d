use super::*;
use crate::trial::op_work::OpWork;
use crate::trial::trace::phase_code;

fn op(phase: u32, name: &str, bytes: u64) -> OpWork {
    OpWork {
        phase,
        op: name.into(),
        in_bytes: bytes,
        out_bytes: bytes,
        view: false,
    }
}

fn card() -> Card {
    Card {
        fp32_tflops: 35.6,
        tf32_tflops: 35.6,
        fp16_tflops: 71.0,
        bf16_tflops: 71.0,
        bandwidth_gbs: 936.0,
        link_gbs: 31.5,
        host_link_gbs: 12.0,
        tensor_cores: true,
        l2_bytes: 6.0 * 1048576.0,
    }
}

fn setup() -> SpeedSetup {
    SpeedSetup {
        mode: RunMode::Train,
        amp: Amp::Off,
        gpus: 1,
        accumulation: 1,
        input_bytes: 0.0,
    }
}

fn step(ops: Vec<OpWork>) -> TracedStep {
    TracedStep {
        events: Vec::new(),
        kernel_calls: Vec::new(),
        cpu_peak_bytes: 0,
        forward_flops: 0.0,
        recompute_flops: 0.0,
        model_scopes: Vec::new(),
        ops,
    }
}

/// Many tiny kernels are bound by the host's dispatch, a few large ones by
/// the memory: the step is the larger, not the sum of rooflines.
#[test]
fn small_kernels_are_bound_by_dispatch_and_large_ones_by_bandwidth() {
    let forward = phase_code(1, crate::trial::trace::Phase::Forward);
    let tiny = step(
        (0..1000)
            .map(|_| op(forward, "aten::add.Tensor", 1024))
            .collect(),
    );
    let work = StepWork::from_trace(&tiny, Amp::Off).unwrap();
    let t = work.time(&card(), &setup());
    let e = Efficiencies::FITTED;
    assert!(
        (t.step_s - 1000.0 * e.forward_dispatch_s).abs() / t.step_s < 0.05,
        "{t:?}"
    );
    assert!(t.overhead_s > 0.5 * t.step_s);

    let large = step(
        (0..10)
            .map(|_| op(forward, "aten::add.Tensor", 1 << 30))
            .collect(),
    );
    let t = StepWork::from_trace(&large, Amp::Off)
        .unwrap()
        .time(&card(), &setup());
    let streaming = 10.0 * 2.0 * (1u64 << 30) as f64 / (936e9 * e.bandwidth);
    assert!((t.step_s - streaming).abs() / streaming < 0.01, "{t:?}");
}

/// Only the measured (last) step counts, views launch nothing, and the
/// optimizer's per-parameter ops become for-each launches.
#[test]
fn the_last_step_counts_and_the_optimizer_runs_for_each_kernels() {
    let mut ops = Vec::new();
    for step_index in [1, 2] {
        let code = |p| phase_code(step_index, p);
        ops.push(op(
            code(crate::trial::trace::Phase::Forward),
            "aten::relu",
            4096,
        ));
        ops.push(OpWork {
            view: true,
            ..op(
                code(crate::trial::trace::Phase::Forward),
                "aten::view",
                4096,
            )
        });
        for _ in 0..100 {
            ops.push(op(
                code(crate::trial::trace::Phase::Optimizer),
                "aten::mul_.Scalar",
                400,
            ));
            ops.push(op(
                code(crate::trial::trace::Phase::Optimizer),
                "aten::addcdiv_",
                1200,
            ));
        }
    }
    let work = StepWork::from_trace(&step(ops), Amp::Off).unwrap();
    let forward: Vec<_> = work
        .kernels
        .iter()
        .filter(|k| k.part == Part::Forward)
        .collect();
    assert_eq!(forward.len(), 1);
    assert_eq!(forward[0].view_dispatches, 0);
    let optimizer: Vec<_> = work
        .kernels
        .iter()
        .filter(|k| k.part == Part::Optimizer)
        .collect();
    assert_eq!(optimizer.len(), 2);
    assert_eq!(
        optimizer[0].launches,
        100usize.div_ceil(FOREACH_MAX_TENSORS) as u32
    );
    assert_eq!(work.gradient_bytes, 100.0 * 400.0);
    // Accumulation spreads the optimizer over its micro-steps.
    let one = work.time(&card(), &setup());
    let four = work.time(
        &card(),
        &SpeedSetup {
            accumulation: 4,
            ..setup()
        },
    );
    assert!(four.step_s < one.step_s);
    assert!((four.optimizer_s - one.optimizer_s / 4.0).abs() < 1e-12);
}

/// Half precision GEMMs are faster only on a card with tensor cores.
#[test]
fn half_precision_is_faster_only_with_tensor_cores() {
    let ampere = card();
    let pascal = Card {
        fp32_tflops: 11.3,
        tf32_tflops: 0.0,
        fp16_tflops: 0.18,
        bf16_tflops: 0.0,
        tensor_cores: false,
        ..card()
    };
    assert!(ampere.math_rate(KernelClass::Gemm, DataType::F16).1);
    assert_eq!(
        pascal.math_rate(KernelClass::Gemm, DataType::F16),
        (11.3, false)
    );
    let a100 = Card {
        fp32_tflops: 19.5,
        tf32_tflops: 156.0,
        ..card()
    };
    assert!(
        a100.math_rate(KernelClass::Conv, DataType::F32).1,
        "TF32 convolutions"
    );
    assert!(
        !a100.math_rate(KernelClass::Gemm, DataType::F32).1,
        "fp32 matmuls"
    );
    assert!(
        !ampere.math_rate(KernelClass::Gemm, DataType::F32).1,
        "fp32 matmuls"
    );
}
