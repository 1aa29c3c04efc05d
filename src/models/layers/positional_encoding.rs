//! Position codes of the DETR family as mmdet builds them:
//! `SinePositionalEncoding` (`mmdet/models/layers/positional_encoding.py`)
//! and the grid of `MlvlPointGenerator.single_level_grid_priors`
//! (`mmdet/models/task_modules/prior_generators/point_generator.py`).
//!
//! Carion et al., "End-to-End Object Detection with Transformers", ECCV
//! 2020, arXiv:2005.12872 (the sine encoding).

use tch::{Device, Kind, Tensor};

/// `SinePositionalEncoding(num_feats, temperature=10000, normalize, scale=2*pi,
/// eps=1e-6, offset=0.)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SinePositionalEncoding {
    pub num_feats: i64,
    pub temperature: f64,
    pub normalize: bool,
    pub scale: f64,
    pub eps: f64,
    pub offset: f64,
}

impl SinePositionalEncoding {
    pub fn new(num_feats: i64, normalize: bool) -> SinePositionalEncoding {
        SinePositionalEncoding {
            num_feats,
            temperature: 10000.0,
            normalize,
            scale: 2.0 * std::f64::consts::PI,
            eps: 1e-6,
            offset: 0.0,
        }
    }

    /// `mask`: bool `[B, H, W]`, true at padding. Returns `[B, 2*num_feats, H, W]`
    /// (a permuted view of a `[B, H, W, 2*num_feats]` tensor).
    pub fn forward(&self, mask: &Tensor) -> Tensor {
        let size = mask.size();
        let (b, h, w) = (size[0], size[1], size[2]);
        let mask = mask.to_kind(Kind::Int);
        let not_mask = mask.rsub_scalar(1);
        let mut y_embed = not_mask.cumsum(1, Kind::Float);
        let mut x_embed = not_mask.cumsum(2, Kind::Float);
        if self.normalize {
            let y = (&y_embed + self.offset) / (y_embed.slice(1, -1, None, 1) + self.eps);
            y_embed = y * self.scale;
            let x = (&x_embed + self.offset) / (x_embed.slice(2, -1, None, 1) + self.eps);
            x_embed = x * self.scale;
        }
        let mut dim_t = Tensor::arange(self.num_feats, (Kind::Float, mask.device()));
        let exponent = dim_t.floor_divide_scalar(2) * 2 / self.num_feats as f64;
        dim_t = Tensor::pow_scalar(self.temperature, &exponent);
        drop(exponent);
        let pos_x = x_embed.unsqueeze(3) / &dim_t;
        let pos_y = y_embed.unsqueeze(3) / &dim_t;
        let interleave = |pos: &Tensor| {
            let sin = pos.slice(3, 0, None, 2).sin();
            let cos = pos.slice(3, 1, None, 2).cos();
            Tensor::stack(&[sin, cos], 4).view([b, h, w, -1])
        };
        let pos_x = interleave(&pos_x);
        let pos_y = interleave(&pos_y);
        Tensor::cat(&[pos_y, pos_x], 3).permute([0, 3, 1, 2])
    }
}

/// `MlvlPointGenerator(strides, offset=0.5).single_level_grid_priors`: the
/// centres of an `h x w` grid of cells `stride` pixels wide, `[h*w, 2]` as
/// (x, y), row-major.
pub fn grid_priors(h: i64, w: i64, stride: i64, device: Device) -> Tensor {
    let shift_x = (Tensor::arange(w, (Kind::Int64, device)) + 0.5) * stride;
    let shift_y = (Tensor::arange(h, (Kind::Int64, device)) + 0.5) * stride;
    let xx = shift_x.repeat([h]);
    let yy = shift_y.view([-1, 1]).repeat([1, w]).view([-1]);
    Tensor::stack(&[xx, yy], -1)
}

#[cfg(test)]
#[path = "positional_encoding_tests.rs"]
mod tests;
