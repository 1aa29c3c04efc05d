//! `EncHead`, the context-encoding head of EncNet, as MMSeg's
//! `mmseg/models/decode_heads/enc_head.py` builds it, with MMSeg's
//! `Encoding` layer (`mmseg/models/utils/encoding.py`).
//!
//! Zhang et al., "Context Encoding for Semantic Segmentation", CVPR 2018,
//! arXiv:1803.08904.
//!
//! A 3x3 bottleneck on the last selected map (optionally fused with 1x1
//! laterals of the others), then the encoding module: each pixel's residual
//! to `num_codes` learnt codewords, softly assigned and summed over the
//! pixels (`[B, K, C]`, through a `[B, HW, K, C]` difference), normalised,
//! averaged to a channel gate that rescales the map. With `use_se_loss` a
//! linear layer also predicts which classes the image contains, trained by
//! a binary cross-entropy (`loss_se`) against the labels' class histogram.

use super::decode_head::{DecodeHeadBase, DecodeHeadCfg, InputTransform};
use super::{DecodeHead, LossItems};
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, BatchNorm2d, ConvModule, ConvSpec, Linear};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/enc_head.py";

/// The registry's constructor (`DECODE_HEADS` row `EncHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = EncHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(EncHead::new(p, cfg)))
}

/// `EncHead(num_codes=32, use_se_loss=True, add_lateral=False,
/// loss_se_decode=dict(type='CrossEntropyLoss', use_sigmoid=True,
/// loss_weight=0.2), **kwargs)` with `input_transform='multiple_select'`.
#[derive(Debug, Clone, PartialEq)]
pub struct EncHeadCfg {
    pub head: DecodeHeadCfg,
    pub num_codes: i64,
    /// `Some(loss_weight)` of the sigmoid cross-entropy when `use_se_loss`.
    pub se_loss_weight: Option<f64>,
    pub add_lateral: bool,
}

impl EncHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<EncHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "EncHead", SOURCE);
        let num_codes = c.int("num_codes", 32)?;
        let use_se_loss = c.flag("use_se_loss", true);
        let add_lateral = c.flag("add_lateral", false);
        let se_loss = c.dict("loss_se_decode")?;
        let se_loss_weight = if use_se_loss {
            Some(se_loss_weight(&c, se_loss)?)
        } else {
            None
        };
        let head = DecodeHeadCfg::from_cfg(&mut c, Some(InputTransform::MultipleSelect))?;
        c.finish()?;
        Ok(EncHeadCfg {
            head,
            num_codes,
            se_loss_weight,
            add_lateral,
        })
    }
}

/// The `loss_weight` of `loss_se_decode`, which segtune runs as MMSeg's
/// default: `CrossEntropyLoss(use_sigmoid=True)` without class weights;
/// any other loss is an error of the head `c` reads.
fn se_loss_weight(c: &ComponentConfig, cfg: Option<&Dict>) -> Result<f64, ModelError> {
    let Some(cfg) = cfg else {
        return Ok(0.2);
    };
    let get = |k: &str| cfg.get(k);
    let is_sigmoid_ce = get("type").and_then(Value::as_str) == Some("CrossEntropyLoss")
        && get("use_sigmoid").is_some_and(Value::truthy);
    let plain = cfg.keys().all(|k| {
        matches!(
            k.as_str(),
            "type" | "use_sigmoid" | "loss_weight" | "reduction" | "loss_name"
        )
    }) && get("reduction").is_none_or(|r| r.as_str() == Some("mean"));
    if !(is_sigmoid_ce && plain) {
        return Err(c.config_error(
            "loss_se_decode: segtune runs CrossEntropyLoss(use_sigmoid=True, loss_weight=w) only",
        ));
    }
    Ok(get("loss_weight").and_then(Value::as_f64).unwrap_or(1.0))
}

/// MMSeg's `Encoding(channels, num_codes)`.
struct Encoding {
    codewords: Tensor,
    scale: Tensor,
}

impl Encoding {
    fn new(p: &mut ParamScope, channels: i64, num_codes: i64) -> Encoding {
        let std = 1.0 / ((num_codes * channels) as f64).sqrt();
        Encoding {
            codewords: p.param_uniform("codewords", &[num_codes, channels], std),
            scale: p.param_uniform("scale", &[num_codes], 1.0),
        }
    }

