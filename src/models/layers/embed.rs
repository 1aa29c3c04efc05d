//! mmseg's `PatchEmbed` and `AdaptivePadding` (`mmseg/models/utils/embed.py`):
//! the strided convolution that turns an image into a sequence of patch
//! tokens, as the Swin and ViT backbones use it.

use super::{Conv2d, ConvSpec, LayerNorm, LayerNormCfg};
use crate::models::params::ParamScope;
use tch::Tensor;

/// `AdaptivePadding` in `corner` mode: zero padding at the bottom and right
/// so that a `kernel`/`stride` window covers the whole input (`None`: no
/// padding needed, and none is applied).
pub fn corner_padding(hw: (i64, i64), kernel: i64, stride: i64) -> Option<(i64, i64)> {
    let pad = |size: i64| {
        let out = (size + stride - 1) / stride;
        ((out - 1) * stride + kernel - size).max(0)
    };
    let (pad_h, pad_w) = (pad(hw.0), pad(hw.1));
    (pad_h > 0 || pad_w > 0).then_some((pad_h, pad_w))
}

/// `PatchEmbed(padding=...)`: a string pads adaptively (only `corner` is
/// implemented), a number is the convolution's own padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchPadding {
    Corner,
    Fixed(i64),
}

/// `PatchEmbed(in_channels, embed_dims, kernel_size, stride, padding, bias,
/// norm_cfg)`: the projection conv (`projection`), then an optional
/// LayerNorm (`norm`) on the `[B, h * w, C]` tokens.
pub struct PatchEmbed {
    projection: Conv2d,
    norm: Option<LayerNorm>,
    kernel: i64,
    stride: i64,
    padding: PatchPadding,
}

impl PatchEmbed {
    /// Non-overlapping patches (`kernel_size = stride = patch_size`), as
    /// ViT and BEiT cut their input.
    pub fn patchify(
        p: &mut ParamScope,
        in_channels: i64,
        embed_dims: i64,
        patch_size: i64,
        padding: PatchPadding,
        bias: bool,
        norm: Option<LayerNormCfg>,
    ) -> PatchEmbed {
        PatchEmbed::new(
            p,
            in_channels,
            embed_dims,
            patch_size,
            patch_size,
            padding,
            bias,
            norm,
        )
    }

    /// `p`: the embedding's scope (`patch_embed`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        p: &mut ParamScope,
        in_channels: i64,
        embed_dims: i64,
        kernel: i64,
        stride: i64,
        padding: PatchPadding,
        bias: bool,
        norm: Option<LayerNormCfg>,
    ) -> PatchEmbed {
        let conv_padding = match padding {
            PatchPadding::Corner => 0,
            PatchPadding::Fixed(pad) => pad,
        };
        let projection = Conv2d::new(
            &mut p.sub("projection"),
            ConvSpec::new(in_channels, embed_dims, kernel)
                .stride(stride)
                .padding(conv_padding)
                .bias(bias),
        );
        let norm = norm.map(|n| n.build(&mut p.sub("norm"), embed_dims));
        PatchEmbed {
            projection,
            norm,
            kernel,
            stride,
            padding,
        }
    }

    /// `x`: `[B, C, H, W]`; returns the `[B, h * w, C']` tokens (a
    /// transposed view of the conv's output, or the norm's output) and
    /// `(h, w)`.
    pub fn forward(&self, x: &Tensor) -> (Tensor, (i64, i64)) {
        let (h, w) = (x.size()[2], x.size()[3]);
        let mut x = x.shallow_clone();
        if self.padding == PatchPadding::Corner {
            if let Some((pad_h, pad_w)) = corner_padding((h, w), self.kernel, self.stride) {
                x = x.pad([0, pad_w, 0, pad_h], "constant", None);
            }
        }
        x = self.projection.forward(&x);
        let out_size = (x.size()[2], x.size()[3]);
        x = x.flatten(2, -1).transpose(1, 2);
        if let Some(norm) = &self.norm {
            x = norm.forward(&x);
        }
        (x, out_size)
    }
}

#[cfg(test)]
#[path = "embed_tests.rs"]
mod tests;
