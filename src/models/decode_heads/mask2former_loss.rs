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
use super::query_loss::{hungarian, layer_loss_items, matched_queries, query_targets, Targets};
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::host::{from_host, shape_only_segments, values_unavailable};
use crate::models::ModelError;
use tch::{Kind, Tensor};

const MMDET_LOSSES: &str = "mmdet/models/losses/";
const ASSIGNER_SOURCE: &str = "mmdet/models/task_modules/assigners/";

/// The head's `loss_cls`, `loss_mask`, `loss_dice` and `train_cfg`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mask2FormerLossCfg {
    /// `loss_cls.class_weight`: `num_classes + 1` weights, no-object last.
    pub class_weight: Vec<f64>,
    pub cls_weight: f64,
    pub mask_weight: f64,
    pub dice_weight: f64,
    pub dice_eps: f64,
    pub dice_naive: bool,
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
        let (cls_weight, class_weight) = class_loss_cfg(c, num_classes, 2.0, "Mask2FormerHead")?;

        let mask = c.dict("loss_mask")?.unwrap_or(&empty);
        check_type(mask, "CrossEntropyLoss", "loss_mask")?;
        let mut m = ComponentConfig::new(mask, "CrossEntropyLoss", MMDET_LOSSES);
        m.unimplemented("use_sigmoid", &Value::Bool(true))?;
        m.unimplemented("reduction", &Value::Str("mean".into()))?;
        m.unimplemented("class_weight", &Value::None)?;
        m.unimplemented("avg_non_ignore", &Value::Bool(false))?;
        let mask_weight = m.float("loss_weight", 5.0)?;
        m.finish()?;

        let dice = c.dict("loss_dice")?.unwrap_or(&empty);
        check_type(dice, "DiceLoss", "loss_dice")?;
        let mut d = ComponentConfig::new(dice, "DiceLoss", MMDET_LOSSES);
        d.unimplemented("use_sigmoid", &Value::Bool(true))?;
        d.unimplemented("activate", &Value::Bool(true))?;
        d.unimplemented("reduction", &Value::Str("mean".into()))?;
        let dice_naive = d.flag("naive_dice", true);
        let dice_eps = d.float("eps", 1.0)?;
        let dice_weight = d.float("loss_weight", 5.0)?;
        d.finish()?;

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
            class_weight,
            cls_weight,
            mask_weight,
            dice_weight,
            dice_eps,
            dice_naive,
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

/// The head's `loss_cls` (mmdet's `CrossEntropyLoss` over the classes and
/// no-object): `(loss_weight, class_weight)`.
pub(super) fn class_loss_cfg(
    c: &mut ComponentConfig,
    num_classes: i64,
    default_weight: f64,
    head: &str,
) -> Result<(f64, Vec<f64>), ModelError> {
    let empty = Dict::new();
    let cls = c.dict("loss_cls")?.unwrap_or(&empty);
    let mut l = ComponentConfig::new(cls, "CrossEntropyLoss", MMDET_LOSSES);
    check_type(cls, "CrossEntropyLoss", "loss_cls")?;
    l.unimplemented("use_sigmoid", &Value::Bool(false))?;
    l.unimplemented("use_mask", &Value::Bool(false))?;
    l.unimplemented("reduction", &Value::Str("mean".into()))?;
    l.unimplemented("avg_non_ignore", &Value::Bool(false))?;
    l.unimplemented("ignore_index", &Value::None)?;
    let cls_weight = l.float("loss_weight", default_weight)?;
    let mut class_weight = l.floats("class_weight")?.unwrap_or_default();
    l.finish()?;
    if class_weight.is_empty() {
        // mmdet's default [1.0] * 133 + [0.1] is for COCO panoptic.
        return Err(ModelError::config(
            head,
            "loss_cls.class_weight must be set (num_classes + 1 weights, no-object last)",
        ));
    }
    if class_weight.len() as i64 != num_classes + 1 {
        return Err(ModelError::config(head, format!(
            "loss_cls.class_weight has {} weights for num_classes {num_classes} (needs num_classes + 1)",
            class_weight.len()
        )));
    }
    class_weight.shrink_to_fit();
    Ok((cls_weight, class_weight))
}

