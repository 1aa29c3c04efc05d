//! Decode heads (`mmseg/models/decode_heads/`): the [`DecodeHead`] trait and
//! the [`DECODE_HEADS`] table from MMSeg's `type` name to its constructors
//! ([`HeadBuilders`]), with [`DECODE_HEAD_FACTS`] (which take the run's
//! `train_cfg` and `test_cfg`, which classify masks, ...).
//! Auxiliary heads are decode heads too, built from the same table.
//!
//! Adding a head: its own file here (see `segformer_head.rs` for the
//! pattern), plus its `mod` line and its table row below.

pub mod ann_head;
pub mod apc_head;
pub mod aspp_head;
pub mod cc_head;
pub mod da_head;
pub mod ddr_head;
pub mod decode_head;
pub mod dm_head;
pub mod dnl_head;
pub mod dpt_head;
pub mod ema_head;
pub mod enc_head;
pub mod fcn_head;
pub mod fpn_head;
pub mod gc_head;
pub mod ham_head;
pub mod hf_segformer_head;
pub mod isa_head;
pub mod knet_head;
pub mod lraspp_head;
pub mod mask2former_head;
pub mod mask2former_loss;
pub mod maskformer_head;
pub mod maskformer_loss;
pub mod nl_head;
pub mod ocr_head;
pub mod pid_head;
pub mod pixel_decoder;
pub mod point_head;
pub mod psa_head;
pub mod psp_head;
mod query_head;
mod query_loss;
mod query_loss_cfg;
pub mod segformer_head;
pub mod segmenter_mask_head;
pub mod sep_aspp_head;
pub mod sep_fcn_head;
pub mod setr_mla_head;
pub mod setr_up_head;
pub mod stdc_head;
pub mod uper_head;

use super::params::ParamScope;
use super::registry::Facts;
use super::ModelError;
use crate::config::Dict;
use decode_head::FeatureHead;
use tch::Tensor;

/// A head's loss items, named as MMSeg names them (`loss_ce`, `acc_seg`),
/// in the order its `loss` returns them.
pub type LossItems = Vec<(String, Tensor)>;

/// A decode (or auxiliary) head in training.
pub trait DecodeHead {
    /// `forward(inputs)`, or `forward(inputs, prev_output)` for a cascade
    /// head: the segmentation logits, `[B, num_classes, h, w]` at the
    /// resolution the head works at, from the multi-level features (and the
    /// previous stage's logits).
    fn forward(&self, features: &[Tensor], prev_output: Option<&Tensor>, training: bool) -> Tensor;

    /// `loss(inputs, batch_data_samples, train_cfg)` (a cascade head takes
    /// `prev_output` after `inputs`): the head's loss items unprefixed and in
    /// MMSeg's order (`loss_ce`, `acc_seg`). `labels` are the padded
    /// per-image `[1, H, W]` label maps. Tensors must be created and dropped
    /// in the order MMSeg's Python creates and releases them.
    fn loss(&self, features: &[Tensor], prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems;

    /// `loss` with the per-image `[1, H, W]` edge maps (`gt_edge_map`,
    /// padded as the labels) as well, empty unless the pipeline makes
    /// them: a head that reads them (PIDHead, its row's fact
    /// `takes_edge_maps`) overrides this; the others ignore them.
    fn loss_with_edges(
        &self,
        features: &[Tensor],
        labels: &[Tensor],
        _edges: &[Tensor],
    ) -> LossItems {
        self.loss(features, None, labels)
    }

    /// Whether this is a `BaseCascadeDecodeHead` (its forward takes the
    /// previous stage's logits): only such heads follow the first stage of
    /// a `CascadeEncoderDecoder`, and they cannot come first.
    fn is_cascade(&self) -> bool {
        false
    }

    fn num_classes(&self) -> i64;

    fn ignore_index(&self) -> i64;

    /// `align_corners` of the head's resizes (and of `predict_by_feat`):
    /// MMSeg's default False unless the head reads it.
    fn align_corners(&self) -> bool {
        false
    }

    /// `predict(inputs, [prev_output,] batch_img_metas, test_cfg)` in
    /// inference: the logits resized to the input's `size`
    /// (`predict_by_feat`), the head's own tensors alive until then.
    fn predict(
        &self,
        features: &[Tensor],
        prev_output: Option<&Tensor>,
        size: (i64, i64),
    ) -> Tensor {
        let logits = self.forward(features, prev_output, false);
        crate::models::layers::resize_bilinear(&logits, size, self.align_corners())
    }
}

/// Builds a head from its resolved config dict, registering its parameters
/// under `scope` (`decode_head`, `auxiliary_head`, `auxiliary_head.0`).
pub type DecodeHeadCtor = fn(&mut ParamScope, &Dict) -> Result<Box<dyn DecodeHead>, ModelError>;

/// Builds a head as a [`FeatureHead`] (K-Net's kernel generate head, under
/// `kernel_generate_head`).
pub type FeatureHeadCtor = fn(&mut ParamScope, &Dict) -> Result<Box<dyn FeatureHead>, ModelError>;

/// A head type's constructors: as a decode head, and, for a head whose
/// `forward` is `cls_seg(_forward_feature(inputs))`, as a [`FeatureHead`]
/// that can generate K-Net's kernels.
#[derive(Clone, Copy)]
pub struct HeadBuilders {
    pub build: DecodeHeadCtor,
    pub build_feature_head: Option<FeatureHeadCtor>,
}

impl HeadBuilders {
    /// A head that only builds as a decode head.
    pub const fn head(build: DecodeHeadCtor) -> HeadBuilders {
        HeadBuilders {
            build,
            build_feature_head: None,
        }
    }

