//! MAE, as MMSeg's `mmseg/models/backbones/mae.py` builds it: the BEiT
//! encoder of `beit.rs` (`MAE` subclasses `BEiT`) with an absolute position
//! embedding and `MAETransformerEncoderLayer`s.
//!
//! He et al., "Masked Autoencoders Are Scalable Vision Learners", CVPR
//! 2022, arXiv:2111.06377.
//!
//! What differs from BEiT: `pos_embed` (`[1, Wh*Ww + 1, C]`, registered
//! after `cls_token`) is added to the tokens after the class token, without
//! resizing (a crop whose patch grid differs from `img_size / patch_size`
//! fails there in MMSeg, and here); the attention's qkv projection has a full
//! bias (`bias=True`) instead of BEiT's q and v biases, and `qv_bias` is not
//! an argument of `MAE`. `MAEAttention` and the layer differ from BEiT's only
//! in their initial values, which do not change memory.

use super::beit::{Beit, BeitConfig, Variant};
use super::Backbone;
use crate::config::Dict;
use crate::models::params::ParamScope;
use crate::models::ModelError;

/// The registry's constructor (`BACKBONES` row `MAE`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = BeitConfig::from_cfg(cfg, Variant::Mae)?;
    Ok(Box::new(Beit::new(p, &cfg)))
}

#[cfg(test)]
#[path = "mae_tests.rs"]
mod tests;
