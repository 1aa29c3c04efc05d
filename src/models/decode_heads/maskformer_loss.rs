//! MaskFormer's training targets and losses, as mmdet 3.x computes them
//! (`MaskFormerHead.loss_by_feat`/`get_targets`/`_get_targets_single`/
//! `_loss_by_feat_single` in `mmdet/models/dense_heads/maskformer_head.py`)
//! from MMSeg's label maps (`MaskFormerHead._seg_data_to_instance_data`):
//! one ground-truth segment per class present; queries matched to segments
//! by `HungarianAssigner` on the masks at the prediction's resolution
//! (ClassificationCost, FocalLossCost with `binary_input=True`, DiceCost);
//! then per decoder layer the class cross-entropy (no-object class
//! down-weighted) and, on the matched masks upsampled to the label's
//! resolution, mmdet's `DiceLoss` and `FocalLoss` (its CPU path:
//! `py_sigmoid_focal_loss` on a one-hot target).
//!
//! Cheng et al., "Per-Pixel Classification is Not All You Need for Semantic
//! Segmentation", NeurIPS 2021, arXiv:2107.06278; Lin et al., "Focal Loss
//! for Dense Object Detection", ICCV 2017, arXiv:1708.02002.

use super::mask2former_head::check_type;
use super::mask2former_loss::{instance_targets, mean_over, take_rows, GtInstances};
use super::query_loss::{
    binary_mask_dice_cost, dice_loss, hungarian, layer_loss_items, layer_losses, pseudo_sample,
    query_targets, Matched, Targets,
};
use super::query_loss_cfg::{
    class_loss_cfg, read_match_costs, sigmoid_loss_cfg, ClassLossCfg, DiceLossCfg, MMDET_LOSSES,
};
use super::LossItems;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::host::from_host;
use crate::models::ModelError;
use tch::{Kind, Tensor};

/// The head's `loss_cls`, `loss_mask`, `loss_dice` and `train_cfg`.
#[derive(Debug, Clone, PartialEq)]
pub struct MaskFormerLossCfg {
    pub cls: ClassLossCfg,
    pub focal_weight: f64,
    pub focal_gamma: f64,
    pub focal_alpha: f64,
    pub dice: DiceLossCfg,
    pub costs: MatchCosts,
}

/// `HungarianAssigner(match_costs=[ClassificationCost, FocalLossCost,
/// DiceCost])`: each cost's weight (zero when absent) and settings.
#[derive(Debug, Clone, PartialEq)]
pub struct MatchCosts {
    pub cls: f64,
    pub focal: f64,
    pub focal_alpha: f64,
    pub focal_gamma: f64,
    pub focal_eps: f64,
    pub dice: f64,
    pub dice_pred_act: bool,
    pub dice_eps: f64,
    pub dice_naive: bool,
}

impl MaskFormerLossCfg {
    /// Reads the loss and `train_cfg` keys of the head's config.
    pub fn from_head(c: &mut ComponentConfig, num_classes: i64) -> Result<Self, ModelError> {
        let empty = Dict::new();
        let cls = class_loss_cfg(c, num_classes, 1.0, "MaskFormerHead")?;

        let mut m = sigmoid_loss_cfg(c, "loss_mask", "FocalLoss", &empty)?;
        m.unimplemented("activated", &Value::Bool(false))?;
        m.unimplemented("reduction", &Value::Str("mean".into()))?;
        let focal_gamma = m.float("gamma", 2.0)?;
        let focal_alpha = m.float("alpha", 0.25)?;
        let focal_weight = m.float("loss_weight", 1.0)?;
        m.finish()?;

        let dice = DiceLossCfg::read(
            c,
            DiceLossCfg {
                naive: false,
                eps: 1e-3,
                weight: 1.0,
            },
        )?;

        let train = c.dict("train_cfg")?.unwrap_or(&empty);
        let mut t = ComponentConfig::new(train, "MaskFormerHead train_cfg", MMDET_LOSSES);
        let assigner = t.dict("assigner")?;
        match t.dict("sampler")? {
            Some(s) => check_type(s, "MaskPseudoSampler", "train_cfg.sampler")?,
            None => return Err(t.config_error("train_cfg.sampler must be set")),
        }
        t.finish()?;
        Ok(MaskFormerLossCfg {
            cls,
            focal_weight,
            focal_gamma,
            focal_alpha,
            dice,
            costs: match_costs(assigner)?,
        })
    }
}

