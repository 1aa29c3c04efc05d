//! `PointHead`, PointRend's point head, as MMSeg's
//! `mmseg/models/decode_heads/point_head.py` builds it: the second stage of
//! a `CascadeEncoderDecoder` after an FPNHead.
//!
//! Kirillov et al., "PointRend: Image Segmentation as Rendering", CVPR
//! 2020, arXiv:1912.08193.
//!
//! In training, `num_points` points per image are chosen without gradient
//! (`oversample_ratio` times as many random points, the most uncertain
//! `importance_sample_ratio` of them by the coarse logits' top-2 margin,
//! the rest random); the fine features and the coarse logits are sampled
//! there (`point_sample`), classified by 1x1 Conv1d layers, and the loss is
//! taken against the labels sampled at the same points. In inference
//! (`predict`), `subdivision_steps` times: the logits are upsampled by
//! `scale_factor`, the `subdivision_num_points` most uncertain pixels are
//! classified again from the fine features and the coarse logits, and their
//! logits scattered back in place.

use super::decode_head::{DecodeHeadBase, DecodeHeadCfg, InputTransform};
use super::{DecodeHead, LossItems};
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::ops::point_sample;
use crate::models::layers::{count_flops, resize_bilinear};
use crate::models::losses::accuracy;
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/point_head.py";

/// The registry's constructor (`DECODE_HEADS` row `PointHead`); the
/// segmentor hands it `model.train_cfg` and `model.test_cfg` as
/// `train_cfg` and `test_cfg`.
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = PointHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(PointHead::new(p, cfg)))
}

/// `model.train_cfg` of PointRend: `num_points`, `oversample_ratio`,
/// `importance_sample_ratio`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PointSampling {
    pub num_points: i64,
    pub oversample_ratio: f64,
    pub importance_sample_ratio: f64,
}

/// `model.test_cfg` of PointRend: `subdivision_steps`,
/// `subdivision_num_points`, `scale_factor` (MMSeg reads them as attributes:
/// without them its inference fails, segtune's is refused).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Subdivision {
    pub steps: i64,
    pub num_points: i64,
    pub scale_factor: f64,
}

impl Subdivision {
    /// From a `test_cfg` dict; `None` when it lacks any of the three keys.
    pub fn from_test_cfg(test_cfg: &Dict) -> Result<Option<Subdivision>, ModelError> {
        let keys = [
            "subdivision_steps",
            "subdivision_num_points",
            "scale_factor",
        ];
        if !keys.iter().all(|k| test_cfg.contains_key(*k)) {
            return Ok(None);
        }
        let mut t = ComponentConfig::new(test_cfg, "PointRend test_cfg", SOURCE);
        let sub = Subdivision {
            steps: t.int("subdivision_steps", 0)?,
            num_points: t.int("subdivision_num_points", 0)?,
            scale_factor: t.float("scale_factor", 0.0)?,
        };
        if sub.steps < 0 || sub.num_points < 1 || sub.scale_factor <= 0.0 {
            return Err(t.config_error(
                "test_cfg needs subdivision_steps >= 0, subdivision_num_points >= 1 and scale_factor > 0",
            ));
        }
        Ok(Some(sub))
    }

    /// The size one step's `F.interpolate(scale_factor=..)` gives: each
    /// side times the factor, floored.
    fn upsampled(&self, (h, w): (i64, i64)) -> (i64, i64) {
        let scaled = |n: i64| (n as f64 * self.scale_factor).floor() as i64;
        (scaled(h), scaled(w))
    }
}

/// `PointHead(num_fcs=3, coarse_pred_each_layer=True,
/// conv_cfg=dict(type='Conv1d'), norm_cfg=None, act_cfg=dict(type='ReLU',
/// inplace=False), **kwargs)` with `input_transform='multiple_select'`.
#[derive(Debug, Clone, PartialEq)]
pub struct PointHeadCfg {
    pub head: DecodeHeadCfg,
    pub num_fcs: i64,
    pub coarse_pred_each_layer: bool,
    pub sampling: PointSampling,
    pub subdivision: Option<Subdivision>,
}

