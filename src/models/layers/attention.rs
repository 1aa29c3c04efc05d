//! `nn.MultiheadAttention` (`torch/nn/modules/activation.py`,
//! `F.multi_head_attention_forward`), as mmcv's `MultiheadAttention` wrapper
//! and MMSeg's attention modules call it.

use super::linear::Linear;
use super::{count_flops, softmax_saved};
use crate::models::params::ParamScope;
use tch::{Kind, Tensor};

/// `_in_projection_packed`'s reshape of a packed projection `(..., n * E)`
/// into a contiguous `(n, ..., E)`. Python rebinds the name: the packed
/// projection dies once its copy exists, as it does here (moved in).
fn unpack(packed: Tensor, n: i64, e: i64) -> Tensor {
    packed
        .unflatten(-1, [n, e])
        .unsqueeze(0)
        .transpose(0, -2)
        .squeeze_dim(-2)
        .contiguous()
}

/// `nn.MultiheadAttention` in training mode with `need_weights=True` (its
/// default): the explicit `(B*heads, L, S)` attention matrix is computed and
/// kept for backward, and the head-averaged weights are computed too, as
/// `F.multi_head_attention_forward` does.
pub struct MultiheadAttention {
    in_proj_weight: Tensor,
    in_proj_bias: Option<Tensor>,
    out_proj: Linear,
    embed_dims: i64,
    num_heads: i64,
}

