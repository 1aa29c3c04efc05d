//! `PSAHead`, the point-wise spatial attention head of PSANet, as MMSeg's
//! `mmseg/models/decode_heads/psa_head.py` builds it, with mmcv's `PSAMask`
//! (`layers::ops::psamask`, the compiled op's tensors with plain loops).
//!
//! Zhao et al., "PSANet: Point-wise Spatial Attention Network for Scene
//! Parsing", ECCV 2018.
//!
//! The map is reduced and shrunk (`shrink_factor`); a 1x1 conv predicts for
//! every position a `mask_size` window of attention weights, which PSAMask
//! lays out as an `[HW, HW]` map (collect: what each position gathers;
//! distribute: what it spreads), softmaxed and multiplied with the features.
//! `bi-direction` runs both; the result is projected, resized back and
//! fused with the input by a 3x3 bottleneck.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg};
use super::DecodeHead;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::ops::psamask;
use crate::models::layers::{
    count_flops, resize_bilinear, softmax_saved, Conv2d, ConvModule, ConvSpec,
};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/psa_head.py";

/// The registry's constructor (`DECODE_HEADS` row `PSAHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = PsaHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(PsaHead::new(p, cfg)))
}

/// `psa_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsaType {
    Collect,
    Distribute,
    BiDirection,
}

/// `PSAHead(mask_size, psa_type='bi-direction', compact=False,
/// shrink_factor=2, normalization_factor=1.0, psa_softmax=True, **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct PsaHeadCfg {
    pub head: DecodeHeadCfg,
    pub mask_size: (i64, i64),
    pub psa_type: PsaType,
    pub compact: bool,
    pub shrink_factor: i64,
    pub normalization_factor: f64,
    pub psa_softmax: bool,
}

impl PsaHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<PsaHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "PSAHead", SOURCE);
        c.require("mask_size")?;
        let mask = c.ints("mask_size", &[])?;
        let [mask_h, mask_w] = mask[..] else {
            return Err(c.config_error(format!("mask_size must be (h, w), not {mask:?}")));
        };
        let psa_type = match c.string("psa_type")?.unwrap_or("bi-direction") {
            "collect" => PsaType::Collect,
            "distribute" => PsaType::Distribute,
            "bi-direction" => PsaType::BiDirection,
            other => {
                return Err(c.config_error(format!(
                    "psa_type must be 'collect', 'distribute' or 'bi-direction', not '{other}'"
                )))
            }
        };
        let compact = c.flag("compact", false);
        let shrink_factor = c.int("shrink_factor", 2)?;
        if shrink_factor <= 0 {
            return Err(c.config_error("shrink_factor must be positive"));
        }
        let normalization_factor = match c.value("normalization_factor") {
            Some(Value::None) => (mask_h * mask_w) as f64,
            _ => c.float("normalization_factor", 1.0)?,
        };
        let psa_softmax = c.flag("psa_softmax", true);
        let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
        c.finish()?;
        Ok(PsaHeadCfg {
            head,
            mask_size: (mask_h, mask_w),
            psa_type,
            compact,
            shrink_factor,
            normalization_factor,
            psa_softmax,
        })
    }
}

/// One direction's reduce ConvModule and attention
/// (`Sequential(ConvModule 1x1, Conv2d(channels, mask_h * mask_w, 1, bias=False))`).
struct Branch {
    reduce: ConvModule,
    attention_conv: ConvModule,
    attention_mask: Conv2d,
}

impl Branch {
    fn new(
        p: &mut ParamScope,
        names: (&str, &str),
        in_channels: i64,
        channels: i64,
        mask_channels: i64,
        norm: Option<NormCfg>,
    ) -> Branch {
        let reduce = ConvModule::new(
            &mut p.sub(names.0),
            ConvSpec::new(in_channels, channels, 1),
            norm,
            true,
        );
        let mut ap = p.sub(names.1);
        let attention_conv = ConvModule::new(
            &mut ap.sub(0),
            ConvSpec::new(channels, channels, 1),
            norm,
            true,
        );
        let attention_mask = Conv2d::new(
            &mut ap.sub(1),
            ConvSpec::new(channels, mask_channels, 1).bias(false),
        );
        Branch {
            reduce,
            attention_conv,
            attention_mask,
        }
    }

    fn attention(&self, x: &Tensor, training: bool) -> Tensor {
        let hidden = self.attention_conv.forward(x, training);
        self.attention_mask.forward(&hidden)
    }
}

pub struct PsaHead {
    base: DecodeHeadBase,
    branch: Branch,
    /// `reduce_p` / `attention_p` of `bi-direction`.
    branch_p: Option<Branch>,
    proj: ConvModule,
    bottleneck: ConvModule,
    cfg: PsaHeadCfg,
}

