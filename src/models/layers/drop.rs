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
