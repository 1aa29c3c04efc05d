//! What every MMSeg decode head shares (`BaseDecodeHead` in
//! `mmseg/models/decode_heads/decode_head.py`): the settings its
//! `__init__` takes, the input selection (`_transform_inputs`), the final
//! dropout + 1x1 classifier (`cls_seg`) and the training loss
//! (`loss_by_feat`): logits upsampled to the label size, each `loss_decode`
//! item (see [`crate::models::losses`]), and the pixel accuracy that MMSeg
//! computes on the full-resolution logits in every training step.
//!
//! A head built on BaseDecodeHead reads these settings with
//! [`DecodeHeadCfg::from_cfg`] from its own [`ComponentConfig`], creates a
//! [`DecodeHeadBase`] before its own layers and implements [`BaseHead`]
//! (its base and its logits); the loss comes from
//! [`DecodeHeadBase::loss_by_feat`].

use super::{DecodeHead, LossItems};
use crate::config::Value;
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::{resize_bilinear, Conv2d, ConvSpec};
use crate::models::losses::{accuracy, loss_decode_from_cfg, DecodeLoss, OhemPixelSampler};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

/// `input_transform`: how the head picks its inputs from the features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputTransform {
    /// `None`: one feature map, `inputs[in_index]`.
    Single,
    /// `'resize_concat'`: the selected maps resized to the first one's size
    /// and concatenated on channels.
    ResizeConcat,
    /// `'multiple_select'`: the selected maps as a list.
    MultipleSelect,
}

/// The settings `BaseDecodeHead.__init__` reads.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeHeadCfg {
    pub in_channels: Vec<i64>,
    pub in_index: Vec<i64>,
    pub input_transform: InputTransform,
    pub channels: i64,
    pub num_classes: i64,
    pub dropout_ratio: f64,
    pub align_corners: bool,
    pub ignore_index: i64,
    pub norm: Option<NormCfg>,
    pub losses: Vec<DecodeLoss>,
    pub sampler: Option<OhemPixelSampler>,
}

impl DecodeHeadCfg {
    /// Reads BaseDecodeHead's keyword arguments from a head's config, with
    /// MMSeg's defaults. `input_transform` is the value the head class
    /// passes itself (SegformerHead: `multiple_select`), or `None` to read
    /// it from the config.
    pub fn from_cfg(
        c: &mut ComponentConfig,
        input_transform: Option<InputTransform>,
    ) -> Result<DecodeHeadCfg, ModelError> {
        let cfg = Self::read(c, input_transform, false, false)?;
        Self::base_head_losses_only(c, cfg)
    }

    /// Refuses the losses only a head with its own `loss_by_feat` can call.
    fn base_head_losses_only(
        c: &mut ComponentConfig,
        cfg: DecodeHeadCfg,
    ) -> Result<DecodeHeadCfg, ModelError> {
        if let Some(loss) = cfg.losses.iter().find(|l| !l.takes_base_head_call()) {
            // BaseDecodeHead.loss_by_feat passes weight= and ignore_index=.
            return Err(c.unsupported(
                "loss_decode",
                format!(
                    "{} in a head without its own loss_by_feat (its forward takes no `weight`: MMSeg raises a TypeError)",
                    loss.type_name()
                ),
            ));
        }
        Ok(cfg)
    }

    /// [`DecodeHeadCfg::from_cfg`] for a head whose norms are all mmcv
    /// ConvModules' (`ConvNorm`), which take GN (`dict(type='GN',
    /// num_groups=..)`) as well as BN.
    pub fn from_cfg_bn_or_gn(
        c: &mut ComponentConfig,
        input_transform: Option<InputTransform>,
    ) -> Result<DecodeHeadCfg, ModelError> {
        let cfg = Self::read(c, input_transform, true, false)?;
        Self::base_head_losses_only(c, cfg)
    }

    /// BaseDecodeHead's settings of a head that calls its losses itself
    /// (DDRHead, PIDHead): any loss, and a `sampler` MMSeg builds but the
    /// head's `loss_by_feat` never uses.
    pub fn from_cfg_own_loss(c: &mut ComponentConfig) -> Result<DecodeHeadCfg, ModelError> {
        Self::read(c, None, false, true)
    }

