//! Mask2Former's training targets and losses, as mmdet 3.x computes them
//! (`MaskFormerHead.loss_by_feat`/`get_targets`,
//! `Mask2FormerHead._get_targets_single`/`_loss_by_feat_single` in
//! `mmdet/models/dense_heads/`) from MMSeg's label maps
//! (`Mask2FormerHead._seg_data_to_instance_data`): one ground-truth segment
//! per class present; queries matched to segments by `HungarianAssigner`
//! on costs over `num_points` random points (ClassificationCost,
//! CrossEntropyLossCost, DiceCost), solved with the `lsap` crate (scipy's
//! `linear_sum_assignment` algorithm); then per decoder layer the class
//! cross-entropy (no-object class down-weighted) and the mask BCE and Dice
//! losses on `num_points` points chosen by uncertainty
//! (`get_uncertain_point_coords_with_randomness`).
//!
//! Cheng et al., "Masked-attention Mask Transformer for Universal Image
//! Segmentation", CVPR 2022, arXiv:2112.01527 (section 3.2.4, point loss);
//! Kirillov et al., "PointRend", CVPR 2020, arXiv:1912.08193.

use super::mask2former_head::check_type;
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
use crate::models::layers::host::{from_host, shape_only_segments, values_unavailable};
use crate::models::ModelError;
use tch::{Kind, Tensor};

/// The head's `loss_cls`, `loss_mask`, `loss_dice` and `train_cfg`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mask2FormerLossCfg {
    pub cls: ClassLossCfg,
    pub mask_weight: f64,
    pub dice: DiceLossCfg,
    pub num_points: i64,
    pub oversample_ratio: f64,
    pub importance_sample_ratio: f64,
    pub cost_cls: f64,
    pub cost_mask: f64,
    pub cost_dice: f64,
    pub cost_dice_eps: f64,
    pub cost_dice_naive: bool,
}

impl Mask2FormerLossCfg {
    /// Reads the loss and `train_cfg` keys of the head's config.
    pub fn from_head(c: &mut ComponentConfig, num_classes: i64) -> Result<Self, ModelError> {
        let empty = Dict::new();
        let cls = class_loss_cfg(c, num_classes, 2.0, "Mask2FormerHead")?;

        let mut m = sigmoid_loss_cfg(c, "loss_mask", "CrossEntropyLoss", &empty)?;
        m.unimplemented("reduction", &Value::Str("mean".into()))?;
        m.unimplemented("class_weight", &Value::None)?;
        m.unimplemented("avg_non_ignore", &Value::Bool(false))?;
        let mask_weight = m.float("loss_weight", 5.0)?;
        m.finish()?;

        let dice = DiceLossCfg::read(
            c,
            DiceLossCfg {
                naive: true,
                eps: 1.0,
                weight: 5.0,
            },
        )?;

        let train = c.dict("train_cfg")?.unwrap_or(&empty);
        let mut t = ComponentConfig::new(train, "Mask2FormerHead train_cfg", MMDET_LOSSES);
        let num_points = t.int("num_points", 12544)?;
        let oversample_ratio = t.float("oversample_ratio", 3.0)?;
        let importance_sample_ratio = t.float("importance_sample_ratio", 0.75)?;
        let assigner = t.dict("assigner")?;
        if let Some(s) = t.dict("sampler")? {
            check_type(s, "MaskPseudoSampler", "train_cfg.sampler")?;
        }
        t.finish()?;
        if num_points < 1
            || oversample_ratio < 1.0
            || !(0.0..=1.0).contains(&importance_sample_ratio)
        {
            return Err(ModelError::config("Mask2FormerHead train_cfg", format!(
                "num_points {num_points} must be >= 1, oversample_ratio {oversample_ratio} >= 1 and importance_sample_ratio {importance_sample_ratio} in [0, 1]"
            )));
        }
        let (cost_cls, cost_mask, cost_dice, cost_dice_eps, cost_dice_naive) =
            match_costs(assigner)?;
        Ok(Mask2FormerLossCfg {
            cls,
            mask_weight,
            dice,
            num_points,
            oversample_ratio,
            importance_sample_ratio,
            cost_cls,
            cost_mask,
            cost_dice,
            cost_dice_eps,
            cost_dice_naive,
        })
    }
}

