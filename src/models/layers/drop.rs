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
