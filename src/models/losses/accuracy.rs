//! mmseg's `accuracy` (`mmseg/models/losses/accuracy.py`): the top-1 pixel
//! accuracy `acc_seg` that BaseDecodeHead computes on the full-resolution
//! logits in every training step.

use tch::{Kind, Tensor};

/// `accuracy(pred, target, topk=1, ignore_index=...)`, with its locals'
/// lifetimes: `pred_value` and `pred_label` live to the end, rebinding
/// `correct` frees the previous one.
pub fn accuracy(pred: &Tensor, target: &Tensor, ignore_index: i64) -> Tensor {
    let (pred_value, pred_label) = pred.topk(1, 1, true, true);
    let pred_label = pred_label.transpose(0, 1);
    let mut correct = pred_label.eq_tensor(&target.unsqueeze(0).expand_as(&pred_label));
    correct = {
        let keep = target.ne(ignore_index);
        correct.index(&[None, Some(&keep)])
    };
    let eps = f32::EPSILON as f64;
    let correct_k = {
        let flat = correct.narrow(0, 0, 1).reshape([-1]);
        let as_float = flat.to_kind(Kind::Float);
        let summed = as_float.sum_dim_intlist(0, true, None::<Kind>);
        drop(as_float);
        summed + eps
    };
    let total = {
        let keep = target.ne(ignore_index);
        let kept = target.index(&[Some(&keep)]);
        drop(keep);
        kept.numel() as f64 + eps
    };
    let mut correct_k = correct_k;
    let result = correct_k.g_mul_scalar_(100.0 / total);
    drop((pred_value, pred_label, correct));
    result
}

#[cfg(test)]
#[path = "accuracy_tests.rs"]
mod tests;