impl PsaHead {
    pub fn new(p: &mut ParamScope, cfg: PsaHeadCfg) -> PsaHead {
        let head = cfg.head.clone();
        let (channels, norm) = (head.channels, head.norm);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let mask_channels = cfg.mask_size.0 * cfg.mask_size.1;
        let branch = Branch::new(
            p,
            ("reduce", "attention"),
            in_channels,
            channels,
            mask_channels,
            norm,
        );
        let bi = cfg.psa_type == PsaType::BiDirection;
        let branch_p = bi.then(|| {
            Branch::new(
                p,
                ("reduce_p", "attention_p"),
                in_channels,
                channels,
                mask_channels,
                norm,
            )
        });
        let proj = ConvModule::new(
            &mut p.sub("proj"),
            ConvSpec::new(channels * if bi { 2 } else { 1 }, in_channels, 1).padding(1),
            norm,
            true,
        );
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(in_channels * 2, channels, 3).padding(1),
            norm,
            true,
        );
        PsaHead {
            base,
            branch,
            branch_p,
            proj,
            bottleneck,
            cfg,
        }
    }

    /// The shrunk size and the `align_corners` of the resizes after it.
    fn shrunk(&self, h: i64, w: i64) -> (i64, i64, bool) {
        let f = self.cfg.shrink_factor;
        if f == 1 {
            (h, w, self.base.cfg.align_corners)
        } else if h % f != 0 && w % f != 0 {
            ((h - 1) / f + 1, (w - 1) / f + 1, true)
        } else {
            (h / f, w / f, false)
        }
    }

    /// `compact`: the predicted map read as `[HW, HW]` and transposed, as
    /// `y.view(n, hw, hw).transpose(1, 2).view(n, hw, h, w)` (a view of a
    /// transposed tensor: PyTorch refuses it, and so does libtorch).
    fn compact_view(y: &Tensor, n: i64, h: i64, w: i64) -> Tensor {
        y.view([n, h * w, h * w])
            .transpose(1, 2)
            .view([n, h * w, h, w])
    }

    /// `bmm(x.view(n, c, hw), y.view(n, hw, hw)).view(n, c, h, w) * (1 / nf)`.
    fn attend(&self, x: &Tensor, y: &Tensor) -> Tensor {
        let s = x.size();
        let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
        count_flops(2.0 * (n * c * h * w * h * w) as f64);
        let product = x.view([n, c, h * w]).bmm(&y.view([n, h * w, h * w]));
        product.view([n, c, h, w]) * (1.0 / self.cfg.normalization_factor)
    }

    fn softmax_if(&self, y: Tensor) -> Tensor {
        if !self.cfg.psa_softmax {
            return y;
        }
        let probs = y.softmax(1, None::<Kind>);
        softmax_saved(&y, &probs);
        probs
    }
}

impl BaseHead for PsaHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let identity = self.base.transform_inputs(features);
        let mut align_corners = self.base.cfg.align_corners;
        let mask = self.cfg.mask_size;
        // Every local of the Python forward (the attended maps among them)
        // lives until it returns.
        let mut keep: Vec<Tensor> = Vec::new();
        let out = match &self.branch_p {
            None => {
                let mut out = self.branch.reduce.forward(&identity, training);
                let s = out.size();
                let n = s[0];
                let (h, w, ac) = self.shrunk(s[2], s[3]);
                if self.cfg.shrink_factor != 1 {
                    align_corners = ac;
                    out = resize_bilinear(&out, (h, w), align_corners);
                }
                let mut y = self.branch.attention(&out, training);
                let collect = self.cfg.psa_type == PsaType::Collect;
                y = match (self.cfg.compact, collect) {
                    (true, true) => Self::compact_view(&y, n, h, w),
                    (true, false) => y,
                    (false, _) => psamask(&y, collect, mask),
                };
                let y = self.softmax_if(y);
                let attended = self.attend(&out, &y);
                keep.extend([out, y]);
                attended
            }
            Some(branch_p) => {
                let mut x_col = self.branch.reduce.forward(&identity, training);
                let mut x_dis = branch_p.reduce.forward(&identity, training);
                let s = x_col.size();
                let (n, h, w, ac) = {
                    let (h, w, ac) = self.shrunk(s[2], s[3]);
                    (s[0], h, w, ac)
                };
                if self.cfg.shrink_factor != 1 {
                    align_corners = ac;
                    x_col = resize_bilinear(&x_col, (h, w), align_corners);
                    x_dis = resize_bilinear(&x_dis, (h, w), align_corners);
                }
                let mut y_col = self.branch.attention(&x_col, training);
                let mut y_dis = branch_p.attention(&x_dis, training);
                if self.cfg.compact {
                    y_dis = Self::compact_view(&y_dis, n, h, w);
                } else {
                    y_col = psamask(&y_col, true, mask);
                    y_dis = psamask(&y_dis, false, mask);
                }
                let y_col = self.softmax_if(y_col);
                let y_dis = self.softmax_if(y_dis);
                let attended_col = self.attend(&x_col, &y_col);
                drop(x_col);
                let attended_dis = self.attend(&x_dis, &y_dis);
                drop(x_dis);
                let out = Tensor::cat(&[&attended_col, &attended_dis], 1);
                keep.extend([attended_col, attended_dis, y_col, y_dis]);
                out
            }
        };
        let out = self.proj.forward(&out, training);
        let size = (identity.size()[2], identity.size()[3]);
        let out = resize_bilinear(&out, size, align_corners);
        // The resized map is released when Python rebinds `out` to the
        // bottleneck's result.
        let fused = self
            .bottleneck
            .forward(&Tensor::cat(&[&identity, &out], 1), training);
        drop(out);
        let logits = self.base.cls_seg(fused, training);
        drop(keep);
        logits
    }
}

#[cfg(test)]
#[path = "psa_head_tests.rs"]
mod tests;
