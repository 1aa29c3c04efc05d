//! `DNLHead`, the disentangled non-local head, as MMSeg's
//! `mmseg/models/decode_heads/dnl_head.py` builds it: an FCNHead with two
//! convs and `DisentangledNonLocal2d` between them (the non-local block of
//! `nl_head.rs` with its pairwise term whitened, a temperature in the
//! softmax, and a unary term from a 1x1 `conv_mask`).
//!
//! Yin et al., "Disentangled Non-Local Neural Networks", ECCV 2020,
//! arXiv:2006.06668.

use super::nl_head::build_with_block;
use super::DecodeHead;
use crate::config::Dict;
use crate::models::params::ParamScope;
use crate::models::ModelError;

const SOURCE: &str = "mmseg/models/decode_heads/dnl_head.py";

/// The registry's constructor (`DECODE_HEADS` row `DNLHead`):
/// `DNLHead(reduction=2, use_scale=True, mode='embedded_gaussian',
/// temperature=0.05, **kwargs)` over `FCNHead(num_convs=2, **kwargs)`.
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    build_with_block(p, cfg, ("DNLHead", SOURCE), Some(0.05), "dnl_block")
}

#[cfg(test)]
#[path = "dnl_head_tests.rs"]
mod tests;