    /// A head that can also generate K-Net's kernels.
    pub const fn feature_head(
        build: DecodeHeadCtor,
        build_feature_head: FeatureHeadCtor,
    ) -> HeadBuilders {
        HeadBuilders {
            build,
            build_feature_head: Some(build_feature_head),
        }
    }
}

/// The facts of PointRend's `PointHead`: it reads the segmentor's
/// `train_cfg` and `test_cfg` and predicts by subdivision.
const POINT_HEAD: Facts = Facts {
    takes_run_cfgs: true,
    subdivision_inference: true,
    ..Facts::NONE
};

/// The facts of PIDNet's `PIDHead`: its loss reads the edge maps of the
/// pipeline's `GenerateEdge`.
const TAKES_EDGE_MAPS: Facts = Facts {
    takes_edge_maps: true,
    ..Facts::NONE
};

/// The facts of a mask-classification head.
const MASK_CLASSIFICATION: Facts = Facts {
    mask_classification: true,
    ..Facts::NONE
};

crate::models::registry::registry_table!(
    /// Decode head types (`model.decode_head.type`, `model.auxiliary_head.type`).
    DECODE_HEADS, DECODE_HEAD_FACTS: HeadBuilders = [
        ("ANNHead", HeadBuilders::head(ann_head::build)),
        ("APCHead", HeadBuilders::head(apc_head::build)),
        ("ASPPHead", HeadBuilders::feature_head(aspp_head::build, aspp_head::build_feature_head)),
        ("CCHead", HeadBuilders::head(cc_head::build)),
        ("DAHead", HeadBuilders::head(da_head::build)),
        ("DDRHead", HeadBuilders::head(ddr_head::build)),
        ("DMHead", HeadBuilders::head(dm_head::build)),
        ("DNLHead", HeadBuilders::head(dnl_head::build)),
        ("DPTHead", HeadBuilders::head(dpt_head::build)),
        ("DepthwiseSeparableASPPHead", HeadBuilders::head(sep_aspp_head::build)),
        ("DepthwiseSeparableFCNHead", HeadBuilders::head(sep_fcn_head::build)),
        ("EMAHead", HeadBuilders::head(ema_head::build)),
        ("EncHead", HeadBuilders::head(enc_head::build)),
        ("FCNHead", HeadBuilders::feature_head(fcn_head::build, fcn_head::build_feature_head)),
        ("FPNHead", HeadBuilders::head(fpn_head::build)),
        ("GCHead", HeadBuilders::head(gc_head::build)),
        ("ISAHead", HeadBuilders::head(isa_head::build)),
        ("IterativeDecodeHead", HeadBuilders::head(knet_head::build)),
        ("LightHamHead", HeadBuilders::head(ham_head::build)),
        ("LRASPPHead", HeadBuilders::head(lraspp_head::build)),
        ("Mask2FormerHead", HeadBuilders::head(mask2former_head::build), MASK_CLASSIFICATION),
        ("MaskFormerHead", HeadBuilders::head(maskformer_head::build)),
        ("NLHead", HeadBuilders::head(nl_head::build)),
        ("OCRHead", HeadBuilders::head(ocr_head::build)),
        ("PIDHead", HeadBuilders::head(pid_head::build), TAKES_EDGE_MAPS),
        ("PSAHead", HeadBuilders::head(psa_head::build)),
        ("PointHead", HeadBuilders::head(point_head::build), POINT_HEAD),
        ("PSPHead", HeadBuilders::feature_head(psp_head::build, psp_head::build_feature_head)),
        ("SegformerDecodeHead", HeadBuilders::head(hf_segformer_head::build)),
        ("SegformerHead", HeadBuilders::head(segformer_head::build)),
        ("SegmenterMaskTransformerHead", HeadBuilders::head(segmenter_mask_head::build)),
        ("SETRMLAHead", HeadBuilders::head(setr_mla_head::build)),
        ("SETRUPHead", HeadBuilders::head(setr_up_head::build)),
        ("STDCHead", HeadBuilders::head(stdc_head::build)),
        ("UPerHead", HeadBuilders::feature_head(uper_head::build, uper_head::build_feature_head)),
    ]
);