/// The assigner's `ClassificationCost`, `CrossEntropyLossCost` and
/// `DiceCost`: their weights (zero when absent) and Dice's `eps` and
/// `naive_dice`.
fn match_costs(assigner: Option<&Dict>) -> Result<(f64, f64, f64, f64, bool), ModelError> {
    let mut out = (0.0, 0.0, 0.0, 1e-3, true);
    let order = ["ClassificationCost", "CrossEntropyLossCost", "DiceCost"];
    read_match_costs(assigner, "Mask2FormerHead", order, |pos, weight, m| {
        match pos {
            0 => out.0 = weight,
            1 => {
                m.unimplemented("use_sigmoid", &Value::Bool(true))?;
                out.1 = weight;
            }
            _ => {
                m.unimplemented("pred_act", &Value::Bool(true))?;
                out.2 = weight;
                out.3 = m.float("eps", 1e-3)?;
                out.4 = m.flag("naive_dice", true);
            }
        }
        Ok(())
    })?;
    Ok(out)
}

/// `_seg_data_to_instance_data`: per image, the classes present (but
/// `ignore_index`) and one mask per class.
pub(super) fn instance_targets(labels: &[Tensor], ignore_index: i64) -> Vec<GtInstances> {
    let mut out = Vec::with_capacity(labels.len());
    for gt_sem_seg in labels {
        // A shape-only trace has no label values: its synthetic maps
        // hold classes 0..segments.
        let shape_only: Option<Vec<i64>> = shape_only_segments().map(|g| (0..g).collect());
        let classes = match &shape_only {
            Some(ids) => from_host(ids),
            None => gt_sem_seg.internal_unique2(false, false, false).0,
        };
        let gt_labels = classes.index(&[Some(classes.ne(ignore_index))]);
        drop(classes);
        let (h, w) = (gt_sem_seg.size()[1], gt_sem_seg.size()[2]);
        let ids: Vec<i64> = match shape_only {
            Some(ids) => ids,
            None => Vec::<i64>::try_from(&gt_labels).unwrap_or_default(),
        };
        let masks: Vec<Tensor> = ids.iter().map(|id| gt_sem_seg.eq(*id)).collect();
        let gt_masks = if masks.is_empty() {
            Tensor::zeros([0, h, w], (Kind::Int64, gt_sem_seg.device()))
        } else {
            Tensor::stack(&masks, 0).squeeze_dim(1).to_kind(Kind::Int64)
        };
        drop(masks);
        out.push(GtInstances {
            labels: gt_labels,
            masks: gt_masks,
        });
    }
    out
}

/// One image's ground truth: `labels` int64 `[G]`, `masks` int64 `[G, H, W]`.
pub struct GtInstances {
    pub labels: Tensor,
    pub masks: Tensor,
}

pub struct Mask2FormerLoss {
    cfg: Mask2FormerLossCfg,
    num_classes: i64,
    ignore_index: i64,
}

/// mmcv's `point_sample(input, points, align_corners=False)`.
pub(super) fn point_sample(input: &Tensor, points: &Tensor) -> Tensor {
    crate::models::layers::ops::point_sample(input, points, false, false)
}

/// `t[idx]` of rows of a tensor without grad (`idx` has `n` entries). A
/// shape-only trace copies the first `n` rows instead, the same output
/// without the CPU stand-in of `t` (gigabytes of ground-truth masks).
pub(super) fn take_rows(t: &Tensor, idx: &Tensor, n: usize) -> Tensor {
    if values_unavailable() && !t.requires_grad() {
        t.narrow(0, 0, n as i64).copy()
    } else {
        t.index(&[Some(idx)])
    }
}

/// mmdet's `weight_reduce_loss(..., reduction='mean', avg_factor)`.
pub(super) fn mean_over(loss: Tensor, avg_factor: &Tensor) -> Tensor {
    loss.sum(None::<Kind>) / (avg_factor + f64::from(f32::EPSILON))
}

/// mmdet's `CrossEntropyLoss(class_weight)` as `_loss_by_feat_single` calls
/// it: `avg_factor=class_weight[labels].sum()`, the label weights applied
/// by `weight_reduce_loss`. `class_weight`: the head's
/// `cls_scores.new_tensor(self.class_weight)`; the loss makes its own.
pub(super) fn class_loss(
    cls_flat: &Tensor,
    labels: &Tensor,
    label_weights: &Tensor,
    class_weight: &Tensor,
    weights: &[f64],
    loss_weight: f64,
) -> Tensor {
    let avg = class_weight.index(&[Some(labels)]).sum(None::<Kind>);
    let weight = from_host(weights).to_kind(cls_flat.kind());
    let per = cls_flat.cross_entropy_loss(labels, Some(&weight), tch::Reduction::None, -100, 0.0);
    let lw = label_weights.to_kind(Kind::Float);
    mean_over(per * lw, &avg) * loss_weight
}

