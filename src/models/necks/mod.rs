//! Necks (`mmseg/models/necks/`): the [`Neck`] trait and the [`NECKS`]
//! table from MMSeg's `type` name to a constructor. `EncoderDecoder` applies
//! `model.neck` to the backbone's features in `extract_feat`.
//!
//! Adding one: its own file here following the pattern of `jpu.rs`, plus its `mod` line and its table row below.

pub mod feature2pyramid;
pub mod fpn;
pub mod ic_neck;
pub mod jpu;
pub mod mla_neck;
pub mod multilevel_neck;

use super::params::ParamScope;
use super::ModelError;
use crate::config::Dict;
use tch::Tensor;

/// A neck in training.
pub trait Neck {
    /// `forward(inputs)`: new multi-level features from the backbone's.
    /// `features` is handed over so that each map is released when MMSeg
    /// releases it (the Python list lives until `forward` returns, then
    /// `extract_feat` rebinds `x`).
    fn forward(&self, features: Vec<Tensor>, training: bool) -> Vec<Tensor>;
}

/// Builds a neck from its resolved config dict, registering its parameters
/// under `scope` (`neck`).
pub type NeckCtor = fn(&mut ParamScope, &Dict) -> Result<Box<dyn Neck>, ModelError>;

crate::models::registry::registry_table!(
    /// Neck types (`model.neck.type`).
    NECKS, NECK_FACTS: NeckCtor = [
        ("FPN", fpn::build),
        ("Feature2Pyramid", feature2pyramid::build),
        ("ICNeck", ic_neck::build),
        ("JPU", jpu::build),
        ("MLANeck", mla_neck::build),
        ("MultiLevelNeck", multilevel_neck::build),
    ]
);
