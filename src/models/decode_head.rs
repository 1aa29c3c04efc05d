//! What every MMSeg decode head shares (`BaseDecodeHead` in
//! `mmseg/models/decode_heads/decode_head.py`): the final dropout + 1x1
//! classifier (`cls_seg`) and the training loss (`loss_by_feat`): logits
//! upsampled to the label size, cross-entropy per pixel reduced by MMSeg's
//! `weight_reduce_loss`, and the pixel accuracy that MMSeg computes on the
//! full-resolution logits in every training step.

use super::layers::{resize_bilinear, Conv2d, ConvSpec};
use super::params::ParamScope;
use super::{cfg_f64, cfg_i64, ModelError};
use crate::config::{Dict, Value};
use tch::{Kind, Reduction, Tensor};

/// `loss_decode` (a `CrossEntropyLoss`).
#[derive(Debug, Clone, PartialEq)]
pub struct CrossEntropyCfg {
    pub loss_weight: f64,
    pub class_weight: Option<Vec<f64>>,
    pub avg_non_ignore: bool,
    pub loss_name: String,
}

impl CrossEntropyCfg {
    pub fn from_cfg(v: Option<&Value>) -> Result<Vec<CrossEntropyCfg>, ModelError> {
        let items: Vec<&Dict> = match v {
            None => {
                return Ok(vec![CrossEntropyCfg {
                    loss_weight: 1.0,
                    class_weight: None,
                    avg_non_ignore: false,
                    loss_name: "loss_ce".into(),
                }])
            }
            Some(Value::Dict(d)) => vec![d],
            Some(Value::List(l)) | Some(Value::Tuple(l)) => {
                l.iter().filter_map(Value::as_dict).collect()
            }
            Some(other) => {
                return Err(ModelError::Config(format!(
                    "loss_decode must be a dict or a list of dicts, not {}",
                    other.type_name()
                )))
            }
        };
        items
            .into_iter()
            .map(|d| {
                let ty = d.get("type").and_then(Value::as_str).unwrap_or("");
                if ty != "CrossEntropyLoss" {
                    return Err(ModelError::Unsupported(format!(
                        "loss type `{ty}` (supported: CrossEntropyLoss)"
                    )));
                }
                if d.get("use_sigmoid").is_some_and(Value::truthy)
                    || d.get("use_mask").is_some_and(Value::truthy)
                {
                    return Err(ModelError::Unsupported(
                        "CrossEntropyLoss with use_sigmoid or use_mask".into(),
                    ));
                }
                let class_weight = match d.get("class_weight") {
                    None | Some(Value::None) => None,
                    Some(Value::List(l)) | Some(Value::Tuple(l)) => {
                        Some(l.iter().filter_map(Value::as_f64).collect())
                    }
                    Some(Value::Str(_)) => {
                        return Err(ModelError::Unsupported(
                            "class_weight read from a file".into(),
                        ))
                    }
                    Some(other) => {
                        return Err(ModelError::Config(format!(
                            "class_weight must be a list, not {}",
                            other.type_name()
                        )))
                    }
                };
                Ok(CrossEntropyCfg {
                    loss_weight: cfg_f64(d, "loss_weight", 1.0)?,
                    class_weight,
                    avg_non_ignore: d.get("avg_non_ignore").is_some_and(Value::truthy),
                    loss_name: d
                        .get("loss_name")
                        .and_then(Value::as_str)
                        .unwrap_or("loss_ce")
                        .to_string(),
                })
            })
            .collect()
    }
}

/// The settings `BaseDecodeHead.__init__` reads.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeHeadCfg {
    pub in_channels: Vec<i64>,
    pub in_index: Vec<i64>,
    pub channels: i64,
    pub num_classes: i64,
    pub dropout_ratio: f64,
    pub align_corners: bool,
    pub ignore_index: i64,
    pub norm: Option<super::NormCfg>,
    pub losses: Vec<CrossEntropyCfg>,
}

impl DecodeHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<DecodeHeadCfg, ModelError> {
        let ints = |key: &str| -> Result<Vec<i64>, ModelError> {
            match d.get(key) {
                Some(Value::Int(i)) => Ok(vec![*i]),
                Some(v) => v
                    .as_seq()
                    .map(|s| s.iter().filter_map(Value::as_i64).collect())
                    .ok_or_else(|| {
                        ModelError::Config(format!(
                            "decode head `{key}` must be an int or a list of ints"
                        ))
                    }),
                None => Err(ModelError::Config(format!("decode head lacks `{key}`"))),
            }
        };
        if d.get("sampler").is_some_and(|s| !matches!(s, Value::None)) {
            return Err(ModelError::Unsupported(
                "decode head `sampler` (OHEM)".into(),
            ));
        }
        let out_channels = d.get("out_channels").and_then(Value::as_i64);
        let num_classes = cfg_i64(d, "num_classes", 0)?;
        if out_channels.is_some_and(|o| o != num_classes) {
            return Err(ModelError::Unsupported(
                "decode head with out_channels != num_classes (sigmoid heads)".into(),
            ));
        }
        Ok(DecodeHeadCfg {
            in_channels: ints("in_channels")?,
            in_index: d
                .get("in_index")
                .map(|_| ints("in_index"))
                .transpose()?
                .unwrap_or_else(|| vec![-1]),
            channels: cfg_i64(d, "channels", 0)?,
            num_classes,
            dropout_ratio: cfg_f64(d, "dropout_ratio", 0.1)?,
            align_corners: d.get("align_corners").is_some_and(Value::truthy),
            ignore_index: cfg_i64(d, "ignore_index", 255)?,
            norm: super::NormCfg::from_cfg(d.get("norm_cfg"))?,
            losses: CrossEntropyCfg::from_cfg(d.get("loss_decode"))?,
        })
    }
}

