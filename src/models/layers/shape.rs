//! Layout changes and resizing: mmseg's `nlc_to_nchw` / `nchw_to_nlc`
//! (`mmseg/models/utils/shape_convert.py`), `resize`
//! (`mmseg/models/utils/wrappers.py`), and SETR's LayerNorm over channels.

use super::LayerNorm;
use tch::Tensor;

/// mmseg's `nlc_to_nchw`: `x.transpose(1, 2).reshape(B, C, H, W)` (a copy).
pub fn nlc_to_nchw(x: &Tensor, hw: (i64, i64)) -> Tensor {
    let s = x.size();
    x.transpose(1, 2).reshape([s[0], s[2], hw.0, hw.1])
}

/// mmseg's `nchw_to_nlc`: `x.flatten(2).transpose(1, 2).contiguous()`.
pub fn nchw_to_nlc(x: &Tensor) -> Tensor {
    x.flatten(2, -1).transpose(1, 2).contiguous()
}

/// mmseg's `resize` (F.interpolate, bilinear, to a size).
pub fn resize_bilinear(x: &Tensor, size: (i64, i64), align_corners: bool) -> Tensor {
    x.upsample_bilinear2d([size.0, size.1], align_corners, None, None)
}

/// A LayerNorm over a `[N, C, H, W]` map's channels, as SETR writes it:
/// `reshape(n, c, h*w).transpose(2, 1).contiguous()`, the norm, then
/// `transpose(1, 2).reshape(n, c, h, w).contiguous()` (a copy each way).
pub fn channel_layer_norm(norm: &LayerNorm, x: &Tensor) -> Tensor {
    let s = x.size();
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let tokens = x.reshape([n, c, h * w]).transpose(2, 1).contiguous();
    let tokens = norm.forward(&tokens);
    tokens.transpose(1, 2).reshape([n, c, h, w]).contiguous()
}

#[cfg(test)]
#[path = "shape_tests.rs"]
mod tests;