/// The assigner's `ClassificationCost`, `FocalLossCost` and `DiceCost`.
fn match_costs(assigner: Option<&Dict>) -> Result<MatchCosts, ModelError> {
    let mut out = MatchCosts {
        cls: 0.0,
        focal: 0.0,
        focal_alpha: 0.25,
        focal_gamma: 2.0,
        focal_eps: 1e-12,
        dice: 0.0,
        dice_pred_act: false,
        dice_eps: 1e-3,
        dice_naive: true,
    };
    let order = ["ClassificationCost", "FocalLossCost", "DiceCost"];
    read_match_costs(assigner, "MaskFormerHead", order, |pos, weight, m| {
        match pos {
            0 => out.cls = weight,
            1 => {
                // The class-score focal cost (binary_input=False, mmdet's
                // default) reads query scores, not masks.
                if !m.flag("binary_input", false) {
                    return Err(m.unsupported(
                        "binary_input",
                        "False (the class-score focal cost) is not implemented; set binary_input=True",
                    ));
                }
                out.focal = weight;
                out.focal_alpha = m.float("alpha", 0.25)?;
                out.focal_gamma = m.float("gamma", 2.0)?;
                out.focal_eps = m.float("eps", 1e-12)?;
            }
            _ => {
                out.dice = weight;
                out.dice_pred_act = m.flag("pred_act", false);
                m.unimplemented("act_mode", &Value::Str("sigmoid".into()))?;
                out.dice_eps = m.float("eps", 1e-3)?;
                out.dice_naive = m.flag("naive_dice", true);
            }
        }
        Ok(())
    })?;
    Ok(out)
}

pub struct MaskFormerLoss {
    cfg: MaskFormerLossCfg,
    num_classes: i64,
    ignore_index: i64,
}

impl MaskFormerLoss {
    pub fn new(cfg: MaskFormerLossCfg, num_classes: i64, ignore_index: i64) -> MaskFormerLoss {
        MaskFormerLoss {
            cfg,
            num_classes,
            ignore_index,
        }
    }

    /// The head's `loss`: the targets from the label maps, then
    /// `forward` (every decoder layer's class scores and masks), then
    /// `loss_by_feat`.
    pub fn loss(&self, labels: &[Tensor], forward: impl FnOnce() -> (Tensor, Tensor)) -> LossItems {
        let targets = self.instance_targets(labels);
        let (cls, masks) = forward();
        self.loss_by_feat(&cls, &masks, &targets)
    }

    /// `_seg_data_to_instance_data`: per image, the classes present (but
    /// `ignore_index`) and one mask per class.
    pub fn instance_targets(&self, labels: &[Tensor]) -> Vec<GtInstances> {
        instance_targets(labels, self.ignore_index)
    }

    /// `FocalLossCost._mask_focal_loss_cost` (`binary_input=True`):
    /// `[Q, G]`.
    fn focal_cost(&self, mask_pred: &Tensor, gt_masks: &Tensor) -> Tensor {
        let c = &self.cfg.costs;
        let cls_pred = mask_pred.flatten(1, -1);
        let gt_labels = gt_masks.flatten(1, -1).to_kind(Kind::Float);
        let n = cls_pred.size()[1] as f64;
        let cls_pred = cls_pred.sigmoid();
        let neg_cost = {
            let log = (cls_pred.rsub_scalar(1) + c.focal_eps).log();
            -log * (1.0 - c.focal_alpha) * cls_pred.pow_tensor_scalar(c.focal_gamma)
        };
        let pos_cost = {
            let log = (&cls_pred + c.focal_eps).log();
            -log * c.focal_alpha * cls_pred.rsub_scalar(1).pow_tensor_scalar(c.focal_gamma)
        };
        let pos = Tensor::einsum("nc,mc->nm", &[&pos_cost, &gt_labels], None::<i64>);
        let neg = Tensor::einsum(
            "nc,mc->nm",
            &[&neg_cost, &gt_labels.rsub_scalar(1)],
            None::<i64>,
        );
        (pos + neg) / n * c.focal
    }

    /// `DiceCost.binary_mask_dice_loss` (after the sigmoid when
    /// `pred_act`): `[Q, G]`.
    fn dice_cost(&self, mask_pred: &Tensor, gt_masks: &Tensor) -> Tensor {
        let c = &self.cfg.costs;
        let act = c.dice_pred_act.then(|| mask_pred.sigmoid());
        let pred = act.as_ref().unwrap_or(mask_pred).flatten(1, -1);
        let target = gt_masks.flatten(1, -1).to_kind(Kind::Float);
        binary_mask_dice_cost(&pred, &target, c.dice_naive, c.dice_eps, c.dice)
    }

    /// `HungarianAssigner.assign` on the masks at the prediction's
    /// resolution: the matched `(query, segment)` pairs, queries ascending.
    fn assign(&self, cls_score: &Tensor, mask_pred: &Tensor, gt: &GtInstances) -> Vec<(i64, i64)> {
        let c = &self.cfg.costs;
        let cls_cost = {
            let scores = cls_score.softmax(-1, None::<Kind>);
            -scores.index(&[None, Some(&gt.labels)]) * c.cls
        };
        let focal_cost = self.focal_cost(mask_pred, &gt.masks);
        let dice_cost = self.dice_cost(mask_pred, &gt.masks);
        hungarian([cls_cost, focal_cost, dice_cost])
    }

