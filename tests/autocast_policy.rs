//! CUDA's autocast rules on the CPU (what a trial run `--as-cuda` uses): under them,
//! ops keep the dtypes a CUDA run gives them, and switching them off brings
//! libtorch's CPU rules back.

use segtune::trial::memory::{autocast_cuda_policy, AutocastGuard};
use tch::{Device, Kind, Tensor};

struct Dtypes {
    linear: Kind,
    softmax: Kind,
    layer_norm: Kind,
    upsample: Kind,
    gelu: Kind,
}

fn dtypes_under_autocast() -> Dtypes {
    let x = Tensor::randn([2, 4, 8, 8], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([8, 8], (Kind::Float, Device::Cpu));
    let half = x.to_kind(Kind::BFloat16);
    let _autocast = AutocastGuard::new(Device::Cpu, Kind::BFloat16).unwrap();
    Dtypes {
        linear: x.linear::<Tensor>(&w, None).kind(),
        softmax: half.softmax(-1, None::<Kind>).kind(),
        layer_norm: half
            .layer_norm([8], None::<Tensor>, None::<Tensor>, 1e-5, true)
            .kind(),
        upsample: half.upsample_bilinear2d([16, 16], false, None, None).kind(),
        gelu: half.gelu("none").kind(),
    }
}

#[test]
fn cuda_rules_apply_while_on_and_cpu_rules_return_after() {
    autocast_cuda_policy(true).unwrap();
    let cuda = dtypes_under_autocast();
    // CUDA: matmuls in half; softmax, layer_norm and upsampling in fp32; the rest as given.
    assert_eq!(cuda.linear, Kind::BFloat16);
    assert_eq!(cuda.softmax, Kind::Float);
    assert_eq!(cuda.layer_norm, Kind::Float);
    assert_eq!(cuda.upsample, Kind::Float);
    assert_eq!(cuda.gelu, Kind::BFloat16);

    autocast_cuda_policy(false).unwrap();
    let cpu = dtypes_under_autocast();
    // libtorch's CPU autocast leaves softmax, layer_norm and upsampling in bf16.
    assert_eq!(cpu.linear, Kind::BFloat16);
    assert_eq!(cpu.softmax, Kind::BFloat16);
    assert_eq!(cpu.layer_norm, Kind::BFloat16);
    assert_eq!(cpu.upsample, Kind::BFloat16);
}