    /// `[B, C, H, W]` -> `[B, K, C]`. One op per statement where Python
    /// frees a temporary as soon as the op using it returns.
    fn forward(&self, x: &Tensor) -> Tensor {
        let s = x.size();
        let (batch, channels) = (s[0], s[1]);
        let k = self.codewords.size()[0];
        let x = x.view([batch, channels, -1]).transpose(1, 2).contiguous(); // [B, N, C]
        let n = x.size()[1];
        let codewords = self.codewords.view([1, 1, k, channels]);
        // scaled_l2
        let l2 = {
            let diff = x.unsqueeze(2).expand([batch, n, k, channels], false) - &codewords; // [B, N, K, C]
            let squared = diff.pow_tensor_scalar(2);
            squared.sum_dim_intlist(3, false, None::<Kind>) // [B, N, K]
        };
        let scaled = self.scale.view([1, 1, k]) * l2;
        let assignment = scaled.softmax(2, None::<Kind>);
        crate::models::layers::softmax_saved(&scaled, &assignment);
        drop(scaled);
        // aggregate
        let diff = x.unsqueeze(2).expand([batch, n, k, channels], false) - &codewords;
        let weighted = assignment.unsqueeze(3) * diff; // [B, N, K, C]
        weighted.sum_dim_intlist(1, false, None::<Kind>) // [B, K, C]
    }
}

/// `EncModule(in_channels, num_codes)`.
struct EncModule {
    encoding_project: ConvModule,
    encoding: Encoding,
    encoding_norm: BatchNorm2d,
    fc: Linear,
}

impl EncModule {
    fn new(p: &mut ParamScope, channels: i64, num_codes: i64, norm: Option<NormCfg>) -> EncModule {
        let encoding_project = ConvModule::new(
            &mut p.sub("encoding_project"),
            ConvSpec::new(channels, channels, 1),
            norm,
            true,
        );
        let mut ep = p.sub("encoding");
        let encoding = Encoding::new(&mut ep.sub(0), channels, num_codes);
        // norm_cfg's type with 2d made 1d (BN1d without one): a batch norm
        // over the codes.
        let encoding_norm = match norm {
            Some(n) => BatchNorm2d::from_cfg(&mut ep.sub(1), num_codes, &n),
            None => BatchNorm2d::new(&mut ep.sub(1), num_codes, 1e-5, 0.1, true),
        };
        let mut fp = p.sub("fc");
        let fc = Linear::new(&mut fp.sub(0), channels, channels, true);
        EncModule {
            encoding_project,
            encoding,
            encoding_norm,
            fc,
        }
    }

    /// `(encoding_feat [B, C], output [B, C, H, W])`.
    fn forward(&self, x: &Tensor, training: bool) -> (Tensor, Tensor) {
        let projection = self.encoding_project.forward(x, training);
        let encoding_feat = {
            let encoded = self.encoding.forward(&projection); // [B, K, C]
            let mut normed = self.encoding_norm.forward(&encoded, training);
            let _ = normed.relu_();
            normed.mean_dim(1, false, None::<Kind>) // [B, C]
        };
        let s = x.size();
        let gamma = self.fc.forward(&encoding_feat).sigmoid();
        let y = gamma.view([s[0], s[1], 1, 1]);
        let gated = x * &y;
        let mut output = x + gated;
        let _ = output.relu_();
        (encoding_feat, output)
    }
}

pub struct EncHead {
    base: DecodeHeadBase,
    bottleneck: ConvModule,
    lateral_convs: Vec<ConvModule>,
    fusion: Option<ConvModule>,
    enc_module: EncModule,
    se_layer: Option<Linear>,
    se_loss_weight: Option<f64>,
}

