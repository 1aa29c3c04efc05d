//! `LightHamHead`, SegNeXt's head, as MMSeg's
//! `mmseg/models/decode_heads/ham_head.py` builds it, with its `Hamburger`
//! and `NMF2D` matrix decomposition.
//!
//! Guo et al., "SegNeXt: Rethinking Convolutional Attention Design for
//! Semantic Segmentation", NeurIPS 2022, arXiv:2209.08575; the Hamburger:
//! Geng et al., "Is Attention Better Than Matrix Decomposition?", ICLR
//! 2021, arXiv:2109.04553.
//!
//! The selected maps resized to the first one's size and concatenated, a
//! 1x1 ConvModule (`squeeze`), the Hamburger (`ham_in` 1x1 conv, in-place
//! ReLU, NMF, `ham_out` 1x1 ConvModule with the norm, in-place ReLU of the
//! sum with its input), a 1x1 ConvModule (`align`) and the classifier.
//!
//! NMF2D draws random bases (`torch.rand`, then `F.normalize`) at every
//! forward and runs `train_steps` (`eval_steps` in eval mode) multiplicative
//! updates and a last coefficient update, all recorded by autograd: MMSeg
//! 1.2.2 runs them outside `torch.no_grad()` (the original SegNeXt code
//! did not), so their intermediates are saved for backward as here. NMF2D
//! sets `inv_t = 1` whatever `ham_kwargs` says (`softmax(1 * coef)`).

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, InputTransform};
use super::DecodeHead;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{
    count_flops, normalize, resize_bilinear, softmax_saved, ConvModule, ConvSpec,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/ham_head.py";

/// The registry's constructor (`DECODE_HEADS` row `LightHamHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = LightHamHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(LightHamHead::new(p, cfg)))
}

/// `NMF2D`'s `Matrix_Decomposition_2D_Base(MD_S=1, MD_R=64, train_steps=6,
/// eval_steps=7, inv_t=100, rand_init=True)` (`inv_t` then set to 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NmfCfg {
    pub s: i64,
    pub r: i64,
    pub train_steps: i64,
    pub eval_steps: i64,
}

impl NmfCfg {
    fn from_cfg(d: Option<&Dict>) -> Result<NmfCfg, ModelError> {
        let empty = Dict::new();
        let mut c = ComponentConfig::new(d.unwrap_or(&empty), "NMF2D", SOURCE);
        let cfg = NmfCfg {
            s: c.int("MD_S", 1)?,
            r: c.int("MD_R", 64)?,
            train_steps: c.int("train_steps", 6)?,
            eval_steps: c.int("eval_steps", 7)?,
        };
        // NMF2D.__init__ overwrites it with 1.
        c.inert(&["inv_t"]);
        c.unimplemented("rand_init", &Value::Bool(true))?;
        if cfg.s < 1 || cfg.r < 1 {
            return Err(c.config_error("MD_S and MD_R must be positive"));
        }
        c.finish()?;
        Ok(cfg)
    }
}

/// `LightHamHead(ham_channels=512, ham_kwargs=dict(), **kwargs)` with
/// `input_transform='multiple_select'`.
#[derive(Debug, Clone, PartialEq)]
pub struct LightHamHeadCfg {
    pub head: DecodeHeadCfg,
    pub ham_channels: i64,
    pub nmf: NmfCfg,
}

impl LightHamHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<LightHamHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "LightHamHead", SOURCE);
        let ham_channels = c.int("ham_channels", 512)?;
        let nmf = NmfCfg::from_cfg(c.dict("ham_kwargs")?)?;
        let head = DecodeHeadCfg::from_cfg_bn_or_gn(&mut c, Some(InputTransform::MultipleSelect))?;
        if ham_channels % nmf.s != 0 {
            // `x.view(B * S, C // S, H * W)` fails.
            return Err(c.config_error("ham_channels must be divisible by ham_kwargs.MD_S"));
        }
        c.finish()?;
        Ok(LightHamHeadCfg {
            head,
            ham_channels,
            nmf,
        })
    }
}

pub struct LightHamHead {
    base: DecodeHeadBase,
    squeeze: ConvModule,
    ham_in: ConvModule,
    ham_out: ConvModule,
    align: ConvModule,
    nmf: NmfCfg,
}

impl LightHamHead {
    pub fn new(p: &mut ParamScope, cfg: LightHamHeadCfg) -> LightHamHead {
        let LightHamHeadCfg {
            head,
            ham_channels: ham,
            nmf,
        } = cfg;
        let (channels, norm) = (head.channels, head.norm);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let squeeze = ConvModule::new(
            &mut p.sub("squeeze"),
            ConvSpec::new(in_channels, ham, 1),
            norm,
            true,
        );
        let mut hp = p.sub("hamburger");
        let spec = ConvSpec::new(ham, ham, 1);
        let ham_in = ConvModule::new(&mut hp.sub("ham_in"), spec, None, false);
        let ham_out = ConvModule::new(&mut hp.sub("ham_out"), spec, norm, false);
        let align = ConvModule::new(
            &mut p.sub("align"),
            ConvSpec::new(ham, channels, 1),
            norm,
            true,
        );
        LightHamHead {
            base,
            squeeze,
            ham_in,
            ham_out,
            align,
            nmf,
        }
    }

