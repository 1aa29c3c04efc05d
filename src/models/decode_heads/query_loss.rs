//! The parts of mmdet's `MaskFormerHead` losses that `Mask2FormerHead`
//! inherits unchanged (`mmdet/models/dense_heads/maskformer_head.py`;
//! mmdet derives the one head from the other): the Hungarian matching
//! ([`hungarian`]) and `DiceCost`, the `MaskPseudoSampler`, the per-image
//! targets `_get_targets_single` returns ([`Targets`]),
//! `_loss_by_feat_single` around the mask losses (the class cross-entropy
//! and the matched queries' masks, then what it keeps freed:
//! [`layer_losses`]), mmdet's `DiceLoss`, and `loss_by_feat`'s names for
//! each decoder layer's losses ([`layer_loss_items`]). What each head
//! matches on and its mask loss stay its own (`maskformer_loss.rs`,
//! `mask2former_loss.rs`).
//!
//! Cheng et al., "Per-Pixel Classification is Not All You Need for Semantic
//! Segmentation", NeurIPS 2021, arXiv:2107.06278.

use super::mask2former_loss::{class_loss, mean_over, take_rows, GtInstances};
use super::query_loss_cfg::{ClassLossCfg, DiceLossCfg};
use crate::models::layers::host::{from_host, scalar_from_host, values_unavailable};
use tch::{Kind, Tensor};

/// `HungarianAssigner.assign` from its three weighted costs (class, mask,
/// Dice; each `[Q, G]`): the matched `(query, segment)` pairs, queries
/// ascending, by scipy's `linear_sum_assignment` on the summed cost (the
/// `lsap` crate, the same algorithm).
pub(super) fn hungarian(costs: [Tensor; 3]) -> Vec<(i64, i64)> {
    let cost = Tensor::stack(&costs, 0).sum_dim_intlist(0, false, None::<Kind>);
    drop(costs);
    let (nr, nc) = (cost.size()[0] as usize, cost.size()[1] as usize);
    // `cost.detach().cpu()` and scipy's view of it.
    let host_cost = cost.detach().to_kind(Kind::Double).reshape([-1]);
    if values_unavailable() {
        // A shape-only trace has no values to match on: any complete
        // matching has the same shapes.
        return (0..nr.min(nc) as i64).map(|i| (i, i)).collect();
    }
    let values = Vec::<f64>::try_from(&host_cost).expect("a cost matrix");
    let (rows, cols) = lsap::solve(nr, nc, &values, false).unwrap_or_default();
    rows.into_iter()
        .zip(cols)
        .map(|(r, c)| (r as i64, c as i64))
        .collect()
}

/// `DiceCost.binary_mask_dice_loss` of the (activated) masks `pred`
/// `[Q, P]` against the segments `target` `[G, P]` (float), times the cost's
/// `weight`: `[Q, G]`.
pub(super) fn binary_mask_dice_cost(
    pred: &Tensor,
    target: &Tensor,
    naive: bool,
    eps: f64,
    weight: f64,
) -> Tensor {
    let numerator = Tensor::einsum("nc,mc->nm", &[pred, target], None::<i64>) * 2;
    let denominator = if naive {
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
    ((numerator + eps) / (denominator + eps)).rsub_scalar(1) * weight
}

/// `MaskPseudoSampler` of the `matched` `(query, segment)` pairs: the
/// positive queries ascending, the negative ones, and each positive's
/// segment.
pub(super) fn pseudo_sample(
    matched: &[(i64, i64)],
    num_queries: i64,
) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    let mut assigned = vec![None; num_queries as usize];
    for (q, g) in matched {
        assigned[*q as usize] = Some(*g);
    }
    let (pos, neg): (Vec<i64>, Vec<i64>) =
        (0..num_queries).partition(|q| assigned[*q as usize].is_some());
    let pos_gt = pos.iter().filter_map(|q| assigned[*q as usize]).collect();
    (pos, neg, pos_gt)
}