    fn read(
        c: &mut ComponentConfig,
        input_transform: Option<InputTransform>,
        allow_gn: bool,
        own_loss: bool,
    ) -> Result<DecodeHeadCfg, ModelError> {
        let input_transform = match input_transform {
            Some(fixed) => {
                if c.has("input_transform") {
                    // Python: "got multiple values for keyword argument".
                    return Err(
                        c.config_error("sets `input_transform` itself; remove it from the config")
                    );
                }
                fixed
            }
            None => match c.string("input_transform")? {
                None => InputTransform::Single,
                Some("resize_concat") => InputTransform::ResizeConcat,
                Some("multiple_select") => InputTransform::MultipleSelect,
                Some(other) => {
                    return Err(c.config_error(format!("unknown input_transform `{other}`")))
                }
            },
        };
        let in_channels = match c.value("in_channels") {
            Some(Value::Int(i)) => vec![*i],
            Some(v) => v
                .as_seq()
                .map(|s| s.iter().filter_map(Value::as_i64).collect())
                .ok_or_else(|| c.config_error("`in_channels` must be an int or a list of ints"))?,
            None => return Err(c.config_error("lacks `in_channels`")),
        };
        let in_index = c.ints("in_index", &[-1])?;
        // `_init_inputs`' assertions.
        match input_transform {
            InputTransform::Single if in_channels.len() != 1 || in_index.len() != 1 => {
                return Err(c.config_error(
                    "without input_transform, in_channels and in_index must be single ints",
                ))
            }
            InputTransform::ResizeConcat | InputTransform::MultipleSelect
                if in_channels.len() != in_index.len() =>
            {
                return Err(c.config_error("in_channels and in_index must have the same length"))
            }
            _ => {}
        }
        c.unimplemented("conv_cfg", &Value::None)?;
        c.default_activation("act_cfg", "ReLU")?;
        let num_classes = c.int("num_classes", 0)?;
        if c.value("out_channels")
            .and_then(Value::as_i64)
            .is_some_and(|o| o != num_classes)
        {
            return Err(c.unsupported(
                "out_channels",
                "out_channels != num_classes (sigmoid heads) is not implemented",
            ));
        }
        let losses = loss_decode_from_cfg(c.value("loss_decode"))
            .map_err(|e| c.setting_error("loss_decode", e))?;
        let sampler = OhemPixelSampler::from_cfg(c.value("sampler"))
            .map_err(|e| c.setting_error("sampler", e))?;
        if sampler.is_some()
            && !own_loss
            && losses
                .iter()
                .any(|l| !matches!(l, DecodeLoss::CrossEntropy(ce) if !ce.use_sigmoid))
        {
            // MMSeg asserts the pixel weights' shape against the loss's.
            return Err(c.config_error(
                "an OHEMPixelSampler works with CrossEntropyLoss only (without use_sigmoid)",
            ));
        }
        // `threshold` binarises predictions at inference; `init_cfg` draws weights.
        c.inert(&["threshold", "init_cfg"]);
        Ok(DecodeHeadCfg {
            in_channels,
            in_index,
            input_transform,
            channels: c.int("channels", 0)?,
            num_classes,
            dropout_ratio: c.float("dropout_ratio", 0.1)?,
            align_corners: c.flag("align_corners", false),
            ignore_index: c.int("ignore_index", 255)?,
            norm: if allow_gn {
                NormCfg::from_cfg_bn_or_gn(c.value("norm_cfg"))
                    .map_err(|e| c.setting_error("norm_cfg", e))?
            } else {
                c.batch_norm("norm_cfg")?
            },
            losses,
            sampler,
        })
    }
}

