//! CUDA's autocast rules on the CPU (what a trial run `--as-cuda` uses): under them,
//! ops keep the dtypes a CUDA run gives them, and switching them off brings
//! libtorch's CPU rules back.

use segtune::kinds::TorchVersion;
use segtune::trial::memory::{autocast_cuda_policy, autocast_cuda_release, AutocastGuard};
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

/// The autocast rules are process-wide: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn cuda_rules_apply_while_on_and_cpu_rules_return_after() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
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

#[test]
fn each_release_casts_by_its_own_lists() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    autocast_cuda_policy(true).unwrap();
    let at = |major, minor| {
        autocast_cuda_release(TorchVersion::new(major, minor)).unwrap();
        dtypes_under_autocast()
    };
    // Upsampling joined the fp32 list in 2.4: before, it stays in half.
    assert_eq!(at(2, 3).upsample, Kind::BFloat16);
    assert_eq!(at(2, 4).upsample, Kind::Float);
    // gelu was in the fp32 list up to 1.9 (pytorch#59639 removed it).
    assert_eq!(at(1, 9).gelu, Kind::Float);
    assert_eq!(at(1, 10).gelu, Kind::BFloat16);
    // What never moved: matmuls in half, softmax and layer_norm in fp32.
    let old = at(1, 8);
    assert_eq!(old.linear, Kind::BFloat16);
    assert_eq!(old.softmax, Kind::Float);
    assert_eq!(old.layer_norm, Kind::Float);
    let newest = at(2, 11);
    assert_eq!(newest.upsample, Kind::Float);
    assert_eq!(newest.gelu, Kind::BFloat16);
    autocast_cuda_policy(false).unwrap();
    assert!(
        autocast_cuda_release(TorchVersion::new(2, 3)).is_err(),
        "a release's lists need the CUDA policy on"
    );
}
