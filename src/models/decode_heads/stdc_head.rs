//! `STDCHead`, STDC's detail head, as MMSeg's
//! `mmseg/models/decode_heads/stdc_head.py` builds it: an `FCNHead` whose
//! loss is taken against boundary targets made from the labels.
//!
//! Fan et al., "Rethinking BiSeNet For Real-time Semantic Segmentation",
//! CVPR 2021, arXiv:2104.13188.
//!
//! The targets: the labels (as floats) convolved with a fixed Laplacian
//! kernel at strides 1, 2 and 4, clamped at zero, the coarse ones upsampled
//! (nearest), each binarised at `boundary_threshold`, stacked and fused by
//! a fixed 1x1 kernel (`fusion_kernel`, an `nn.Parameter` with
//! `requires_grad=False`: counted, not trained), binarised again; the
//! head's `loss_decode` (in the configs a sigmoid cross-entropy and a Dice
//! loss) is then BaseDecodeHead's against them. The binarisations are
//! MMSeg's boolean-mask assignments (`t[t > thr] = 1`: `index_put_`).

use super::decode_head::BaseHead;
use super::fcn_head::{FcnHead, FcnHeadCfg};
use super::{DecodeHead, LossItems};
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::host::from_host;
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/stdc_head.py";

/// The registry's constructor (`DECODE_HEADS` row `STDCHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = StdcHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(StdcHead::new(p, cfg)))
}

/// `STDCHead(boundary_threshold=0.1, **kwargs)` (FCNHead's keyword
/// arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct StdcHeadCfg {
    pub fcn: FcnHeadCfg,
    pub boundary_threshold: f64,
}

impl StdcHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<StdcHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "STDCHead", SOURCE);
        let boundary_threshold = c.float("boundary_threshold", 0.1)?;
        let fcn = FcnHeadCfg::read(&mut c, None)?;
        c.finish()?;
        Ok(StdcHeadCfg {
            fcn,
            boundary_threshold,
        })
    }
}

pub struct StdcHead {
    fcn: FcnHead,
    boundary_threshold: f64,
    /// `[1, 1, 3, 3]`, the buffer `laplacian_kernel`.
    laplacian_kernel: Tensor,
    /// `[1, 3, 1, 1]`, the frozen parameter `fusion_kernel`.
    fusion_kernel: Tensor,
}

impl StdcHead {
    pub fn new(p: &mut ParamScope, cfg: StdcHeadCfg) -> StdcHead {
        // The head's own parameter and buffer come before its sub-modules'
        // in `named_parameters()` and `named_buffers()`.
        let fusion_kernel = p.param_zeros("fusion_kernel", &[1, 3, 1, 1]);
        p.freeze_last(1);
        tch::no_grad(|| {
            let fused = from_host(&[0.6f32, 0.3, 0.1]).view([1, 3, 1, 1]);
            fusion_kernel.shallow_clone().copy_(&fused);
        });
        let laplacian = from_host(&[-1f32, -1., -1., -1., 8., -1., -1., -1., -1.]);
        let laplacian_kernel = p.buffer(
            "laplacian_kernel",
            laplacian.view([1, 1, 3, 3]).to_device(p.device()),
        );
        StdcHead {
            fcn: FcnHead::new(p, cfg.fcn),
            boundary_threshold: cfg.boundary_threshold,
            laplacian_kernel,
            fusion_kernel,
        }
    }

    /// `t[t > thr] = 1; t[t <= thr] = 0`, as Python runs them: a boolean
    /// mask, a 0-dim value tensor of `t`'s type, `index_put_`.
    fn binarise(&self, t: &mut Tensor) {
        for (above, value) in [(true, 1.0), (false, 0.0)] {
            let mask = if above {
                t.gt(self.boundary_threshold)
            } else {
                t.le(self.boundary_threshold)
            };
            let value = Tensor::scalar_tensor(value, (t.kind(), t.device()));
            let _ = t.index_put_(&[Some(&mask)], &value, false);
        }
    }