/// `HungarianAssigner(match_costs=[ClassificationCost, CrossEntropyLossCost,
/// DiceCost])`, each cost at most once and in that order (as every MMSeg
/// config has them): their weights and Dice's `eps` and `naive_dice`.
fn match_costs(assigner: Option<&Dict>) -> Result<(f64, f64, f64, f64, bool), ModelError> {
    let Some(a) = assigner else {
        return Err(ModelError::config(
            "Mask2FormerHead",
            "train_cfg.assigner must be set",
        ));
    };
    check_type(a, "HungarianAssigner", "train_cfg.assigner")?;
    let mut c = ComponentConfig::new(a, "HungarianAssigner", ASSIGNER_SOURCE);
    let costs = c
        .value("match_costs")
        .and_then(|v| v.as_seq().map(<[Value]>::to_vec))
        .unwrap_or_default();
    c.finish()?;
    let mut out = (0.0, 0.0, 0.0, 1e-3, true);
    let order = ["ClassificationCost", "CrossEntropyLossCost", "DiceCost"];
    let mut next = 0;
    for cost in &costs {
        let d = cost.as_dict().ok_or_else(|| {
            ModelError::config("HungarianAssigner", "each match cost must be a dict")
        })?;
        let ty = d.get("type").and_then(Value::as_str).unwrap_or("");
        let name = ty.trim_start_matches("mmdet.");
        let pos = order.iter().position(|o| *o == name).ok_or_else(|| {
            ModelError::unsupported_in(
                "HungarianAssigner",
                format!("{ASSIGNER_SOURCE}match_cost.py"),
                "match_costs",
                format!("`{ty}` (implemented: {})", order.join(", ")),
            )
        })?;
        if pos < next {
            return Err(ModelError::unsupported(
                "HungarianAssigner",
                "match_costs",
                format!("out of the order {} or repeated", order.join(", ")),
            ));
        }
        next = pos + 1;
        let mut m = ComponentConfig::new(d, "match cost", ASSIGNER_SOURCE);
        let weight = m.float("weight", 1.0)?;
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
        m.finish()?;
    }
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
            let numerator = Tensor::einsum("nc,mc->nm", &[&pred, &target], None::<i64>) * 2;
            let denominator = if c.cost_dice_naive {
                pred.sum_dim_intlist(-1, false, None::<Kind>).unsqueeze(1)
                    + target.sum_dim_intlist(-1, false, None::<Kind>).unsqueeze(0)
            } else {
                pred.pow_tensor_scalar(2)
                    .sum_dim_intlist(1, false, None::<Kind>)
                    .unsqueeze(1)
                    + target
                        .pow_tensor_scalar(2)
                        .sum_dim_intlist(1, false, None::<Kind>)
                        .unsqueeze(0)
            };
            let eps = c.cost_dice_eps;
            ((numerator + eps) / (denominator + eps)).rsub_scalar(1) * c.cost_dice
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
        let mut positive = vec![false; num_queries as usize];
        let mut assigned = vec![0i64; num_queries as usize];
        for (q, g) in &matched {
            positive[*q as usize] = true;
            assigned[*q as usize] = *g;
        }
        let pos: Vec<i64> = (0..num_queries).filter(|q| positive[*q as usize]).collect();
        let neg: Vec<i64> = (0..num_queries)
            .filter(|q| !positive[*q as usize])
            .collect();
        let pos_gt: Vec<i64> = pos.iter().map(|q| assigned[*q as usize]).collect();
        let pos_inds = from_host(&pos);
        let neg_inds = from_host(&neg);
        let pos_assigned_gt_inds = from_host(&pos_gt);
        let sampling_result = (
            mask_pred.index(&[Some(&pos_inds)]),
            mask_pred.index(&[Some(&neg_inds)]),
            take_rows(&gt.masks, &pos_assigned_gt_inds, pos.len()),
        );
        let (labels, label_weights, mask_targets, mask_weights) = query_targets(
            self.num_classes,
            cls_score,
            mask_pred,
            gt,
            (&pos_inds, &pos_assigned_gt_inds, pos.len()),
        );
        drop((
            sampling_result,
            mask_points_pred,
            gt_points_masks,
            point_coords,
        ));
        Targets {
            labels,
            label_weights,
            mask_targets,
            mask_weights,
            num_pos: (pos.len() as i64).max(1),
            pos,
            sampling: (Tensor::new(), Tensor::new(), Tensor::new()),
        }
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

    /// `_loss_by_feat_single`: `(loss_cls, loss_mask, loss_dice)` of one
    /// decoder layer.
    fn loss_single(
        &self,
        cls_scores: &Tensor,
        mask_preds: &Tensor,
        gts: &[GtInstances],
    ) -> [Tensor; 3] {
        let c = &self.cfg;
        let num_imgs = cls_scores.size()[0];
        let targets: Vec<Targets> = (0..num_imgs)
            .map(|i| {
                self.targets_single(
                    &cls_scores.select(0, i),
                    &mask_preds.select(0, i),
                    &gts[i as usize],
                )
            })
            .collect();
        let m = match matched_queries(
            targets,
            cls_scores,
            mask_preds,
            &c.class_weight,
            c.cls_weight,
        ) {
            Ok(m) => m,
            Err(losses) => return losses,
        };
        let (mask_preds, mask_targets, num_total_masks) =
            (&m.mask_preds, &m.mask_targets, &m.num_total_masks);
        let (points, mask_point_targets) = tch::no_grad(|| {
            let points = self.uncertain_points(&mask_preds.unsqueeze(1));
            let targets = point_sample(&mask_targets.unsqueeze(1).to_kind(Kind::Float), &points)
                .squeeze_dim(1);
            (points, targets)
        });
        let mask_point_preds = point_sample(&mask_preds.unsqueeze(1), &points).squeeze_dim(1);
        let loss_dice = {
            let input = mask_point_preds.sigmoid().flatten(1, -1);
            let target = mask_point_targets.flatten(1, -1).to_kind(Kind::Float);
            let a = (&input * &target).sum_dim_intlist(1, false, None::<Kind>);
            let eps = c.dice_eps;
            let d = if c.dice_naive {
                let b = input.sum_dim_intlist(1, false, None::<Kind>);
                let cc = target.sum_dim_intlist(1, false, None::<Kind>);
                (a * 2 + eps) / (b + cc + eps)
            } else {
                let b = (&input * &input).sum_dim_intlist(1, false, None::<Kind>) + eps;
                let cc = (&target * &target).sum_dim_intlist(1, false, None::<Kind>) + eps;
                a * 2 / (b + cc)
            };
            mean_over(d.rsub_scalar(1), num_total_masks) * c.dice_weight
        };
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
        let loss_cls = m.release();
        [loss_cls, loss_mask, loss_dice]
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
            .map(|(c, m)| self.loss_single(c, m, gts))
            .collect();
        layer_loss_items(&per_layer)
    }
}

#[cfg(test)]
#[path = "mask2former_loss_tests.rs"]
mod tests;