    /// `_get_targets_single` for one image and one decoder layer: matched on
    /// the ground truth downsampled (nearest) to the masks' resolution; the
    /// mask targets at the label's resolution.
    fn targets_single(&self, cls_score: &Tensor, mask_pred: &Tensor, gt: &GtInstances) -> Targets {
        let num_queries = cls_score.size()[0];
        let num_gts = gt.labels.size()[0];
        let matched = if num_gts == 0 {
            Vec::new()
        } else {
            let size = mask_pred.size();
            let down = gt
                .masks
                .unsqueeze(1)
                .to_kind(Kind::Float)
                .upsample_nearest2d([size[1], size[2]], None, None)
                .squeeze_dim(1)
                .to_kind(Kind::Int64);
            let downsampled = GtInstances {
                labels: gt.labels.shallow_clone(),
                masks: down,
            };
            self.assign(cls_score, mask_pred, &downsampled)
        };
        // MaskPseudoSampler / MaskSamplingResult
        let (pos, neg, pos_gt) = pseudo_sample(&matched, num_queries);
        let pos_inds = from_host(&pos);
        let pos_assigned_gt_inds = from_host(&pos_gt);
        let sampling = (
            mask_pred.index(&[Some(&pos_inds)]),
            mask_pred.index(&[Some(from_host(&neg))]),
            take_rows(&gt.masks, &pos_assigned_gt_inds, pos.len()),
        );
        query_targets(
            self.num_classes,
            (cls_score, mask_pred),
            gt,
            (pos, &pos_inds, &pos_assigned_gt_inds),
            sampling,
        )
    }

    /// mmdet's `FocalLoss` (`use_sigmoid=True`) of `pred` `[N, 1]` against
    /// `target` int64 `[N]` (class 0 the positive one): on CUDA mmcv's
    /// `sigmoid_focal_loss` kernel, on the CPU `py_sigmoid_focal_loss` on a
    /// one-hot target.
    fn focal_loss(&self, pred: &Tensor, target: &Tensor, avg: &Tensor) -> Tensor {
        if crate::models::layers::mmcv_cuda_ops() {
            let c = &self.cfg;
            let loss = sigmoid_focal_loss_cuda(pred, target, c.focal_gamma, c.focal_alpha);
            return mean_over(loss, avg) * c.focal_weight;
        }
        let c = &self.cfg;
        let one_hot = target.one_hot(2);
        let target = one_hot.slice(1, 0, 1, 1);
        let pred_sigmoid = pred.sigmoid();
        let target = target.type_as(pred);
        // pt = (1 - pred_sigmoid) * target + pred_sigmoid * (1 - target)
        let t = pred_sigmoid.rsub_scalar(1);
        let first = &t * &target;
        drop(t);
        let t = target.rsub_scalar(1);
        let second = &pred_sigmoid * &t;
        drop(t);
        let pt = &first + &second;
        drop((first, second));
        // (alpha * target + (1 - alpha) * (1 - target)) * pt.pow(gamma)
        let a = &target * c.focal_alpha;
        let t = target.rsub_scalar(1);
        let b = t * (1.0 - c.focal_alpha);
        let ab = &a + &b;
        drop((a, b));
        let p = pt.pow_tensor_scalar(c.focal_gamma);
        let focal_weight = &ab * &p;
        drop((ab, p, pt));
        let bce = pred.binary_cross_entropy_with_logits(
            &target,
            None::<Tensor>,
            None::<Tensor>,
            tch::Reduction::None,
        );
        let loss = &bce * &focal_weight;
        drop((bce, focal_weight, pred_sigmoid, target, one_hot));
        mean_over(loss, avg) * c.focal_weight
    }

    /// `_loss_by_feat_single`'s mask losses, `(loss_mask, loss_dice)`, on
    /// the matched masks upsampled to the label's resolution.
    fn mask_losses(&self, m: &Matched) -> (Tensor, Tensor) {
        let (mask_targets, num_total_masks) = (&m.mask_targets, &m.num_total_masks);
        let (h, w) = (mask_targets.size()[1], mask_targets.size()[2]);
        let mask_preds = m
            .mask_preds
            .unsqueeze(1)
            .upsample_bilinear2d([h, w], false, None, None)
            .squeeze_dim(1);
        let loss_dice = dice_loss(&mask_preds, mask_targets, &self.cfg.dice, num_total_masks);
        let preds = mask_preds.reshape([-1, 1]);
        let flipped = mask_targets.reshape([-1]).rsub_scalar(1);
        let avg = num_total_masks * (h * w) as f64;
        let loss_mask = self.focal_loss(&preds, &flipped, &avg);
        (loss_mask, loss_dice)
    }