impl PointHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<PointHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "PointHead", SOURCE);
        let num_fcs = c.int("num_fcs", 3)?;
        let coarse_pred_each_layer = c.flag("coarse_pred_each_layer", true);
        let conv_is_1d = match c.value("conv_cfg") {
            None => true,
            Some(Value::Dict(conv)) => conv.get("type").and_then(Value::as_str) == Some("Conv1d"),
            Some(_) => false,
        };
        if !conv_is_1d {
            return Err(c.unsupported("conv_cfg", "only dict(type='Conv1d') is implemented"));
        }
        if c.value("norm_cfg")
            .is_some_and(|v| !matches!(v, Value::None))
        {
            return Err(c.unsupported("norm_cfg", "only None is implemented"));
        }
        let empty = Dict::new();
        let train = c.dict("train_cfg")?.unwrap_or(&empty);
        let mut t = ComponentConfig::new(train, "PointRend train_cfg", SOURCE);
        let sampling = PointSampling {
            num_points: t.int("num_points", 2048)?,
            oversample_ratio: t.float("oversample_ratio", 3.0)?,
            importance_sample_ratio: t.float("importance_sample_ratio", 0.75)?,
        };
        t.finish()?;
        if sampling.num_points < 1
            || sampling.oversample_ratio < 1.0
            || !(0.0..=1.0).contains(&sampling.importance_sample_ratio)
        {
            return Err(c.config_error(
                "train_cfg needs num_points >= 1, oversample_ratio >= 1 and importance_sample_ratio in [0, 1]",
            ));
        }
        // The segmentor's test_cfg: its other keys (`mode`, `crop_size`)
        // are the segmentor's.
        let subdivision = match c.dict("test_cfg")? {
            Some(test_cfg) => Subdivision::from_test_cfg(test_cfg)?,
            None => None,
        };
        let head = DecodeHeadCfg::from_cfg(&mut c, Some(InputTransform::MultipleSelect))?;
        c.finish()?;
        Ok(PointHeadCfg {
            head,
            num_fcs,
            coarse_pred_each_layer,
            sampling,
            subdivision,
        })
    }
}

/// `nn.Conv1d(in, out, kernel_size=1)` (with bias).
struct Conv1x1 {
    weight: Tensor,
    bias: Tensor,
}

impl Conv1x1 {
    fn new(p: &mut ParamScope, from: i64, to: i64) -> Conv1x1 {
        let bound = 1.0 / (from as f64).sqrt();
        Conv1x1 {
            weight: p.param_uniform("weight", &[to, from, 1], bound),
            bias: p.param_uniform("bias", &[to], bound),
        }
    }

    /// `[B, C, P]` -> `[B, out, P]`.
    fn forward(&self, x: &Tensor) -> Tensor {
        let s = x.size();
        count_flops(2.0 * (s[0] * s[1] * s[2] * self.weight.size()[0]) as f64);
        x.conv1d(&self.weight, Some(&self.bias), [1], [0], [1], 1)
    }
}

pub struct PointHead {
    base: DecodeHeadBase,
    /// `fcs`: ConvModule(Conv1d, no norm, ReLU not in place).
    fcs: Vec<Conv1x1>,
    fc_seg: Conv1x1,
    coarse_pred_each_layer: bool,
    sampling: PointSampling,
    subdivision: Option<Subdivision>,
}

impl PointHead {
    pub fn new(p: &mut ParamScope, cfg: PointHeadCfg) -> PointHead {
        let head = cfg.head;
        let classes = head.num_classes;
        let mut fc_in = head.in_channels.iter().sum::<i64>() + classes;
        let channels = head.channels;
        let base = DecodeHeadBase::without_conv_seg(head);
        let mut fp = p.sub("fcs");
        let mut fcs = Vec::new();
        for k in 0..cfg.num_fcs {
            fcs.push(Conv1x1::new(&mut fp.sub(k).sub("conv"), fc_in, channels));
            fc_in = channels
                + if cfg.coarse_pred_each_layer {
                    classes
                } else {
                    0
                };
        }
        let fc_seg = Conv1x1::new(&mut p.sub("fc_seg"), fc_in, classes);
        PointHead {
            base,
            fcs,
            fc_seg,
            coarse_pred_each_layer: cfg.coarse_pred_each_layer,
            sampling: cfg.sampling,
            subdivision: cfg.subdivision,
        }
    }

    /// `_get_fine_grained_point_feats(x, points)`: each input sampled at
    /// the points, concatenated on channels when there are several.
    fn fine_features(&self, x: &[&Tensor], points: &Tensor) -> Tensor {
        let ac = self.base.cfg.align_corners;
        let sampled: Vec<Tensor> = x
            .iter()
            .map(|f| point_sample(f, points, false, ac))
            .collect();
        if sampled.len() > 1 {
            Tensor::cat(&sampled, 1)
        } else {
            sampled.into_iter().next().expect("one input at least")
        }
    }