impl Mask2FormerLoss {
    pub fn new(cfg: Mask2FormerLossCfg, num_classes: i64, ignore_index: i64) -> Mask2FormerLoss {
        Mask2FormerLoss {
            cfg,
            num_classes,
            ignore_index,
        }
    }

    /// The head's `loss`: the targets from the label maps, then
    /// `forward` (every decoder layer's class scores and masks), then
    /// `loss_by_feat`.
    pub fn loss(
        &self,
        labels: &[Tensor],
        forward: impl FnOnce() -> (Vec<Tensor>, Vec<Tensor>),
    ) -> LossItems {
        let targets = self.instance_targets(labels);
        let (cls, masks) = forward();
        self.loss_by_feat(&cls, &masks, &targets)
    }

    /// `_seg_data_to_instance_data` (see [`instance_targets`]).
    pub fn instance_targets(&self, labels: &[Tensor]) -> Vec<GtInstances> {
        instance_targets(labels, self.ignore_index)
    }

    /// `HungarianAssigner.assign` on the point-sampled predictions: the
    /// matched `(query, segment)` pairs, queries ascending.
    fn assign(
        &self,
        cls_score: &Tensor,
        mask_points_pred: &Tensor,
        gt: &GtInstances,
        gt_points_masks: &Tensor,
    ) -> Vec<(i64, i64)> {
        let c = &self.cfg;
        // ClassificationCost
        let cls_cost = {
            let scores = cls_score.softmax(-1, None::<Kind>);
            let picked = scores.index(&[None, Some(&gt.labels)]);
            -picked * c.cost_cls
        };
        // CrossEntropyLossCost (binary, on the sampled points)
        let ce_cost = {
            let pred = mask_points_pred.flatten(1, -1).to_kind(Kind::Float);
            let target = gt_points_masks.flatten(1, -1).to_kind(Kind::Float);
            let n = pred.size()[1] as f64;
            let bce = |t: Tensor| {
                pred.binary_cross_entropy_with_logits(
                    &t,
                    None::<Tensor>,
                    None::<Tensor>,
                    tch::Reduction::None,
                )
            };
            let pos = bce(pred.ones_like());
            let neg = bce(pred.zeros_like());
            let cost = Tensor::einsum("nc,mc->nm", &[&pos, &target], None::<i64>)
                + Tensor::einsum("nc,mc->nm", &[&neg, &target.rsub_scalar(1)], None::<i64>);
            cost / n * c.cost_mask
        };
        // DiceCost(pred_act=True)
        let dice_cost = {
            let pred = mask_points_pred.sigmoid().flatten(1, -1);
            let target = gt_points_masks.flatten(1, -1).to_kind(Kind::Float);
            binary_mask_dice_cost(
                &pred,
                &target,
                c.cost_dice_naive,
                c.cost_dice_eps,
                c.cost_dice,
            )
        };
        hungarian([cls_cost, ce_cost, dice_cost])
    }

    /// `_get_targets_single` for one image and one decoder layer.
    fn targets_single(&self, cls_score: &Tensor, mask_pred: &Tensor, gt: &GtInstances) -> Targets {
        let device = cls_score.device();
        let num_queries = cls_score.size()[0];
        let num_gts = gt.labels.size()[0];
        let point_coords = Tensor::rand([1, self.cfg.num_points, 2], (Kind::Float, device));
        let mask_points_pred = point_sample(
            &mask_pred.unsqueeze(1),
            &point_coords.repeat([num_queries, 1, 1]),
        )
        .squeeze_dim(1);
        let gt_points_masks = point_sample(
            &gt.masks.unsqueeze(1).to_kind(Kind::Float),
            &point_coords.repeat([num_gts, 1, 1]),
        )
        .squeeze_dim(1);
        let matched = if num_gts == 0 {
            Vec::new()
        } else {
            self.assign(cls_score, &mask_points_pred, gt, &gt_points_masks)
        };
        // MaskPseudoSampler / MaskSamplingResult
        let (pos, neg, pos_gt) = pseudo_sample(&matched, num_queries);
        let pos_inds = from_host(&pos);
        let neg_inds = from_host(&neg);
        let pos_assigned_gt_inds = from_host(&pos_gt);
        let sampling_result = (
            mask_pred.index(&[Some(&pos_inds)]),
            mask_pred.index(&[Some(&neg_inds)]),
            take_rows(&gt.masks, &pos_assigned_gt_inds, pos.len()),
        );
        let targets = query_targets(
            self.num_classes,
            (cls_score, mask_pred),
            gt,
            (pos, &pos_inds, &pos_assigned_gt_inds),
            (Tensor::new(), Tensor::new(), Tensor::new()),
        );
        drop((
            sampling_result,
            mask_points_pred,
            gt_points_masks,
            point_coords,
        ));
        targets
    }

