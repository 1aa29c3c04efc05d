//! Decode heads (`mmseg/models/decode_heads/`): the [`DecodeHead`] trait and
//! the [`DECODE_HEADS`] table from MMSeg's `type` name to a constructor.
//! Auxiliary heads are decode heads too, built from the same table.
//!
//! Adding a head: its own file here (see `segformer_head.rs` for the
//! pattern), plus its `mod` line and its table row below.

pub mod decode_head;
pub mod fcn_head;
pub mod segformer_head;

use super::params::ParamScope;
use super::ModelError;
use crate::config::Dict;
use tch::Tensor;

/// A decode (or auxiliary) head in training.
pub trait DecodeHead {
    /// `forward(inputs)`: the segmentation logits, `[B, num_classes, h, w]`
    /// at the resolution the head works at, from the multi-level features.
    fn forward(&self, features: &[Tensor], training: bool) -> Tensor;

    /// `loss(inputs, batch_data_samples, train_cfg)`: the head's loss items
    /// unprefixed and in MMSeg's order (`loss_ce`, `acc_seg`). `labels` are
    /// the padded per-image `[1, H, W]` label maps. Tensors must be created
    /// and dropped in the order MMSeg's Python creates and releases them.
    fn loss(&self, features: &[Tensor], labels: &[Tensor], training: bool)
        -> Vec<(String, Tensor)>;

    fn num_classes(&self) -> i64;

    fn ignore_index(&self) -> i64;
}

/// Builds a head from its resolved config dict, registering its parameters
/// under `scope` (`decode_head`, `auxiliary_head`, `auxiliary_head.0`).
pub type DecodeHeadCtor = fn(&mut ParamScope, &Dict) -> Result<Box<dyn DecodeHead>, ModelError>;

/// Decode head types (`model.decode_head.type`, `model.auxiliary_head.type`).
pub const DECODE_HEADS: &[(&str, DecodeHeadCtor)] = &[
    ("FCNHead", fcn_head::build),
    ("SegformerHead", segformer_head::build),
];