/// The end of `_get_targets_single`: the queries' class labels (the
/// no-object class `num_classes` but where matched), their weights, the
/// matched segments' masks and the mask weights (1 where matched), from
/// the matched queries `pos` (on the device, `pos_inds`) and their
/// segments `pos_gt_inds`; `sampling` as [`Targets::sampling`] says.
pub(super) fn query_targets(
    num_classes: i64,
    (cls_score, mask_pred): (&Tensor, &Tensor),
    gt: &GtInstances,
    (pos, pos_inds, pos_gt_inds): (Vec<i64>, &Tensor, &Tensor),
    sampling: (Tensor, Tensor, Tensor),
) -> Targets {
    let device = cls_score.device();
    let num_queries = cls_score.size()[0];
    let mut labels = Tensor::full([num_queries], num_classes, (Kind::Int64, device));
    let _ = labels.index_put_(
        &[Some(pos_inds)],
        &gt.labels.index(&[Some(pos_gt_inds)]),
        false,
    );
    let label_weights = Tensor::ones([num_queries], (Kind::Int64, device));
    let mask_targets = take_rows(&gt.masks, pos_gt_inds, pos.len());
    let mut mask_weights = Tensor::zeros([num_queries], (mask_pred.kind(), device));
    let one = scalar_from_host(1.0f32).to_kind(mask_pred.kind());
    let _ = mask_weights.index_put_(&[Some(pos_inds)], &one, false);
    Targets {
        labels,
        label_weights,
        mask_targets,
        mask_weights,
        num_pos: (pos.len() as i64).max(1),
        pos,
        sampling,
    }
}

/// What `_get_targets_single` returns and the loss keeps.
pub(super) struct Targets {
    pub labels: Tensor,
    pub label_weights: Tensor,
    pub mask_targets: Tensor,
    pub mask_weights: Tensor,
    pub num_pos: i64,
    /// The matched queries (`pos_inds`), ascending.
    pub pos: Vec<i64>,
    /// The `MaskSamplingResult`'s masks (pos, neg, pos ground truth), where
    /// `multi_apply`'s results keep them until `get_targets` returns
    /// (MaskFormer); undefined where they are dropped at once.
    pub sampling: (Tensor, Tensor, Tensor),
}

/// `_loss_by_feat_single` up to its mask losses: the class loss, the
/// number of matched masks, and the matched queries' masks with their
/// targets. `held` keeps what the Python function keeps alive to its end.
pub(super) struct Matched {
    pub loss_cls: Tensor,
    pub num_total_masks: Tensor,
    /// `mask_preds[mask_weights > 0]`: `[M, h, w]`.
    pub mask_preds: Tensor,
    /// `[M, H, W]`.
    pub mask_targets: Tensor,
    held: (Vec<Targets>, Tensor, Tensor, Tensor, Tensor),
}

impl Matched {
    /// The class loss, what the loss kept to its end freed (the targets
    /// first, as the Python function's locals go).
    pub fn release(self) -> Tensor {
        let Matched {
            loss_cls,
            held,
            mask_targets,
            ..
        } = self;
        drop((held, mask_targets));
        loss_cls
    }
}

/// The class loss and the matched masks of one decoder layer (`cls_scores`
/// `[B, Q, C+1]`, `mask_preds` `[B, Q, h, w]`) from each image's targets
/// (`targets_single(cls_score, mask_pred, image)`, `get_targets`'s
/// `multi_apply`, whose sampling results go when it returns); `Err` with
/// the layer's three losses where no query matched (the mask losses then
/// `mask_preds.sum()`, zero).
fn matched_queries(
    cls_scores: &Tensor,
    mask_preds: &Tensor,
    cls: &ClassLossCfg,
    mut targets_single: impl FnMut(&Tensor, &Tensor, usize) -> Targets,
) -> Result<Matched, [Tensor; 3]> {
    let (class_weight, cls_weight) = (&cls.class_weight, cls.weight);
    let num_imgs = cls_scores.size()[0];
    let mut targets: Vec<Targets> = (0..num_imgs)
        .map(|i| {
            targets_single(
                &cls_scores.select(0, i),
                &mask_preds.select(0, i),
                i as usize,
            )
        })
        .collect();
    for t in &mut targets {
        t.sampling = (Tensor::new(), Tensor::new(), Tensor::new());
    }
    let avg_factor: i64 = targets.iter().map(|t| t.num_pos).sum();
    let field = |f: fn(&Targets) -> &Tensor| -> Vec<Tensor> {
        targets.iter().map(|t| f(t).shallow_clone()).collect()
    };
    let labels = Tensor::stack(&field(|t| &t.labels), 0);
    let label_weights = Tensor::stack(&field(|t| &t.label_weights), 0);
    let mask_targets = Tensor::cat(&field(|t| &t.mask_targets), 0);
    let mask_weights = Tensor::stack(&field(|t| &t.mask_weights), 0);
    let cls_flat = cls_scores.flatten(0, 1);
    let labels = labels.flatten(0, 1);
    let label_weights = label_weights.flatten(0, 1);
    let class_weight_tensor = from_host(class_weight).to_kind(cls_flat.kind());
    let loss_cls = class_loss(
        &cls_flat,
        &labels,
        &label_weights,
        &class_weight_tensor,
        class_weight,
        cls_weight,
    );
    let num_total_masks = from_host(&[avg_factor as f32]).to_kind(cls_flat.kind());
    // `mask_preds[mask_weights > 0]`, indexed by the matched queries'
    // positions (known on the host, also where values are not).
    let queries = mask_preds.size()[1];
    let positions: Vec<i64> = targets
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.pos.iter().map(move |q| i as i64 * queries + q))
        .collect();
    let mask_preds = mask_preds
        .flatten(0, 1)
        .index(&[Some(from_host(&positions))]);
    if mask_targets.size()[0] == 0 {
        let zero = mask_preds.sum(None::<Kind>);
        return Err([loss_cls, zero.shallow_clone(), zero]);
    }
    Ok(Matched {
        loss_cls,
        num_total_masks,
        mask_preds,
        mask_targets,
        held: (
            targets,
            mask_weights,
            class_weight_tensor,
            labels,
            label_weights,
        ),
    })
}

