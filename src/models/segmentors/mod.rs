//! Segmentors (`mmseg/models/segmentors/`): the model types a config's
//! `model.type` names, with the data preprocessor and the loss parsing they
//! share. [`SEGMENTORS`] maps each type to the check of its components
//! against the registry tables.

pub mod base;
pub mod cascade_encoder_decoder;
pub mod data_preprocessor;
pub mod encoder_decoder;
pub mod hf_segformer;
pub mod inference;

use super::ModelError;
use crate::config::Dict;

/// Checks the components of a `model` dict of this segmentor type (their
/// structure and `type`s), without building anything.
pub type SegmentorCheck = fn(&Dict) -> Result<(), ModelError>;

/// Segmentor types (`model.type`).
pub const SEGMENTORS: &[(&str, SegmentorCheck)] = &[
    (
        "CascadeEncoderDecoder",
        cascade_encoder_decoder::check_components,
    ),
    ("EncoderDecoder", encoder_decoder::check_components),
    (hf_segformer::TYPE, encoder_decoder::check_components),
];