    /// `get_points_test(seg_logits, calculate_uncertainty, cfg)`: the
    /// flat indices of the `num_points` most uncertain pixels, `[B, P]`, and
    /// their centres in [0, 1], `[B, P, 2]` (x, y).
    fn points_test(&self, seg_logits: &Tensor, num_points: i64) -> (Tensor, Tensor) {
        let [batch, _, height, width] = seg_logits.size()[..] else {
            unreachable!("logits are 4-D")
        };
        let uncertainty_map = {
            let (top2, _) = seg_logits.topk(2, 1, true, true);
            (top2.select(1, 1) - top2.select(1, 0)).unsqueeze(1)
        };
        let (h_step, w_step) = (1.0 / height as f64, 1.0 / width as f64);
        let uncertainty_map = uncertainty_map.view([batch, height * width]);
        let num_points = num_points.min(height * width);
        let (_, point_indices) = uncertainty_map.topk(num_points, 1, true, true);
        drop(uncertainty_map);
        let point_coords =
            Tensor::zeros([batch, num_points, 2], (Kind::Float, seg_logits.device()));
        // Python builds each coordinate in steps, each temporary dying at
        // the next: x from `point_indices % width`, y from `// width`.
        for (axis, step) in [(0, w_step), (1, h_step)] {
            let mut coord = if axis == 0 {
                point_indices.remainder(width)
            } else {
                point_indices.floor_divide_scalar(width)
            };
            coord = coord.to_kind(Kind::Float);
            coord = &coord * step;
            coord = &coord + step / 2.0;
            point_coords.select(2, axis).copy_(&coord);
        }
        (point_indices, point_coords)
    }

    /// `predict(inputs, prev_output, batch_img_metas, test_cfg)`: the
    /// coarse logits refined at the most uncertain points,
    /// `subdivision_steps` times, then resized to `size`. Python's loop
    /// variables live from one step to the next (each replaced once its
    /// successor exists) and through the final resize.
    fn subdivide(&self, features: &[Tensor], prev_output: &Tensor, size: (i64, i64)) -> Tensor {
        let sub = self
            .subdivision
            .expect("check_inference requires model.test_cfg's subdivision settings");
        let ac = self.base.cfg.align_corners;
        let x = self.base.selected_inputs(features);
        let mut refined = prev_output.copy();
        let mut point_indices: Option<Tensor> = None;
        let mut points: Option<Tensor> = None;
        let mut fine: Option<Tensor> = None;
        let mut coarse: Option<Tensor> = None;
        let mut point_logits: Option<Tensor> = None;
        for _ in 0..sub.steps {
            let (h, w) = sub.upsampled((refined.size()[2], refined.size()[3]));
            refined = refined.upsample_bilinear2d(
                [h, w],
                ac,
                Some(sub.scale_factor),
                Some(sub.scale_factor),
            );
            let [batch, channels, height, width] = refined.size()[..] else {
                unreachable!("logits are 4-D")
            };
            let (indices, coords) = self.points_test(&refined, sub.num_points);
            let indices = point_indices.insert(indices);
            let coords = points.insert(coords);
            let fine_now = fine.insert(self.fine_features(&x, coords));
            let coarse_now = coarse.insert(point_sample(prev_output, coords, false, ac));
            let logits = point_logits.insert(self.point_logits(fine_now, coarse_now, false));
            // Python rebinds `point_indices` to this view of the same storage.
            let expanded = indices.unsqueeze(1).expand([-1, channels, -1], false);
            refined = refined.reshape([batch, channels, height * width]);
            let _ = refined.scatter_(2, &expanded, logits);
            refined = refined.view([batch, channels, height, width]);
        }
        let resized = resize_bilinear(&refined, size, ac);
        drop((point_indices, points, fine, coarse, point_logits));
        resized
    }