impl EncHead {
    pub fn new(p: &mut ParamScope, cfg: EncHeadCfg) -> EncHead {
        let head = cfg.head;
        let (channels, norm, classes) = (head.channels, head.norm, head.num_classes);
        let in_channels = head.in_channels.clone();
        let base = DecodeHeadBase::new(p, head);
        let last = *in_channels.last().expect("checked: two or more inputs");
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(last, channels, 3).padding(1),
            norm,
            true,
        );
        let (lateral_convs, fusion) = if cfg.add_lateral {
            let mut lp = p.sub("lateral_convs");
            let laterals = in_channels[..in_channels.len() - 1]
                .iter()
                .enumerate()
                .map(|(i, &c)| {
                    ConvModule::new(&mut lp.sub(i), ConvSpec::new(c, channels, 1), norm, true)
                })
                .collect();
            let fusion = ConvModule::new(
                &mut p.sub("fusion"),
                ConvSpec::new(in_channels.len() as i64 * channels, channels, 3).padding(1),
                norm,
                true,
            );
            (laterals, Some(fusion))
        } else {
            (Vec::new(), None)
        };
        let enc_module = EncModule::new(&mut p.sub("enc_module"), channels, cfg.num_codes, norm);
        let se_layer = cfg
            .se_loss_weight
            .map(|_| Linear::new(&mut p.sub("se_layer"), channels, classes, true));
        EncHead {
            base,
            bottleneck,
            lateral_convs,
            fusion,
            enc_module,
            se_layer,
            se_loss_weight: cfg.se_loss_weight,
        }
    }

    /// `forward(inputs)`: the logits, and with `use_se_loss` the per-image
    /// class logits `[B, num_classes]`.
    fn outputs(&self, features: &[Tensor], training: bool) -> (Tensor, Option<Tensor>) {
        let inputs = self.base.selected_inputs(features);
        let mut feat = self.bottleneck.forward(inputs[inputs.len() - 1], training);
        // The resized laterals stay a live local of the Python forward.
        let mut laterals = Vec::new();
        if let Some(fusion) = &self.fusion {
            let size = (feat.size()[2], feat.size()[3]);
            for (i, lateral) in self.lateral_convs.iter().enumerate() {
                let l = lateral.forward(inputs[i], training);
                laterals.push(resize_bilinear(&l, size, self.base.cfg.align_corners));
            }
            let mut parts = vec![&feat];
            parts.extend(laterals.iter());
            let cat = Tensor::cat(&parts, 1);
            feat = fusion.forward(&cat, training);
        }
        let (encode_feat, output) = self.enc_module.forward(&feat, training);
        let output = self.base.cls_seg(output, training);
        let se_output = self.se_layer.as_ref().map(|se| se.forward(&encode_feat));
        drop((feat, laterals));
        (output, se_output)
    }

    /// `loss_se`: `CrossEntropyLoss(use_sigmoid=True)` of the class logits
    /// against `_convert_to_onehot_labels` (a class is present when its
    /// histogram bin is non-empty).
    fn se_loss(&self, se_logits: &Tensor, labels: &[Tensor], weight: f64) -> Tensor {
        let classes = self.base.cfg.num_classes;
        let seg_label = Tensor::stack(labels, 0); // [B, 1, H, W]
        let batch = seg_label.size()[0];
        let onehot = seg_label.new_zeros([batch, classes], (Kind::Int64, seg_label.device()));
        for i in 0..batch {
            let hist = crate::models::layers::ops::histc(
                &seg_label.get(i).to_kind(Kind::Float),
                classes,
                0.0,
                (classes - 1) as f64,
            );
            let mut row = onehot.get(i);
            row.copy_(&hist.gt(0.0));
        }
        drop(seg_label);
        let valid_mask = onehot
            .ge(0)
            .logical_and(&onehot.ne(-100))
            .to_kind(Kind::Float);
        let loss = se_logits.binary_cross_entropy_with_logits(
            &onehot.to_kind(Kind::Float),
            None::<Tensor>,
            None::<Tensor>,
            tch::Reduction::None,
        );
        let loss = (loss * valid_mask).mean(None::<Kind>);
        weight * loss
    }
}

impl DecodeHead for EncHead {
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        self.outputs(features, training).0
    }

    fn loss(&self, features: &[Tensor], _prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        let (logits, se_logits) = self.outputs(features, true);
        let mut losses = self.base.loss_by_feat(&logits, labels);
        if let (Some(se_logits), Some(weight)) = (&se_logits, self.se_loss_weight) {
            losses.push(("loss_se".into(), self.se_loss(se_logits, labels, weight)));
        }
        losses
    }

    crate::models::decode_heads::decode_head::settings_from_base!();
}

#[cfg(test)]
#[path = "enc_head_tests.rs"]
mod tests;
