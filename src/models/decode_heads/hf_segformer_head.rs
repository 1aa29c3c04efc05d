//! `SegformerDecodeHead` and the loss of `SegformerForSemanticSegmentation`,
//! as Hugging Face `transformers` builds them
//! (`transformers/models/segformer/modeling_segformer.py`, 5.x).
//!
//! Xie et al., "SegFormer: Simple and Efficient Design for Semantic
//! Segmentation with Transformers", NeurIPS 2021, arXiv:2105.15203.
//!
//! Unlike MMSeg's `SegformerHead` (`segformer_head.rs`): each stage is
//! projected by an `nn.Linear` on its tokens (not a 1x1 ConvModule with BN),
//! the fuse is conv (no bias) + BatchNorm + a ReLU that is not in place,
//! the dropout is element-wise `nn.Dropout` (not `Dropout2d`), and the loss
//! is `CrossEntropyLoss(ignore_index=semantic_loss_ignore_index)` with mean
//! reduction over the logits upsampled to the label size, with no accuracy.

use super::{DecodeHead, LossItems};
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{dropout, resize_bilinear, BatchNorm2d, Conv2d, ConvSpec, Linear};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Reduction, Tensor};

const SOURCE: &str = "transformers/models/segformer/modeling_segformer.py";

/// The registry's constructor (`DECODE_HEADS` row `SegformerDecodeHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = HfSegformerHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(SegformerDecodeHead::new(p, &cfg)))
}

/// The head's part of a `SegformerConfig`.
#[derive(Debug, Clone, PartialEq)]
pub struct HfSegformerHeadCfg {
    pub hidden_sizes: Vec<i64>,
    pub decoder_hidden_size: i64,
    pub num_labels: i64,
    pub classifier_dropout_prob: f64,
    pub semantic_loss_ignore_index: i64,
}

impl HfSegformerHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<HfSegformerHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "SegformerDecodeHead", SOURCE);
        let cfg = HfSegformerHeadCfg {
            hidden_sizes: c.ints("hidden_sizes", &[32, 64, 160, 256])?,
            decoder_hidden_size: c.int("decoder_hidden_size", 256)?,
            num_labels: c.int("num_labels", 2)?,
            classifier_dropout_prob: c.float("classifier_dropout_prob", 0.1)?,
            semantic_loss_ignore_index: c.int("semantic_loss_ignore_index", 255)?,
        };
        c.finish()?;
        if cfg.num_labels < 2 {
            // num_labels == 1 trains with BCEWithLogitsLoss, not built here.
            return Err(ModelError::unsupported_in(
                "SegformerForSemanticSegmentation",
                SOURCE,
                "num_labels",
                format!(
                    "{} (the BCE loss of one label is not built; 2 or more labels train with \
                     cross-entropy)",
                    cfg.num_labels
                ),
            ));
        }
        Ok(cfg)
    }
}

pub struct SegformerDecodeHead {
    linear_projections: Vec<Linear>,
    linear_fuse: Conv2d,
    batch_norm: BatchNorm2d,
    classifier: Conv2d,
    cfg: HfSegformerHeadCfg,
}

impl SegformerDecodeHead {
    /// `p`: `decode_head`.
    pub fn new(p: &mut ParamScope, cfg: &HfSegformerHeadCfg) -> SegformerDecodeHead {
        let d = cfg.decoder_hidden_size;
        let mut lp = p.sub("linear_projections");
        let linear_projections = cfg
            .hidden_sizes
            .iter()
            .enumerate()
            .map(|(i, c)| Linear::new(&mut lp.sub(i).sub("proj"), *c, d, true))
            .collect();
        let stages = cfg.hidden_sizes.len() as i64;
        let linear_fuse = Conv2d::new(
            &mut p.sub("linear_fuse"),
            ConvSpec::new(d * stages, d, 1).bias(false),
        );
        let batch_norm = BatchNorm2d::new(&mut p.sub("batch_norm"), d, 1e-5, 0.1, true);
        let classifier = Conv2d::new(
            &mut p.sub("classifier"),
            ConvSpec::new(d, cfg.num_labels, 1),
        );
        SegformerDecodeHead {
            linear_projections,
            linear_fuse,
            batch_norm,
            classifier,
            cfg: cfg.clone(),
        }
    }
}

impl DecodeHead for SegformerDecodeHead {
    /// `[B, num_labels, H/4, W/4]` logits from the encoder's hidden states.
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        let b = features[features.len() - 1].size()[0];
        let size = (features[0].size()[2], features[0].size()[3]);
        let mut all = Vec::with_capacity(features.len());
        for (x, proj) in features.iter().zip(&self.linear_projections) {
            let (h, w) = (x.size()[2], x.size()[3]);
            let t = proj.forward(&x.flatten(2, -1).transpose(1, 2)); // [B, h*w, D]
            let t = t.transpose(1, 2).reshape([b, -1, h, w]);
            all.push(resize_bilinear(&t, size, false));
        }
        all.reverse();
        let fused = self.linear_fuse.forward(&Tensor::cat(&all, 1));
        drop(all);
        let h = self.batch_norm.forward(&fused, training);
        drop(fused);
        let h = h.relu();
        let h = dropout(&h, self.cfg.classifier_dropout_prob, training);
        self.classifier.forward(&h)
    }

    /// The model's loss: logits upsampled to the labels' size, then
    /// `CrossEntropyLoss(ignore_index)` (mean over the labelled pixels).
    /// `labels`: one `[B, H, W]` tensor (the batch's `labels`).
    fn loss(&self, features: &[Tensor], prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        let logits = self.forward(features, prev, true);
        let _part = crate::models::scope::enter("loss");
        let labels = &labels[0];
        let size = (labels.size()[1], labels.size()[2]);
        let upsampled = resize_bilinear(&logits, size, false);
        let loss = upsampled.cross_entropy_loss::<Tensor>(
            labels,
            None,
            Reduction::Mean,
            self.cfg.semantic_loss_ignore_index,
            0.0,
        );
        vec![("loss".into(), loss)]
    }

    fn num_classes(&self) -> i64 {
        self.cfg.num_labels
    }

    fn ignore_index(&self) -> i64 {
        self.cfg.semantic_loss_ignore_index
    }

    fn align_corners(&self) -> bool {
        false
    }
}

#[cfg(test)]
#[path = "hf_segformer_head_tests.rs"]
mod tests;