    /// `F.conv2d(seg_label, laplacian_kernel, stride=s, padding=1).clamp(min=0)`.
    fn laplacian(&self, seg_label: &Tensor, stride: i64) -> Tensor {
        let edges = seg_label.conv2d(
            &self.laplacian_kernel,
            None::<&Tensor>,
            [stride, stride],
            [1, 1],
            [1, 1],
            1,
        );
        edges.clamp_min(0)
    }

    /// The boundary targets of the per-image `[1, H, W]` labels: the first
    /// half of STDCHead's `loss_by_feat`, with every Python local it keeps.
    fn boundary_targets(&self, labels: &[Tensor]) -> BoundaryTargets {
        let lap = &self.laplacian_kernel;
        // _stack_batch_gt(...).to(self.laplacian_kernel): [B, 1, H, W] float.
        let seg_label = Tensor::stack(labels, 0)
            .to_device(lap.device())
            .to_kind(lap.kind());
        let mut boundary_targets = self.laplacian(&seg_label, 1); // [B, 1, H, W]
        self.binarise(&mut boundary_targets);
        let x2 = self.laplacian(&seg_label, 2); // [B, 1, H/2, W/2]
        let x4 = self.laplacian(&seg_label, 4); // [B, 1, H/4, W/4]
        let size = [boundary_targets.size()[2], boundary_targets.size()[3]];
        let mut x4_up = x4.upsample_nearest2d(size, None, None); // [B, 1, H, W]
        let mut x2_up = x2.upsample_nearest2d(size, None, None);
        self.binarise(&mut x2_up);
        self.binarise(&mut x4_up);
        let pyramids = Tensor::stack(&[&boundary_targets, &x2_up, &x4_up], 1).squeeze_dim(2); // [B, 3, H, W]
        let mut pyramid = pyramids.conv2d(
            &self.fusion_kernel,
            None::<&Tensor>,
            [1, 1],
            [0, 0],
            [1, 1],
            1,
        ); // [B, 1, H, W]
        self.binarise(&mut pyramid);
        let seg_labels = pyramid.to_kind(Kind::Int64); // .long()
                                                       // `for label in seg_labels`: one [1, H, W] view per image.
        let labels = (0..seg_labels.size()[0])
            .map(|i| seg_labels.get(i))
            .collect();
        BoundaryTargets {
            labels,
            _locals: vec![
                seg_label,
                boundary_targets,
                x2,
                x4,
                x2_up,
                x4_up,
                pyramids,
                pyramid,
                seg_labels,
            ],
        }
    }

    /// STDCHead's `loss_by_feat(seg_logits, batch_data_samples)`: the
    /// boundary targets, then BaseDecodeHead's loss against them.
    fn loss_by_feat(&self, seg_logits: &Tensor, labels: &[Tensor]) -> Vec<(String, Tensor)> {
        let targets = {
            let _part = crate::models::scope::enter("loss");
            self.boundary_targets(labels)
        };
        let losses = self.fcn.base().loss_by_feat(seg_logits, &targets.labels);
        // The targets' locals live until STDCHead's loss_by_feat returns.
        drop(targets);
        losses
    }
}

/// The boundary labels (per image, `[1, H, W]` int64 views) and the
/// tensors the Python keeps alive beside them until the loss returns.
struct BoundaryTargets {
    labels: Vec<Tensor>,
    _locals: Vec<Tensor>,
}

impl DecodeHead for StdcHead {
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        self.fcn.logits(features, training) // [B, num_classes, h, w]
    }

    fn loss(&self, features: &[Tensor], _prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        // `seg_logits` stays alive in `loss()` while `loss_by_feat` runs.
        let seg_logits = self.fcn.logits(features, true);
        self.loss_by_feat(&seg_logits, labels)
    }

    fn num_classes(&self) -> i64 {
        self.fcn.base().cfg.num_classes
    }

    fn ignore_index(&self) -> i64 {
        self.fcn.base().cfg.ignore_index
    }

    fn align_corners(&self) -> bool {
        self.fcn.base().cfg.align_corners
    }
}

#[cfg(test)]
#[path = "stdc_head_tests.rs"]
mod tests;