    /// `Hamburger.forward`.
    fn hamburger(&self, x: &Tensor, training: bool) -> Tensor {
        let mut enjoy = self.ham_in.forward(x, training);
        let _ = enjoy.relu_();
        let enjoy = nmf2d(&enjoy, &self.nmf, training);
        let enjoy = self.ham_out.forward(&enjoy, training);
        let mut ham = x + enjoy;
        let _ = ham.relu_();
        ham
    }
}

/// `bmm` with its FLOPs counted.
fn bmm(a: &Tensor, b: &Tensor) -> Tensor {
    let (sa, sb) = (a.size(), b.size());
    count_flops(2.0 * (sa[0] * sa[1] * sa[2] * sb[2]) as f64);
    a.bmm(b)
}

/// `coef * numerator / (denominator + 1e-6)` (and the same for the bases).
fn multiplicative_update(value: &Tensor, numerator: &Tensor, denominator: &Tensor) -> Tensor {
    (value * numerator) / denominator.g_add_scalar(1e-6)
}

/// `NMF2D.forward` (`Matrix_Decomposition_2D_Base.forward`) on the
/// `[B, C, H, W]` map: `[B, C, H, W]`.
fn nmf2d(x: &Tensor, cfg: &NmfCfg, training: bool) -> Tensor {
    let s = x.size();
    let (b, c, h, w) = (s[0], s[1], s[2], s[3]);
    let d = c / cfg.s;
    let x = x.view([b * cfg.s, d, h * w]); // [B * S, D, N]
                                           // `_build_bases`: torch.rand((B * S, D, R)), F.normalize(dim=1).
    let bases = {
        let raw = Tensor::rand([b * cfg.s, d, cfg.r], (Kind::Float, x.device()));
        normalize(&raw, 2.0, 1)
    };
    // `local_inference`.
    let coef = bmm(&x.transpose(1, 2), &bases); // [B * S, N, R]
    let coef = {
        let scaled = coef.g_mul_scalar(1); // self.inv_t * coef
        let soft = scaled.softmax(-1, None::<Kind>);
        softmax_saved(&scaled, &soft);
        soft
    };
    let steps = if training {
        cfg.train_steps
    } else {
        cfg.eval_steps
    };
    let (mut bases, mut coef) = (bases, coef);
    for _ in 0..steps {
        (bases, coef) = local_step(&x, bases, coef);
    }
    // `compute_coef`.
    let numerator = bmm(&x.transpose(1, 2), &bases);
    let denominator = bmm(&coef, &bmm(&bases.transpose(1, 2), &bases));
    let coef = multiplicative_update(&coef, &numerator, &denominator);
    drop((numerator, denominator));
    bmm(&bases, &coef.transpose(1, 2)).view([b, c, h, w])
}

/// `NMF2D.local_step`: the coefficients' then the bases' multiplicative
/// update (each `numerator` / `denominator` alive until rebound, as the
/// Python locals are).
fn local_step(x: &Tensor, bases: Tensor, coef: Tensor) -> (Tensor, Tensor) {
    let mut numerator = bmm(&x.transpose(1, 2), &bases); // [B * S, N, R]
    let mut denominator = bmm(&coef, &bmm(&bases.transpose(1, 2), &bases));
    let coef = multiplicative_update(&coef, &numerator, &denominator);
    numerator = bmm(x, &coef); // [B * S, D, R]
    denominator = bmm(&bases, &bmm(&coef.transpose(1, 2), &coef));
    let bases = multiplicative_update(&bases, &numerator, &denominator);
    (bases, coef)
}

impl BaseHead for LightHamHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let inputs = self.base.selected_inputs(features);
        let size = (inputs[0].size()[2], inputs[0].size()[3]);
        let cat = {
            let resized: Vec<Tensor> = inputs
                .iter()
                .map(|level| resize_bilinear(level, size, self.base.cfg.align_corners))
                .collect();
            Tensor::cat(&resized, 1) // [B, sum(in_channels), H_0, W_0]
        };
        let x = self.squeeze.forward(&cat, training);
        drop(cat);
        let x = self.hamburger(&x, training);
        let output = self.align.forward(&x, training);
        drop(x);
        self.base.cls_seg(output, training)
    }
}

#[cfg(test)]
#[path = "ham_head_tests.rs"]
mod tests;