/// `_loss_by_feat_single`: `(loss_cls, loss_mask, loss_dice)` of one
/// decoder layer, the matched queries' mask losses from `mask_losses`
/// (`(loss_mask, loss_dice)`), then what the Python function kept freed.
pub(super) fn layer_losses(
    (cls_scores, mask_preds): (&Tensor, &Tensor),
    cls: &ClassLossCfg,
    targets_single: impl FnMut(&Tensor, &Tensor, usize) -> Targets,
    mask_losses: impl FnOnce(&Matched) -> (Tensor, Tensor),
) -> [Tensor; 3] {
    let m = match matched_queries(cls_scores, mask_preds, cls, targets_single) {
        Ok(m) => m,
        Err(losses) => return losses,
    };
    let (loss_mask, loss_dice) = mask_losses(&m);
    let loss_cls = m.release();
    [loss_cls, loss_mask, loss_dice]
}

/// mmdet's `DiceLoss` (sigmoid activation) of the mask logits `preds`
/// `[N, ...]` against `targets`, averaged over `avg`.
pub(super) fn dice_loss(
    preds: &Tensor,
    targets: &Tensor,
    dice: &DiceLossCfg,
    avg: &Tensor,
) -> Tensor {
    let input = preds.sigmoid().flatten(1, -1);
    let target = targets.flatten(1, -1).to_kind(Kind::Float);
    let a = (&input * &target).sum_dim_intlist(1, false, None::<Kind>);
    let eps = dice.eps;
    let d = if dice.naive {
        let b = input.sum_dim_intlist(1, false, None::<Kind>);
        let cc = target.sum_dim_intlist(1, false, None::<Kind>);
        (a * 2 + eps) / (b + cc + eps)
    } else {
        let b = (&input * &input).sum_dim_intlist(1, false, None::<Kind>) + eps;
        let cc = (&target * &target).sum_dim_intlist(1, false, None::<Kind>) + eps;
        a * 2 / (b + cc)
    };
    mean_over(d.rsub_scalar(1), avg) * dice.weight
}

/// `loss_by_feat`'s items: the last layer's losses unprefixed, then
/// `d<i>.` for the others, in mmdet's dict order.
pub(super) fn layer_loss_items(per_layer: &[[Tensor; 3]]) -> Vec<(String, Tensor)> {
    let names = ["loss_cls", "loss_mask", "loss_dice"];
    let last = per_layer.len() - 1;
    let mut items: Vec<(String, Tensor)> = names
        .iter()
        .zip(per_layer[last].iter())
        .map(|(n, t)| (n.to_string(), t.shallow_clone()))
        .collect();
    for (i, losses) in per_layer[..last].iter().enumerate() {
        for (n, t) in names.iter().zip(losses.iter()) {
            items.push((format!("d{i}.{n}"), t.shallow_clone()));
        }
    }
    items
}