    /// `get_points_train(seg_logits, calculate_uncertainty, cfg)` (under
    /// no_grad): `[B, num_points, 2]` in [0, 1].
    fn points_train(&self, seg_logits: &Tensor) -> Tensor {
        let s = self.sampling;
        let batch = seg_logits.size()[0];
        let device = seg_logits.device();
        let num_sampled = (s.num_points as f64 * s.oversample_ratio) as i64;
        let point_coords = Tensor::rand([batch, num_sampled, 2], (Kind::Float, device));
        let uncertainties = {
            let point_logits = point_sample(seg_logits, &point_coords, false, false);
            // calculate_uncertainty: the top-2 margin, [B, 1, P].
            let (top2, _) = point_logits.topk(2, 1, true, true);
            (top2.select(1, 1) - top2.select(1, 0)).unsqueeze(1)
        };
        let num_uncertain = (s.importance_sample_ratio * s.num_points as f64) as i64;
        let num_random = s.num_points - num_uncertain;
        let (_, mut idx) = uncertainties
            .select(1, 0)
            .topk(num_uncertain, 1, true, true);
        let shift = Tensor::arange(batch, (Kind::Int64, device)) * num_sampled;
        let _ = idx.g_add_(&shift.unsqueeze(1));
        let mut coords = point_coords
            .view([-1, 2])
            .index(&[Some(idx.view([-1]))])
            .view([batch, num_uncertain, 2]);
        if num_random > 0 {
            let random = Tensor::rand([batch, num_random, 2], (Kind::Float, device));
            coords = Tensor::cat(&[&coords, &random], 1);
        }
        coords
    }

    /// `forward(fine_grained_point_feats, coarse_point_feats)`: `[B, K, P]`.
    fn point_logits(&self, fine: &Tensor, coarse: &Tensor, training: bool) -> Tensor {
        let mut x = Tensor::cat(&[fine, coarse], 1);
        for fc in &self.fcs {
            x = fc.forward(&x).relu();
            if self.coarse_pred_each_layer {
                x = Tensor::cat(&[&x, coarse], 1);
            }
        }
        // cls_seg: nn.Dropout (not 2d), then fc_seg.
        let ratio = self.base.cfg.dropout_ratio;
        if ratio > 0.0 {
            x = x.dropout(ratio, training);
        }
        self.fc_seg.forward(&x)
    }
}

impl DecodeHead for PointHead {
    /// The refined logits at their own resolution (the segmentor calls
    /// a cascade's last head through `loss` in training, `predict` in
    /// inference).
    fn forward(&self, features: &[Tensor], prev: Option<&Tensor>, _training: bool) -> Tensor {
        let prev = prev.expect("PointHead is a cascade head");
        let mut size = (prev.size()[2], prev.size()[3]);
        if let Some(sub) = self.subdivision {
            for _ in 0..sub.steps {
                size = sub.upsampled(size);
            }
        }
        self.subdivide(features, prev, size)
    }

    fn predict(&self, features: &[Tensor], prev: Option<&Tensor>, size: (i64, i64)) -> Tensor {
        self.subdivide(features, prev.expect("PointHead is a cascade head"), size)
    }

    fn loss(&self, features: &[Tensor], prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        let prev = prev.expect("PointHead is a cascade head");
        let x = self.base.selected_inputs(features);
        let points = tch::no_grad(|| self.points_train(prev));
        let ac = self.base.cfg.align_corners;
        let fine = self.fine_features(&x, &points);
        let coarse = point_sample(prev, &points, false, ac);
        let point_logits = self.point_logits(&fine, &coarse, true);
        // loss_by_feat: the labels sampled (nearest) at the same points.
        // `gt_semantic_seg` is a live local of loss_by_feat.
        let gt_semantic_seg = Tensor::stack(labels, 0); // [B, 1, H, W]
        let point_label = {
            let gt = gt_semantic_seg.to_kind(Kind::Float);
            point_sample(&gt, &points, true, ac)
                .squeeze_dim(1)
                .to_kind(Kind::Int64) // [B, P]
        };
        let ignore = self.base.cfg.ignore_index;
        let mut losses: Vec<(String, Tensor)> = Vec::new();
        for loss in &self.base.cfg.losses {
            // `loss['point' + name] = ...`: a later loss of the same name replaces it.
            let name = format!("point{}", loss.loss_name());
            let value = loss.forward(&point_logits, &point_label, None, ignore);
            match losses.iter_mut().find(|(n, _)| *n == name) {
                Some((_, old)) => *old = value,
                None => losses.push((name, value)),
            }
        }
        losses.push((
            "acc_point".into(),
            accuracy(&point_logits, &point_label, ignore),
        ));
        drop(gt_semantic_seg);
        losses
    }

    fn is_cascade(&self) -> bool {
        true
    }

    crate::models::decode_heads::decode_head::settings_from_base!();
}

#[cfg(test)]
#[path = "point_head_tests.rs"]
mod tests;
