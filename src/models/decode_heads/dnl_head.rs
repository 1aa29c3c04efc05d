//! `DNLHead`, the disentangled non-local head, as MMSeg's
//! `mmseg/models/decode_heads/dnl_head.py` builds it: an FCNHead with two
//! convs and `DisentangledNonLocal2d` between them (the non-local block of
//! `nl_head.rs` with its pairwise term whitened, a temperature in the
//! softmax, and a unary term from a 1x1 `conv_mask`).
//!
//! Yin et al., "Disentangled Non-Local Neural Networks", ECCV 2020,
//! arXiv:2006.06668.

use super::fcn_head::{FcnHead, FcnHeadCfg};
use super::nl_head::{NonLocal2d, NonLocalCfg};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::params::ParamScope;
use crate::models::ModelError;

const SOURCE: &str = "mmseg/models/decode_heads/dnl_head.py";

/// The registry's constructor (`DECODE_HEADS` row `DNLHead`):
/// `DNLHead(reduction=2, use_scale=True, mode='embedded_gaussian',
/// temperature=0.05, **kwargs)` over `FCNHead(num_convs=2, **kwargs)`.
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "DNLHead", SOURCE);
    let block = NonLocalCfg::read(&mut c, Some(0.05))?;
    let fcn = FcnHeadCfg::read(&mut c, Some(2))?;
    c.finish()?;
    Ok(Box::new(FcnHead::with_block(
        p,
        fcn,
        |p, channels, norm| {
            Box::new(NonLocal2d::new(
                &mut p.sub("dnl_block"),
                channels,
                norm,
                &block,
            ))
        },
    )))
}
