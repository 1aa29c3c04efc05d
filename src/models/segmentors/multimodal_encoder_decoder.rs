//! `MultimodalEncoderDecoder` (`mmseg/models/segmentors/multimodal_encoder_decoder.py`),
//! SAN's open-vocabulary segmentor (Xu et al., "Side Adapter Network for
//! Open-Vocabulary Semantic Segmentation", CVPR 2023): a CLIP ViT image
//! encoder, a CLIP text encoder run over the class-name prompts, and the
//! `SideAdapterCLIPHead` (a side ViT whose queries bias CLIP's attention).
//! segtune does not build it; its row refuses it by name, with the reason,
//! so that SAN configs are told apart from configs of unknown types.

use super::encoder_decoder::EncoderDecoderCfg;
use crate::config::Dict;
use crate::models::ModelError;

const SOURCE: &str = "mmseg/models/segmentors/multimodal_encoder_decoder.py";

/// The `SEGMENTORS` row's reader: always the refusal.
pub fn read_cfg(_model: &Dict) -> Result<EncoderDecoderCfg<'_>, ModelError> {
    Err(ModelError::unsupported_in(
        "MultimodalEncoderDecoder",
        SOURCE,
        "",
        "SAN (open-vocabulary: a frozen CLIP ViT image encoder, a CLIP text encoder over \
         the class-name prompts, and the side-adapter head that biases CLIP's attention) is \
         not built natively by segtune; its memory is not measured or predicted",
    ))
}
