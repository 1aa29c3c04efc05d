//! `SegformerForSemanticSegmentation` (Hugging Face `transformers`), as the
//! `EncoderDecoder` it amounts to: the `SegformerModel` encoder (its
//! parameters under `segformer`), the `SegformerDecodeHead` with the
//! model's own loss, and a batch of `pixel_values` + `labels` (the
//! `PixelValues` preprocessor). `config::hf` translates a model directory
//! into that config; the parts are `backbones/hf_segformer.rs` and
//! `decode_heads/hf_segformer_head.rs`.

/// The `model.type` this segmentor is registered under.
pub const TYPE: &str = crate::config::hf::HF_SEGFORMER;

#[cfg(test)]
#[path = "hf_segformer_tests.rs"]
mod tests;
