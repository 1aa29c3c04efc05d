//! Backbones (`mmseg/models/backbones/`): the [`Backbone`] trait and the
//! [`BACKBONES`] table from MMSeg's `type` name to a constructor, with
//! [`BACKBONE_FACTS`] (which take `with_cp`).
//!
//! Adding a backbone: its own file here (see `mit.rs` for the pattern),
//! plus its `mod` line and its table row below.

pub mod beit;
pub mod bisenetv1;
pub mod bisenetv2;
pub mod cgnet;
pub mod convnext;
pub mod ddrnet;
pub mod erfnet;
pub mod fast_scnn;
pub mod hf_segformer;
pub mod hrnet;
pub mod icnet;
pub mod mae;
pub mod mit;
pub mod mobilenet_v2;
pub mod mobilenet_v3;
pub mod mscan;
pub mod pidnet;
pub mod poolformer;
pub mod resnest;
pub mod resnet;
pub mod stdc;
pub mod swin;
pub mod twins;
pub mod unet;
pub mod vit;

use super::params::ParamScope;
use super::registry::Facts;
use super::ModelError;
use crate::config::Dict;
use tch::Tensor;

/// A backbone in training.
pub trait Backbone {
    /// `forward(x)`: multi-level features, one `[B, C_i, H_i, W_i]` map per
    /// `out_indices` entry, from the `[B, 3, H, W]` batch.
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor>;
}

/// Builds a backbone from its resolved config dict, registering its
/// parameters under `scope` (`backbone`).
pub type BackboneCtor = fn(&mut ParamScope, &Dict) -> Result<Box<dyn Backbone>, ModelError>;

/// The facts of a backbone whose `with_cp` segtune honours (gradient
/// checkpointing, see `layers::checkpoint`).
const WITH_CP: Facts = Facts {
    takes_with_cp: true,
    ..Facts::NONE
};

crate::models::registry::registry_table!(
    /// Backbone types (`model.backbone.type`).
    BACKBONES, BACKBONE_FACTS: BackboneCtor = [
        ("BEiT", beit::build),
        ("BiSeNetV1", bisenetv1::build),
        ("BiSeNetV2", bisenetv2::build),
        ("CGNet", cgnet::build),
        ("DDRNet", ddrnet::build),
        ("ERFNet", erfnet::build),
        ("FastSCNN", fast_scnn::build),
        ("HRNet", hrnet::build),
        ("ICNet", icnet::build),
        ("MAE", mae::build),
        ("MixVisionTransformer", mit::build, WITH_CP),
        ("MobileNetV2", mobilenet_v2::build),
        ("MSCAN", mscan::build),
        ("MobileNetV3", mobilenet_v3::build),
        ("PCPVT", twins::build_pcpvt),
        ("PIDNet", pidnet::build),
        ("ResNeSt", resnet::build_resnest),
        ("ResNet", resnet::build_resnet, WITH_CP),
        ("ResNetV1c", resnet::build_resnet_v1c, WITH_CP),
        ("ResNetV1d", resnet::build_resnet_v1d, WITH_CP),
        ("STDCContextPathNet", stdc::build_context_path_net),
        ("STDCNet", stdc::build_stdc_net),
        ("SVT", twins::build_svt),
        ("SegformerModel", hf_segformer::build, WITH_CP),
        ("SwinTransformer", swin::build, WITH_CP),
        ("UNet", unet::build),
        ("mmpretrain.ConvNeXt", convnext::build),
        ("mmpretrain.PoolFormer", poolformer::build),
        ("VisionTransformer", vit::build, WITH_CP),
    ]
);