impl MultiheadAttention {
    pub fn new(
        p: &mut ParamScope,
        embed_dims: i64,
        num_heads: i64,
        bias: bool,
    ) -> MultiheadAttention {
        let bound = (6.0 / (embed_dims + 3 * embed_dims) as f64).sqrt();
        let in_proj_weight =
            p.param_uniform("in_proj_weight", &[3 * embed_dims, embed_dims], bound);
        let in_proj_bias = bias.then(|| p.param_zeros("in_proj_bias", &[3 * embed_dims]));
        let out_proj = Linear::new(&mut p.sub("out_proj"), embed_dims, embed_dims, bias);
        MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
            embed_dims,
            num_heads,
        }
    }

    /// `query`: (L, B, E); `key_value`: (S, B, E), one tensor used as both
    /// key and value (the `k is v` branch of `_in_projection_packed`).
    pub fn forward(&self, query: &Tensor, key_value: &Tensor) -> Tensor {
        let e = self.embed_dims;
        let (tgt_len, bsz) = (query.size()[0], query.size()[1]);
        let src_len = key_value.size()[0];
        let w = self.in_proj_weight.split_with_sizes([e, 2 * e], 0);
        let (q, kv) = match &self.in_proj_bias {
            Some(b) => {
                let b = b.split_with_sizes([e, 2 * e], 0);
                (
                    query.linear(&w[0], Some(&b[0])),
                    key_value.linear(&w[1], Some(&b[1])),
                )
            }
            None => (
                query.linear::<Tensor>(&w[0], None),
                key_value.linear::<Tensor>(&w[1], None),
            ),
        };
        let kv = unpack(kv, 2, e);
        let (k, v) = (kv.select(0, 0), kv.select(0, 1));
        // the in-projections (the out-projection counts itself)
        count_flops(2.0 * ((tgt_len * bsz) * e * e + (src_len * bsz) * 2 * e * e) as f64);
        self.attend(q, k, v, None, 0.0, tgt_len, bsz, src_len)
    }

    /// Self-attention, `query`, `key` and `value` one tensor `x`: (L, B, E)
    /// (the `q is k is v` branch of `_in_projection_packed`: one packed
    /// projection, made contiguous as (3, L, B, E)).
    pub fn forward_self(&self, x: &Tensor) -> Tensor {
        let e = self.embed_dims;
        let (len, bsz) = (x.size()[0], x.size()[1]);
        let proj = unpack(
            x.linear(&self.in_proj_weight, self.in_proj_bias.as_ref()),
            3,
            e,
        );
        count_flops(2.0 * ((len * bsz) * 3 * e * e) as f64);
        let (q, k, v) = (proj.select(0, 0), proj.select(0, 1), proj.select(0, 2));
        drop(proj);
        self.attend(q, k, v, None, 0.0, len, bsz, len)
    }

    /// `query`: (L, B, E); `key`, `value`: (S, B, E), distinct tensors (the
    /// `w.chunk(3)` branch of `_in_projection_packed`). `attn_mask`: bool
    /// `(B*heads, L, S)`, true where attention is not allowed; made a float
    /// mask of `-inf` by `_canonical_mask` and added by `baddbmm`.
    pub fn forward_separate(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        attn_mask: Option<&Tensor>,
    ) -> Tensor {
        let (tgt_len, bsz) = (query.size()[0], query.size()[1]);
        let src_len = key.size()[0];
        let float_mask = attn_mask.map(|m| neg_inf_mask(m, query.kind()));
        let (q, k, v) = self.project_chunked(query, key, value);
        self.attend(q, k, v, float_mask.as_ref(), 0.0, tgt_len, bsz, src_len)
    }

    /// `query`: (L, B, E); `key`, `value`: (S, B, E), distinct tensors, as
    /// mmdet's DETR layers call it: `key_padding_mask` bool `(B, S)` (made a
    /// float mask of `-inf` by `_canonical_mask`, then viewed, expanded and
    /// reshaped to a `(B*heads, 1, S)` copy added by `baddbmm`) and
    /// `dropout` (`attn_drop`) on the attention weights while training.
    pub fn forward_detr(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        key_padding_mask: Option<&Tensor>,
        dropout: f64,
        training: bool,
    ) -> Tensor {
        let (tgt_len, bsz) = (query.size()[0], query.size()[1]);
        let src_len = key.size()[0];
        // nn.MultiheadAttention.forward's `_canonical_mask`.
        let float_padding = key_padding_mask.map(|m| neg_inf_mask(m, query.kind()));
        let (q, k, v) = self.project_chunked(query, key, value);
        let attn_mask = float_padding.map(|m| {
            m.view([bsz, 1, 1, src_len])
                .expand([-1, self.num_heads, -1, -1], false)
                .reshape([bsz * self.num_heads, 1, src_len])
        });
        let drop = if training { dropout } else { 0.0 };
        self.attend(q, k, v, attn_mask.as_ref(), drop, tgt_len, bsz, src_len)
    }

    /// The `w.chunk(3)` in-projections of distinct query, key and value
    /// (the out-projection counts its own flops).
    fn project_chunked(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
    ) -> (Tensor, Tensor, Tensor) {
        let e = self.embed_dims;
        let (tgt_len, bsz) = (query.size()[0], query.size()[1]);
        let src_len = key.size()[0];
        let w = self.in_proj_weight.chunk(3, 0);
        let b = self.in_proj_bias.as_ref().map(|b| b.chunk(3, 0));
        let bias = |i: usize| b.as_ref().map(|b| &b[i]);
        let q = query.linear(&w[0], bias(0));
        let k = key.linear(&w[1], bias(1));
        let v = value.linear(&w[2], bias(2));
        count_flops(2.0 * ((tgt_len * bsz) * e * e + (src_len * bsz) * 2 * e * e) as f64);
        (q, k, v)
    }

    /// From the in-projected q, k, v to the out-projection, as the
    /// `need_weights=True` branch of `F.multi_head_attention_forward`
    /// (`dropout`: its `dropout_p`, zero unless training).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        float_mask: Option<&Tensor>,
        dropout: f64,
        tgt_len: i64,
        bsz: i64,
        src_len: i64,
    ) -> Tensor {
        let (e, heads) = (self.embed_dims, self.num_heads);
        let head_dim = e / heads;
        let q = q.view([tgt_len, bsz * heads, head_dim]).transpose(0, 1);
        let k = k.view([src_len, bsz * heads, head_dim]).transpose(0, 1);
        let v = v.view([src_len, bsz * heads, head_dim]).transpose(0, 1);
        count_flops(2.0 * 2.0 * (bsz * heads * tgt_len * src_len * head_dim) as f64);
        let q_scaled = q * (1.0 / head_dim as f64).sqrt();
        let logits = match float_mask {
            Some(mask) => mask.baddbmm(&q_scaled, &k.transpose(-2, -1), 1, 1),
            None => q_scaled.bmm(&k.transpose(-2, -1)),
        };
        let mut weights = logits.softmax(-1, None::<Kind>);
        softmax_saved(&logits, &weights);
        drop(logits);
        if dropout > 0.0 {
            weights = weights.dropout(dropout, true);
        }
        let out = weights.bmm(&v);
        let out = out.transpose(0, 1).contiguous().view([tgt_len * bsz, e]);
        let out = self.out_proj.forward(&out).view([tgt_len, bsz, e]);
        // The averaged weights are returned (and dropped) by nn.MultiheadAttention.
        let _averaged =
            weights
                .view([bsz, heads, tgt_len, src_len])
                .mean_dim(1, false, None::<Kind>);
        out
    }
}

/// `_canonical_mask`: a bool mask (true where attention is not allowed) as a
/// float mask of `-inf` in the query's dtype.
fn neg_inf_mask(mask: &Tensor, kind: Kind) -> Tensor {
    let mut f = Tensor::zeros(mask.size(), (kind, mask.device()));
    let _ = f.masked_fill_(mask, f64::NEG_INFINITY);
    f
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