/// `cls_seg` and `loss_by_feat`.
pub struct DecodeHeadBase {
    pub cfg: DecodeHeadCfg,
    conv_seg: Conv2d,
}

/// The losses of one head, as `loss_by_feat` returns them.
pub struct HeadLosses {
    /// `(name, value)`, e.g. `("loss_ce", ...)`.
    pub losses: Vec<(String, Tensor)>,
    pub accuracy: Tensor,
}

impl DecodeHeadBase {
    /// `conv_seg` is registered after the head's own layers, as in MMSeg
    /// (BaseDecodeHead registers it in `__init__` before the subclass adds
    /// its modules, but `named_parameters` lists it first: callers create
    /// it first for that reason).
    pub fn new(p: &mut ParamScope, cfg: DecodeHeadCfg) -> DecodeHeadBase {
        let conv_seg = Conv2d::new(
            &mut p.sub("conv_seg"),
            ConvSpec::new(cfg.channels, cfg.num_classes, 1),
        );
        DecodeHeadBase { cfg, conv_seg }
    }

    pub fn cls_seg(&self, feat: Tensor, training: bool) -> Tensor {
        let feat = if self.cfg.dropout_ratio > 0.0 {
            feat.feature_dropout(self.cfg.dropout_ratio, training)
        } else {
            feat
        };
        self.conv_seg.forward(&feat)
    }

    /// `loss_by_feat(seg_logits, data_samples)`; `labels` are the per-image
    /// `1 x H x W` label maps (`gt_sem_seg.data`).
    pub fn loss_by_feat(&self, seg_logits: &Tensor, labels: &[Tensor]) -> HeadLosses {
        // Python rebinds `seg_logits` and `seg_label`: the old tensors die at
        // once (unless autograd saved them), so do the same here.
        let mut seg_label = Tensor::stack(labels, 0);
        let size = (seg_label.size()[2], seg_label.size()[3]);
        let seg_logits = resize_bilinear(seg_logits, size, self.cfg.align_corners);
        seg_label = seg_label.squeeze_dim(1);
        let mut losses: Vec<(String, Tensor)> = Vec::new();
        for loss_cfg in &self.cfg.losses {
            let value = self.cross_entropy(&seg_logits, &seg_label, loss_cfg);
            match losses.iter_mut().find(|(n, _)| *n == loss_cfg.loss_name) {
                Some((_, acc)) => *acc = &*acc + value,
                None => losses.push((loss_cfg.loss_name.clone(), value)),
            }
        }
        let accuracy = accuracy(&seg_logits, &seg_label, self.cfg.ignore_index);
        HeadLosses { losses, accuracy }
    }

    /// mmseg's `CrossEntropyLoss.forward` -> `cross_entropy` ->
    /// `weight_reduce_loss`.
    fn cross_entropy(&self, pred: &Tensor, label: &Tensor, c: &CrossEntropyCfg) -> Tensor {
        let class_weight = c.class_weight.as_ref().map(|w| {
            Tensor::from_slice(w)
                .to_kind(pred.kind())
                .to_device(pred.device())
        });
        let loss = if super::layers::softmax_keeps_input() {
            // F.cross_entropy = nll_loss(log_softmax(pred, 1)), as ATen composes
            // it; spelled out to reach the log_softmax.
            let log_probs = pred.log_softmax(1, pred.kind());
            super::layers::softmax_saved(pred, &log_probs);
            log_probs.nll_loss_nd(
                label,
                class_weight.as_ref(),
                Reduction::None,
                self.cfg.ignore_index,
            )
        } else {
            // One op, as CPU autocast has its own rule for it.
            pred.cross_entropy_loss(
                label,
                class_weight.as_ref(),
                Reduction::None,
                self.cfg.ignore_index,
                0.0,
            )
        };
        let eps = f32::EPSILON as f64;
        let avg_factor = match &class_weight {
            None if c.avg_non_ignore => {
                let ignored = label
                    .eq(self.cfg.ignore_index)
                    .sum(Kind::Int64)
                    .int64_value(&[]);
                label.numel() as f64 - ignored as f64
            }
            None => label.numel() as f64,
            Some(w) => {
                // torch.stack([class_weight[cls] for cls in label]) gathers one weight per pixel.
                let safe = label.clamp(0, w.size()[0] - 1);
                let mut weights = w.index(&[Some(&safe)]);
                if c.avg_non_ignore {
                    let _ = weights.masked_fill_(&label.eq(self.cfg.ignore_index), 0.0);
                }
                weights.sum(Kind::Float).double_value(&[])
            }
        };
        let reduced = loss.sum(loss.kind()) / (avg_factor + eps);
        drop(loss);
        reduced * c.loss_weight
    }
}

/// mmseg's `accuracy(pred, target, topk=1, ignore_index=...)`, with its
/// locals' lifetimes: `pred_value` and `pred_label` live to the end,
/// rebinding `correct` frees the previous one.
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
