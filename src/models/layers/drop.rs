//! mmcv's `DropPath` (`mmcv/cnn/bricks/drop.py`).

use tch::Tensor;

/// mmcv's `DropPath` (stochastic depth), as `drop_path()` computes it.
pub struct DropPath {
    pub prob: f64,
}

impl DropPath {
    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        if self.prob == 0.0 || !training {
            return x.shallow_clone();
        }
        let keep = 1.0 - self.prob;
        let mut shape = vec![x.size()[0]];
        shape.extend(std::iter::repeat_n(1, x.dim() - 1));
        let random = Tensor::rand(&shape, (x.kind(), x.device())) + keep;
        x.g_div_scalar(keep) * random.floor()
    }
}

/// `[x.item() for x in torch.linspace(0, rate, n)]`: the per-block drop path
/// rates of MMSeg's transformer backbones, computed in float32 as torch does.
pub fn linspace_drop_path_rates(rate: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|i| {
            if n == 1 {
                0.0
            } else {
                (rate as f32 * i as f32 / (n - 1) as f32) as f64
            }
        })
        .collect()
}

/// `F.dropout(x, p, training)` (`nn.Dropout`), element-wise. On the CPU
/// `at::dropout` draws a float noise tensor and keeps it for backward (4
/// bytes an element); on CUDA it takes the fused `native_dropout`, which
/// keeps a bool mask (1 byte). A CPU trial standing in for CUDA
/// (`--as-cuda`, see [`super::emulate_mmcv_cuda_ops`]) keeps a bool mask
/// too: `x * mask` saves only the mask (the other operand needs no grad),
/// and the scale is applied in place.
pub fn dropout(x: &Tensor, p: f64, training: bool) -> Tensor {
    if p == 0.0 || !training || x.numel() == 0 {
        return x.shallow_clone();
    }
    if !super::mmcv_cuda_ops() || p >= 1.0 {
        return x.dropout(p, training);
    }
    let mut keep = Tensor::empty(x.size(), (tch::Kind::Bool, x.device()));
    let _ = keep.bernoulli_float_(1.0 - p);
    let mut out = x * &keep;
    drop(keep);
    let _ = out.g_mul_scalar_(1.0 / (1.0 - p));
    out
}

#[cfg(test)]
#[path = "drop_tests.rs"]
mod tests;