    /// `get_uncertain_point_coords_with_randomness(mask_preds, None, ...)`
    /// (under `no_grad`): `[N, num_points, 2]`.
    fn uncertain_points(&self, mask_preds: &Tensor) -> Tensor {
        let c = &self.cfg;
        let n = mask_preds.size()[0];
        let device = mask_preds.device();
        let num_sampled = (c.num_points as f64 * c.oversample_ratio) as i64;
        let point_coords = Tensor::rand([n, num_sampled, 2], (Kind::Float, device));
        let point_logits = point_sample(mask_preds, &point_coords);
        let uncertainties = -point_logits.copy().abs();
        drop(point_logits);
        let num_uncertain = (c.importance_sample_ratio * c.num_points as f64) as i64;
        let num_random = c.num_points - num_uncertain;
        let (_, mut idx) = uncertainties
            .select(1, 0)
            .topk(num_uncertain, 1, true, true);
        let shift = Tensor::arange(n, (Kind::Int64, device)) * num_sampled;
        let _ = idx.g_add_(&shift.unsqueeze(1));
        let coords = point_coords
            .view([-1, 2])
            .index(&[Some(&idx.view([-1])), None])
            .view([n, num_uncertain, 2]);
        if num_random > 0 {
            let random = Tensor::rand([n, num_random, 2], (Kind::Float, device));
            Tensor::cat(&[coords, random], 1)
        } else {
            coords
        }
    }

    /// `_loss_by_feat_single`'s mask losses, `(loss_mask, loss_dice)`, on
    /// `num_points` points of the matched masks chosen by uncertainty.
    fn mask_losses(&self, m: &Matched) -> (Tensor, Tensor) {
        let c = &self.cfg;
        let (mask_preds, mask_targets, num_total_masks) =
            (&m.mask_preds, &m.mask_targets, &m.num_total_masks);
        let (points, mask_point_targets) = tch::no_grad(|| {
            let points = self.uncertain_points(&mask_preds.unsqueeze(1));
            let targets = point_sample(&mask_targets.unsqueeze(1).to_kind(Kind::Float), &points)
                .squeeze_dim(1);
            (points, targets)
        });
        let mask_point_preds = point_sample(&mask_preds.unsqueeze(1), &points).squeeze_dim(1);
        let loss_dice = dice_loss(
            &mask_point_preds,
            &mask_point_targets,
            &c.dice,
            num_total_masks,
        );
        let preds = mask_point_preds.reshape([-1]);
        let targets_flat = mask_point_targets.reshape([-1]);
        let loss_mask = {
            let valid = targets_flat
                .ge(0)
                .bitwise_and_tensor(&targets_flat.ne(-100))
                .to_kind(Kind::Float);
            let per = preds.binary_cross_entropy_with_logits(
                &targets_flat.to_kind(Kind::Float),
                None::<Tensor>,
                None::<Tensor>,
                tch::Reduction::None,
            );
            mean_over(per * valid, &(num_total_masks * c.num_points)) * c.mask_weight
        };
        (loss_mask, loss_dice)
    }

    /// `loss_by_feat`: the last layer's losses unprefixed, then `d<i>.` for
    /// the others, in mmdet's dict order.
    pub fn loss_by_feat(
        &self,
        all_cls: &[Tensor],
        all_masks: &[Tensor],
        gts: &[GtInstances],
    ) -> Vec<(String, Tensor)> {
        let _part = crate::models::scope::enter("loss");
        let per_layer: Vec<[Tensor; 3]> = all_cls
            .iter()
            .zip(all_masks)
            .map(|(cls_scores, mask_preds)| {
                let per_image =
                    |s: &Tensor, p: &Tensor, i: usize| self.targets_single(s, p, &gts[i]);
                layer_losses((cls_scores, mask_preds), &self.cfg.cls, per_image, |m| {
                    self.mask_losses(m)
                })
            })
            .collect();
        layer_loss_items(&per_layer)
    }
}

#[cfg(test)]
#[path = "mask2former_loss_tests.rs"]
mod tests;
