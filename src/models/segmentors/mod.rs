//! Segmentors (`mmseg/models/segmentors/`): the model types a config's
//! `model.type` names, with the data preprocessor and the loss parsing they
//! share. [`SEGMENTORS`] maps each type to the reader of its components'
//! configs (which [`check_supported`](super::check_supported) checks against
//! the registry tables and `EncoderDecoder` builds), [`SEGMENTOR_FACTS`] to
//! its facts.

pub mod base;
pub mod cascade_encoder_decoder;
pub mod data_preprocessor;
pub mod encoder_decoder;
pub mod generate_edge;
pub mod hf_segformer;
pub mod inference;
pub mod multimodal_encoder_decoder;

use super::registry::Facts;
use super::ModelError;
use crate::config::Dict;
use encoder_decoder::EncoderDecoderCfg;

/// Reads the components' configs of a `model` dict of this segmentor type
/// (their structure, not yet their `type`s), without building anything.
pub type SegmentorReader = fn(&Dict) -> Result<EncoderDecoderCfg<'_>, ModelError>;

crate::models::registry::registry_table!(
    /// Segmentor types (`model.type`).
    SEGMENTORS, SEGMENTOR_FACTS: SegmentorReader = [
        ("CascadeEncoderDecoder", cascade_encoder_decoder::read_cfg),
        ("EncoderDecoder", encoder_decoder::read_cfg),
        ("MultimodalEncoderDecoder", multimodal_encoder_decoder::read_cfg),
        (
            hf_segformer::TYPE,
            encoder_decoder::read_cfg,
            Facts { backbone_prefix: Some("segformer"), ..Facts::NONE }
        ),
    ]
);