/// `_transform_inputs`, `cls_seg` and `loss_by_feat`.
pub struct DecodeHeadBase {
    pub cfg: DecodeHeadCfg,
    /// `None` for a head that deletes it (PointHead's `delattr`).
    conv_seg: Option<Conv2d>,
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
        DecodeHeadBase {
            cfg,
            conv_seg: Some(conv_seg),
        }
    }

    /// A head that deletes `conv_seg` (`delattr(self, 'conv_seg')`) and
    /// classifies with its own layer.
    pub fn without_conv_seg(cfg: DecodeHeadCfg) -> DecodeHeadBase {
        DecodeHeadBase {
            cfg,
            conv_seg: None,
        }
    }

    /// The features at `in_index` (negative indices count from the end, as
    /// Python's do).
    pub fn selected_inputs<'a>(&self, features: &'a [Tensor]) -> Vec<&'a Tensor> {
        self.cfg
            .in_index
            .iter()
            .map(|i| {
                &features[if *i < 0 {
                    (features.len() as i64 + i) as usize
                } else {
                    *i as usize
                }]
            })
            .collect()
    }

    /// `_transform_inputs` for the one-tensor transforms: `Single` gives
    /// `inputs[in_index]`, `ResizeConcat` the resized maps concatenated
    /// (`[B, sum(in_channels), H_0, W_0]`). `MultipleSelect` heads take
    /// [`DecodeHeadBase::selected_inputs`] instead; calling this from one is
    /// a bug in the head.
    pub fn transform_inputs(&self, features: &[Tensor]) -> Tensor {
        let inputs = self.selected_inputs(features);
        match self.cfg.input_transform {
            InputTransform::ResizeConcat => {
                let size = (inputs[0].size()[2], inputs[0].size()[3]);
                let upsampled: Vec<Tensor> = inputs
                    .iter()
                    .map(|x| resize_bilinear(x, size, self.cfg.align_corners))
                    .collect();
                Tensor::cat(&upsampled, 1)
            }
            InputTransform::Single => inputs[0].shallow_clone(),
            InputTransform::MultipleSelect => {
                panic!("a multiple_select head takes selected_inputs, not transform_inputs")
            }
        }
    }

    /// `cls_seg`: dropout, then the 1x1 classifier. `[B, channels, h, w]` ->
    /// `[B, num_classes, h, w]`.
    pub fn cls_seg(&self, feat: Tensor, training: bool) -> Tensor {
        let feat = if self.cfg.dropout_ratio > 0.0 {
            feat.feature_dropout(self.cfg.dropout_ratio, training)
        } else {
            feat
        };
        self.conv_seg
            .as_ref()
            .expect("a head without conv_seg has its own cls_seg")
            .forward(&feat)
    }

    /// `conv_seg.weight`, `[num_classes, channels, 1, 1]` (K-Net's initial
    /// kernels).
    pub fn conv_seg_weight(&self) -> &Tensor {
        self.conv_seg
            .as_ref()
            .expect("a head without conv_seg has its own cls_seg")
            .weight()
    }

    /// `loss_by_feat(seg_logits, data_samples)`; `labels` are the per-image
    /// `1 x H x W` label maps (`gt_sem_seg.data`). Returns the loss items in
    /// MMSeg's order (`loss_ce`, ..., then `acc_seg`).
    pub fn loss_by_feat(&self, seg_logits: &Tensor, labels: &[Tensor]) -> Vec<(String, Tensor)> {
        let _part = crate::models::scope::enter("loss");
        // Python rebinds `seg_logits` and `seg_label`: the old tensors die at
        // once (unless autograd saved them), so do the same here.
        let mut seg_label = Tensor::stack(labels, 0); // [B, 1, H, W]
        let size = (seg_label.size()[2], seg_label.size()[3]);
        let seg_logits = resize_bilinear(seg_logits, size, self.cfg.align_corners); // [B, K, H, W]
        let seg_weight = self.cfg.sampler.as_ref().map(|sampler| {
            sampler.sample(
                &seg_logits,
                &seg_label,
                &self.cfg.losses,
                self.cfg.ignore_index,
            )
        }); // [B, H, W]
        seg_label = seg_label.squeeze_dim(1); // [B, H, W]
        let mut losses: Vec<(String, Tensor)> = Vec::new();
        for loss_cfg in &self.cfg.losses {
            let value = loss_cfg.forward(
                &seg_logits,
                &seg_label,
                seg_weight.as_ref(),
                self.cfg.ignore_index,
            );
            match losses.iter_mut().find(|(n, _)| n == loss_cfg.loss_name()) {
                Some((_, acc)) => *acc = &*acc + value,
                None => losses.push((loss_cfg.loss_name().to_string(), value)),
            }
        }
        let acc_seg = accuracy(&seg_logits, &seg_label, self.cfg.ignore_index);
        losses.push(("acc_seg".into(), acc_seg));
        losses
    }
}

/// The [`DecodeHead`] settings of a head that implements the trait itself
/// (several logits, a cascade, its own loss) from its `base:
/// DecodeHeadBase` field: `num_classes`, `ignore_index`, `align_corners`.
macro_rules! settings_from_base {
    () => {
        fn num_classes(&self) -> i64 {
            self.base.cfg.num_classes
        }

        fn ignore_index(&self) -> i64 {
            self.base.cfg.ignore_index
        }

        fn align_corners(&self) -> bool {
            self.base.cfg.align_corners
        }
    };
}
pub(crate) use settings_from_base;

/// A head built on BaseDecodeHead: it computes its logits; the loss, the
/// classes and the ignored index are the base's, so every such head is a
/// [`DecodeHead`] without writing those again.
pub trait BaseHead {
    fn base(&self) -> &DecodeHeadBase;

    /// `forward(inputs)`: `[B, num_classes, h, w]` logits from the features.
    fn logits(&self, features: &[Tensor], training: bool) -> Tensor;
}

/// A head whose `forward` is `cls_seg(_forward_feature(inputs))`: K-Net's
/// `IterativeDecodeHead` takes its features and its classifier as the
/// initial kernels (see `knet_head.rs`).
pub trait FeatureHead: BaseHead {
    /// `_forward_feature(inputs)`: `[B, channels, h, w]`, what `cls_seg`
    /// classifies.
    fn forward_feature(&self, features: &[Tensor], training: bool) -> Tensor;
}

/// Not a cascade head: `prev_output` is never given (the segmentor checks
/// [`DecodeHead::is_cascade`] when it is built).
impl<H: BaseHead> DecodeHead for H {
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        self.logits(features, training)
    }

    fn loss(&self, features: &[Tensor], _prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        // `seg_logits` stays alive in `loss()` while `loss_by_feat` runs.
        let logits = self.logits(features, true);
        self.base().loss_by_feat(&logits, labels)
    }

    fn num_classes(&self) -> i64 {
        self.base().cfg.num_classes
    }

    fn ignore_index(&self) -> i64 {
        self.base().cfg.ignore_index
    }

    fn align_corners(&self) -> bool {
        self.base().cfg.align_corners
    }
}

#[cfg(test)]
#[path = "decode_head_tests.rs"]
mod tests;