    /// `loss_by_feat`: the last layer's losses unprefixed, then `d<i>.` for
    /// the others, in mmdet's dict order. `all_cls` `[L, B, Q, C+1]`,
    /// `all_masks` `[L, B, Q, h, w]`.
    pub fn loss_by_feat(
        &self,
        all_cls: &Tensor,
        all_masks: &Tensor,
        gts: &[GtInstances],
    ) -> Vec<(String, Tensor)> {
        let _part = crate::models::scope::enter("loss");
        let layers = all_cls.size()[0];
        let per_layer: Vec<[Tensor; 3]> = (0..layers)
            .map(|l| {
                let layer = (&all_cls.select(0, l), &all_masks.select(0, l));
                let per_image =
                    |s: &Tensor, p: &Tensor, i: usize| self.targets_single(s, p, &gts[i]);
                layer_losses(layer, &self.cfg.cls, per_image, |m| self.mask_losses(m))
            })
            .collect();
        layer_loss_items(&per_layer)
    }
}

/// Rows of the elementwise focal loss computed at once: bounds the
/// temporaries of [`sigmoid_focal_loss_cuda`]'s values (the CUDA kernel has
/// none) to a few MiB.
const FOCAL_CHUNK_ROWS: i64 = 1 << 18;

/// mmcv's `SigmoidFocalLossFunction` (`reduction='none'`) as its CUDA
/// kernels use memory: the forward allocates the `[N, 1]` loss and keeps
/// the input and the target; the backward allocates the `[N, 1]` gradient.
/// Built on the checkpoint function: its forward computes the loss in row
/// chunks into one output; its backward recomputes `pred * dL/dpred` (the
/// derivative computed in chunks, without a graph), whose backward is the
/// gradient (two `[N, 1]` transients beyond the kernel's).
fn sigmoid_focal_loss_cuda(pred: &Tensor, target: &Tensor, gamma: f64, alpha: f64) -> Tensor {
    crate::models::layers::checkpoint_inputs(
        &[pred.shallow_clone(), target.shallow_clone()],
        move |t: &[Tensor]| {
            let (pred, target) = (&t[0], &t[1]);
            // In the checkpoint's backward the inputs require grad (and
            // grad mode is on); in its forward nothing built here does.
            let backward = pred.narrow(0, 0, pred.size()[0].min(1)).requires_grad();
            let n = pred.size()[0];
            let fill = |derivative: bool| -> Tensor {
                let out = tch::no_grad(|| pred.zeros_like());
                tch::no_grad(|| {
                    let mut start = 0;
                    while start < n {
                        let rows = FOCAL_CHUNK_ROWS.min(n - start);
                        let x = pred.narrow(0, start, rows);
                        let positive = target.narrow(0, start, rows).eq(0).unsqueeze(1);
                        let values = focal_terms(&x, &positive, gamma, alpha, derivative);
                        out.narrow(0, start, rows).copy_(&values);
                        start += rows;
                    }
                });
                out
            };
            if backward {
                let gradient = fill(true);
                pred * gradient
            } else {
                fill(false)
            }
        },
    )
}

/// The sigmoid focal loss of logits `x` (or its derivative), `positive`
/// where the target is the class: `-a (1-p)^g log p` and
/// `-(1-a) p^g log(1-p)`, logs clamped at `FLT_MIN` as mmcv's kernel does;
/// derivatives `a (1-p)^g (g p log p - (1-p))` and
/// `(1-a) p^g (p - g (1-p) log(1-p))`.
fn focal_terms(x: &Tensor, positive: &Tensor, gamma: f64, alpha: f64, derivative: bool) -> Tensor {
    let p = x.sigmoid();
    let q = p.rsub_scalar(1.0);
    let min = f64::from(f32::MIN_POSITIVE);
    let log_p = p.clamp_min(min).log();
    let log_q = q.clamp_min(min).log();
    let (pos, neg) = if derivative {
        (
            q.pow_tensor_scalar(gamma) * alpha * (&p * &log_p * gamma - &q),
            p.pow_tensor_scalar(gamma) * (1.0 - alpha) * (&p - &q * &log_q * gamma),
        )
    } else {
        (
            q.pow_tensor_scalar(gamma) * &log_p * (-alpha),
            p.pow_tensor_scalar(gamma) * &log_q * (alpha - 1.0),
        )
    };
    pos.where_self(positive, &neg)
}

#[cfg(test)]
#[path = "maskformer_loss_tests.rs"]
mod tests;
