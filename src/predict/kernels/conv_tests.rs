use super::*;

fn call(line: &str) -> KernelCall {
    KernelCall::from_line(line).unwrap()
}

#[test]
fn a_forward_call_gives_the_problem_and_its_output_size() {
    let c = conv_call(
        &call("k 5 9 2 aten::convolution t:f32:2x64x128x256 t:f32:128x64x3x3 - l:2,2 l:1,1 l:1,1 b:0 l:0,0 i:1"),
        false,
    )
    .unwrap();
    assert_eq!(
        (
            c.problem.n,
            c.problem.c,
            c.problem.h,
            c.problem.w,
            c.problem.k
        ),
        (2, 64, 128, 256, 128)
    );
    assert_eq!((c.problem.ho, c.problem.wo), (64, 128));
    assert_eq!(c.directions, vec![Direction::Forward]);
    assert_eq!(c.backend, ConvBackend::Cudnn);
    assert_eq!(
        c.problem.flops(),
        2.0 * (2 * 128 * 64 * 9 * 64 * 128) as f64
    );
}

#[test]
fn a_backward_call_runs_the_directions_its_mask_asks_for() {
    // The stem's first convolution: no gradient of the image.
    let c = conv_call(
        &call("k 5 10 2 aten::convolution_backward t:bf16:2x32x64x64 t:bf16:2x3x128x128 t:bf16:32x3x3x3 l:32 l:2,2 l:1,1 l:1,1 b:0 l:0,0 i:1 m:0,1,1"),
        true,
    )
    .unwrap();
    assert_eq!(c.directions, vec![Direction::BackwardFilter]);
    assert_eq!(
        c.problem.dtype,
        DataType::F16,
        "bf16 stands for fp16 under --amp fp16"
    );
    assert_eq!((c.problem.ho, c.problem.wo), (64, 64));
}

#[test]
fn a_transposed_convolution_swaps_forward_and_backward_data() {
    // ConvTranspose2d(64 -> 32, 2, stride 2) on 1x64x16x16 gives 1x32x32x32.
    let c = conv_call(
        &call("k 0 9 0 aten::convolution t:f32:1x64x16x16 t:f32:64x32x2x2 - l:2,2 l:0,0 l:1,1 b:1 l:0,0 i:1"),
        false,
    )
    .unwrap();
    assert_eq!(c.directions, vec![Direction::BackwardData]);
    let p = c.problem;
    assert_eq!((p.c, p.h, p.w, p.k, p.ho, p.wo), (32, 32, 32, 64, 16, 16));
}

#[test]
fn depthwise_convolutions_run_cudnn_only_where_pytorch_sends_them() {
    let dw = |dtype: &str, layout: &str, dilation: i64| {
        conv_call(
            &call(&format!("k 0 9 0 aten::convolution t:{dtype}:2x64x32x32{layout} t:{dtype}:64x1x3x3{layout} - l:1,1 l:{dilation},{dilation} l:{dilation},{dilation} b:0 l:0,0 i:64")),
            true,
        )
        .unwrap()
        .backend
    };
    assert_eq!(dw("f32", "", 1), ConvBackend::CudaDepthwise2d);
    assert_eq!(
        dw("bf16", "", 1),
        ConvBackend::Cudnn,
        "fp16 NCHW, 64 channels"
    );
    assert_eq!(dw("bf16", "", 2), ConvBackend::CudaDepthwise2d, "dilated");
    assert_eq!(dw("f32", ":cl", 1), ConvBackend::Cudnn, "channels-last");
}
