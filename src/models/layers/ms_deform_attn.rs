//! mmcv's `MultiScaleDeformableAttention` (`mmcv/ops/multi_scale_deform_attn.py`)
//! in its pure-PyTorch form, `multi_scale_deformable_attn_pytorch`: what mmcv
//! runs where its compiled op is absent (mmcv-lite, and every CPU), sampling
//! each level's values with `grid_sample`.
//!
//! Zhu et al., "Deformable DETR: Deformable Transformers for End-to-End
//! Object Detection", ICLR 2021, arXiv:2010.04159.

use super::{checkpoint_inputs, mmcv_cuda_ops, softmax_saved, Linear};
use crate::models::params::ParamScope;
use tch::{Kind, Tensor};

/// `MultiScaleDeformableAttention(embed_dims, num_heads, num_levels,
/// num_points, dropout, batch_first=True)`.
pub struct MultiScaleDeformableAttention {
    sampling_offsets: Linear,
    attention_weights: Linear,
    value_proj: Linear,
    output_proj: Linear,
    num_heads: i64,
    num_levels: i64,
    num_points: i64,
    dropout: f64,
}

/// The levels the attention samples from: their `(H, W)` as host values
/// and as the int64 `[L, 2]` tensor mmdet passes around.
pub struct SpatialShapes {
    pub hw: Vec<(i64, i64)>,
    pub tensor: Tensor,
}

impl MultiScaleDeformableAttention {
    pub fn new(
        p: &mut ParamScope,
        embed_dims: i64,
        num_heads: i64,
        num_levels: i64,
        num_points: i64,
        dropout: f64,
    ) -> MultiScaleDeformableAttention {
        let (h, l, n) = (num_heads, num_levels, num_points);
        MultiScaleDeformableAttention {
            sampling_offsets: Linear::new(
                &mut p.sub("sampling_offsets"),
                embed_dims,
                h * l * n * 2,
                true,
            ),
            attention_weights: Linear::new(
                &mut p.sub("attention_weights"),
                embed_dims,
                h * l * n,
                true,
            ),
            value_proj: Linear::new(&mut p.sub("value_proj"), embed_dims, embed_dims, true),
            output_proj: Linear::new(&mut p.sub("output_proj"), embed_dims, embed_dims, true),
            num_heads,
            num_levels,
            num_points,
            dropout,
        }
    }

    /// Self-attention over the flattened levels (`key = value = query`):
    /// `query` `[B, N, C]`, `reference_points` `[B, N, L, 2]` in [0, 1],
    /// `key_padding_mask` bool `[B, N]`. Returns `dropout(out) + query`.
    pub fn forward(
        &self,
        query: &Tensor,
        query_pos: &Tensor,
        key_padding_mask: Option<&Tensor>,
        reference_points: &Tensor,
        shapes: &SpatialShapes,
        training: bool,
    ) -> Tensor {
        let (heads, levels, points) = (self.num_heads, self.num_levels, self.num_points);
        let identity = query;
        let value = query;
        let query = query + query_pos;
        let size = query.size();
        let (bs, num_query) = (size[0], size[1]);
        let num_value = value.size()[1];
        let mut value = self.value_proj.forward(value);
        if let Some(mask) = key_padding_mask {
            value = value.masked_fill(&mask.unsqueeze(-1), 0.0);
        }
        let value = value.view([bs, num_value, heads, -1]);
        let sampling_offsets = self
            .sampling_offsets
            .forward(&query)
            .view([bs, num_query, heads, levels, points, 2]);
        let logits =
            self.attention_weights
                .forward(&query)
                .view([bs, num_query, heads, levels * points]);
        let weights = logits.softmax(-1, None::<Kind>);
        softmax_saved(&logits, &weights);
        drop(logits);
        let attention_weights = weights.view([bs, num_query, heads, levels, points]);
        drop(weights);
        let ss = &shapes.tensor;
        let offset_normalizer = Tensor::stack(&[ss.select(-1, 1), ss.select(-1, 0)], -1);
        let sampling_locations = {
            let scaled = &sampling_offsets / offset_normalizer.view([1, 1, 1, levels, 1, 2]);
            reference_points.view([bs, num_query, 1, levels, 1, 2]) + scaled
        };
        let output = if mmcv_cuda_ops() {
            // MultiScaleDeformableAttnFunction (mmcv's CUDA kernel): the
            // locations and weights cast to the value's type and kept with
            // it; the backward allocates only the three gradients. The
            // values come from the PyTorch path run without grad, and again
            // with grad in the backward: the kernel's memory for what is
            // kept, transients in the backward beyond it.
            let locations = sampling_locations.to_kind(value.kind());
            let weights = attention_weights.to_kind(value.kind());
            let hw = shapes.hw.clone();
            checkpoint_inputs(
                &[value.shallow_clone(), locations, weights],
                move |t: &[Tensor]| multi_scale_deformable_attn_pytorch(&t[0], &hw, &t[1], &t[2]),
            )
        } else {
            multi_scale_deformable_attn_pytorch(
                &value,
                &shapes.hw,
                &sampling_locations,
                &attention_weights,
            )
        };
        let output = self.output_proj.forward(&output);
        output.dropout(self.dropout, training) + identity
    }
}

/// `multi_scale_deformable_attn_pytorch(value, value_spatial_shapes,
/// sampling_locations, attention_weights)`: `value` `[B, N, heads, C/heads]`,
/// `sampling_locations` `[B, Q, heads, L, P, 2]`, `attention_weights`
/// `[B, Q, heads, L, P]`; returns `[B, Q, C]`.
pub fn multi_scale_deformable_attn_pytorch(
    value: &Tensor,
    shapes: &[(i64, i64)],
    sampling_locations: &Tensor,
    attention_weights: &Tensor,
) -> Tensor {
    let vs = value.size();
    let (bs, num_heads, embed_dims) = (vs[0], vs[2], vs[3]);
    let ls = sampling_locations.size();
    let (num_queries, num_levels, num_points) = (ls[1], ls[3], ls[4]);
    let sizes: Vec<i64> = shapes.iter().map(|(h, w)| h * w).collect();
    let value_list = value.split_with_sizes(sizes.as_slice(), 1);
    let sampling_grids = sampling_locations * 2 - 1;
    let mut sampling_value_list = Vec::with_capacity(shapes.len());
    for (level, (h, w)) in shapes.iter().enumerate() {
        let value_l = value_list[level].flatten(2, -1).transpose(1, 2).reshape([
            bs * num_heads,
            embed_dims,
            *h,
            *w,
        ]);
        let grid_l = sampling_grids
            .select(3, level as i64)
            .transpose(1, 2)
            .flatten(0, 1);
        // F.grid_sample(mode='bilinear', padding_mode='zeros', align_corners=False)
        sampling_value_list.push(value_l.grid_sampler(&grid_l, 0, 0, false));
    }
    let weights = attention_weights.transpose(1, 2).reshape([
        bs * num_heads,
        1,
        num_queries,
        num_levels * num_points,
    ]);
    let output = (Tensor::stack(&sampling_value_list, -2).flatten(-2, -1) * &weights)
        .sum_dim_intlist(-1, false, None::<Kind>)
        .view([bs, num_heads * embed_dims, num_queries]);
    let output = output.transpose(1, 2).contiguous();
    drop((sampling_value_list, sampling_grids, value_list));
    output
}

#[cfg(test)]
#[path = "ms_deform_attn_tests.rs"]
mod tests;
