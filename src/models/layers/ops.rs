//! Ops MMSeg takes from mmcv or calls with arguments tch's bindings lack:
//! `point_sample`, and `histc` and `PSAMask` through the C++ shim
//! (`src/shim/shim.cpp`, `shim_psamask.cpp`; declared in `crate::shim::ffi`).

use crate::shim::ffi::{self, segtune_histc, segtune_psamask};
use tch::Tensor;

/// A new tensor from the shim, or the shim's error as a panic (as tch's
/// own ops panic on a libtorch error). `p` is what `call` just returned.
fn owned(p: *mut torch_sys::C_tensor, call: &'static str) -> Tensor {
    // SAFETY: the shim's ops return null or a new heap tensor.
    unsafe { ffi::owned_tensor(p, call) }.unwrap_or_else(|e| panic!("{e}"))
}

/// mmcv's `PSAMask(psa_type, mask_size)` (`'collect'` or `'distribute'`):
/// `[N, h_mask * w_mask, H, W]` -> `[N, H * W, H, W]`, a custom autograd
/// function saving its input, as mmcv's compiled op (`shim_psamask.cpp`).
pub fn psamask(input: &Tensor, collect: bool, mask: (i64, i64)) -> Tensor {
    let values = !super::host::values_unavailable();
    // SAFETY: a live tensor; the shim copies the reference.
    owned(
        unsafe { segtune_psamask(input.as_ptr(), collect, mask.0, mask.1, values) },
        "segtune_psamask",
    )
}

/// `t.histc(bins, min, max)` (tch's `histc` takes `bins` only).
pub fn histc(t: &Tensor, bins: i64, min: f64, max: f64) -> Tensor {
    // SAFETY: a live tensor; the shim copies the reference.
    owned(
        unsafe { segtune_histc(t.as_ptr(), bins, min, max) },
        "segtune_histc",
    )
}

/// mmcv's `point_sample(input, points, align_corners, mode)`
/// (`mmcv/ops/point_sample.py`): `input` `[N, C, H, W]`, `points`
/// `[N, P, 2]` in [0, 1]; `F.grid_sample` (bilinear, or nearest) at
/// `2 * points - 1`; returns `[N, C, P]`.
pub fn point_sample(input: &Tensor, points: &Tensor, nearest: bool, align_corners: bool) -> Tensor {
    let points = points.unsqueeze(2);
    let grid = points * 2.0 - 1.0;
    input
        .grid_sampler(&grid, i64::from(nearest), 0, align_corners)
        .squeeze_dim(3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// mmcv's kernels (`psamask_collect_forward` / `_distribute_forward`)
    /// written the other way round: for every output element, the mask
    /// element it holds, or none.
    fn expected(
        collect: bool,
        oc: i64,
        oh: i64,
        ow: i64,
        dims: (i64, i64, i64, i64),
    ) -> Option<(i64, i64, i64)> {
        let (_, w, hm, wm) = dims;
        let (half_h, half_w) = ((hm - 1) / 2, (wm - 1) / 2);
        let (row, col) = (oc / w, oc % w);
        // collect: window of pixel (oh, ow) placed at channel (row, col);
        // distribute: window of pixel (row, col) placed at (oh, ow).
        let (pixel, target) = if collect {
            ((oh, ow), (row, col))
        } else {
            ((row, col), (oh, ow))
        };
        let hidx = target.0 - pixel.0 + half_h;
        let widx = target.1 - pixel.1 + half_w;
        ((0..hm).contains(&hidx) && (0..wm).contains(&widx)).then_some((
            hidx * wm + widx,
            pixel.0,
            pixel.1,
        ))
    }

    #[test]
    fn psamask_places_each_window_as_mmcvs_kernel_and_routes_gradients_back() {
        let dims = (3, 4, 5, 3);
        let (h, w, hm, wm) = dims;
        for collect in [true, false] {
            let input = Tensor::arange(hm * wm * h * w, (Kind::Float, Device::Cpu))
                .view([1, hm * wm, h, w])
                .set_requires_grad(true);
            let out = psamask(&input, collect, (hm, wm));
            assert_eq!(out.size(), [1, h * w, h, w]);
            let weights = Tensor::rand([1, h * w, h, w], (Kind::Float, Device::Cpu));
            (&out * &weights).sum(Kind::Float).backward();
            let grad = input.grad();
            let mut grad_expected = vec![0f32; (hm * wm * h * w) as usize];
            for oc in 0..h * w {
                for oh in 0..h {
                    for ow in 0..w {
                        let got = out.double_value(&[0, oc, oh, ow]);
                        match expected(collect, oc, oh, ow, dims) {
                            Some((mc, ph, pw)) => {
                                assert_eq!(
                                    got,
                                    input.double_value(&[0, mc, ph, pw]),
                                    "{collect} {oc} {oh} {ow}"
                                );
                                grad_expected[((mc * h + ph) * w + pw) as usize] +=
                                    weights.double_value(&[0, oc, oh, ow]) as f32;
                            }
                            None => assert_eq!(got, 0.0, "{collect} {oc} {oh} {ow}"),
                        }
                    }
                }
            }
            let grad_expected = Tensor::from_slice(&grad_expected).view([1, hm * wm, h, w]);
            assert!(
                grad.allclose(&grad_expected, 1e-6, 1e-6, false),
                "{collect}"
            );
        }
    }
}
