//! Models built from a resolved MMSeg config, in libtorch (`tch`), laid out
//! as MMSeg's `mmseg/models/` is: one file per module, grouped by role, each
//! role with a trait and a table from MMSeg's `type` name to a constructor.
//! Each module reproduces MMSeg's: the same parameters (names and counts),
//! the same ops, the same tensors saved for backward, so that a training
//! step here allocates what MMSeg's does.
//!
//! | role | trait | table |
//! |---|---|---|
//! | [`segmentors`] (`model.type`) | — ([`EncoderDecoder`]) | [`SEGMENTORS`] |
//! | [`backbones`] (`model.backbone`) | [`backbones::Backbone`] | [`BACKBONES`] |
//! | [`necks`] (`model.neck`) | [`necks::Neck`] | [`NECKS`] |
//! | [`decode_heads`] (`model.decode_head`, `model.auxiliary_head`) | [`decode_heads::DecodeHead`] | [`DECODE_HEADS`] |
//!
//! Shared parts: [`layers`] (the building blocks), [`losses`], [`params`]
//! (parameter naming and storage), [`component_config`] (reading a
//! component's config dict with MMSeg's defaults, refusing keys segtune does
//! not implement), [`registry`] (table lookups, [`check_supported`], the
//! [`registry::Facts`] each table row carries),
//! [`scope`] (which part of the model runs, for attributing memory).
//!
//! Supported now: `EncoderDecoder` and `CascadeEncoderDecoder` with the
//! backbones `MixVisionTransformer` (SegFormer B0-B5), `ResNet`,
//! `ResNetV1c`, `ResNetV1d`, `UNet` and `HRNet`, the `JPU` neck, and the
//! heads `SegformerHead`, `FCNHead`, `PSPHead`, `ASPPHead`,
//! `DepthwiseSeparableASPPHead`, `UPerHead` and `OCRHead` (decode or
//! auxiliary, one or a list), with `CrossEntropyLoss` and `DiceLoss`.

pub mod backbones;
pub mod component_config;
pub mod decode_heads;
pub mod error;
pub mod layers;
pub mod losses;
pub mod necks;
pub mod params;
pub mod registry;
pub mod scope;
pub mod segmentors;

pub use backbones::BACKBONES;
pub use component_config::NormCfg;
pub use decode_heads::DECODE_HEADS;
pub use error::ModelError;
pub use necks::NECKS;
pub use registry::check_supported;
pub use segmentors::base::{parse_losses, StepLosses};
pub use segmentors::encoder_decoder::EncoderDecoder;
pub use segmentors::SEGMENTORS;
