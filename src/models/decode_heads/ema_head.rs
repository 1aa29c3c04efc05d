//! `EMAHead`, the expectation-maximisation attention head, as MMSeg's
//! `mmseg/models/decode_heads/ema_head.py` builds it.
//!
//! Li et al., "Expectation-Maximization Attention Networks for Semantic
//! Segmentation", ICCV 2019, arXiv:1907.13426.
//!
//! A 3x3 ConvModule, a frozen 1x1 conv, then the EM module: `num_bases`
//! bases (a buffer, updated by a moving average in training) are refined
//! for `num_stages` E/M iterations without gradients, and the map is
//! reconstructed from them; a 1x1 ConvModule, a residual ReLU, a 3x3
//! bottleneck and (with `concat_input`) a fusion with the input follow.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{normalize, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use std::cell::RefCell;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/ema_head.py";

/// The registry's constructor (`DECODE_HEADS` row `EMAHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = EmaHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(EmaHead::new(p, cfg)))
}

/// `EMAHead(ema_channels, num_bases, num_stages, concat_input=True,
/// momentum=0.1, **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct EmaHeadCfg {
    pub head: DecodeHeadCfg,
    pub ema_channels: i64,
    pub num_bases: i64,
    pub num_stages: i64,
    pub concat_input: bool,
    pub momentum: f64,
}

impl EmaHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<EmaHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "EMAHead", SOURCE);
        for key in ["ema_channels", "num_bases", "num_stages"] {
            c.require(key)?;
        }
        let ema_channels = c.int("ema_channels", 0)?;
        let num_bases = c.int("num_bases", 0)?;
        let num_stages = c.int("num_stages", 0)?;
        if num_stages < 1 {
            return Err(c.config_error("num_stages must be at least 1!"));
        }
        let concat_input = c.flag("concat_input", true);
        let momentum = c.float("momentum", 0.1)?;
        let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
        c.finish()?;
        Ok(EmaHeadCfg {
            head,
            ema_channels,
            num_bases,
            num_stages,
            concat_input,
            momentum,
        })
    }
}

/// `EMAModule(channels, num_bases, num_stages, momentum)`.
struct EmaModule {
    /// The `bases` buffer `[1, C, K]`, replaced after each training step.
    bases: RefCell<Tensor>,
    num_stages: i64,
    momentum: f64,
}

impl EmaModule {
    fn new(
        p: &mut ParamScope,
        channels: i64,
        num_bases: i64,
        num_stages: i64,
        momentum: f64,
    ) -> EmaModule {
        let bases = tch::no_grad(|| {
            let b = Tensor::randn([1, channels, num_bases], (Kind::Float, p.device()))
                * (2.0 / num_bases as f64).sqrt();
            normalize(&b, 2.0, 1)
        });
        EmaModule {
            bases: RefCell::new(p.buffer("bases", bases)),
            num_stages,
            momentum,
        }
    }

    /// `[B, C, H, W]` -> the reconstruction `[B, C, H, W]` (no gradient).
    fn forward(&self, feats: &Tensor, training: bool) -> Tensor {
        let s = feats.size();
        let (batch, channels) = (s[0], s[1]);
        let feats = feats.view([batch, channels, s[2] * s[3]]);
        let mut bases = self.bases.borrow().repeat([batch, 1, 1]);
        let mut attention = Tensor::new();
        tch::no_grad(|| {
            for _ in 0..self.num_stages {
                attention = Tensor::einsum("bcn,bck->bnk", &[&feats, &bases], None::<&[i64]>);
                attention = attention.softmax(2, None::<Kind>);
                let attention_normed = normalize(&attention, 1.0, 1);
                bases =
                    Tensor::einsum("bcn,bnk->bck", &[&feats, &attention_normed], None::<&[i64]>);
                bases = normalize(&bases, 2.0, 1);
            }
        });
        let recon = Tensor::einsum("bck,bnk->bcn", &[&bases, &attention], None::<&[i64]>)
            .view([batch, channels, s[2], s[3]]);
        drop(attention);
        if training {
            let mean = bases.mean_dim(0, true, None::<Kind>);
            drop(bases);
            let mean = normalize(&mean, 2.0, 1);
            let mut buffer = self.bases.borrow_mut();
            let updated = (1.0 - self.momentum) * &*buffer + self.momentum * mean;
            buffer.copy_(&updated);
        }
        recon
    }
}

pub struct EmaHead {
    base: DecodeHeadBase,
    ema_module: EmaModule,
    ema_in_conv: ConvModule,
    ema_mid_conv: ConvModule,
    ema_out_conv: ConvModule,
    bottleneck: ConvModule,
    conv_cat: Option<ConvModule>,
}

impl EmaHead {
    pub fn new(p: &mut ParamScope, cfg: EmaHeadCfg) -> EmaHead {
        let head = cfg.head;
        let (channels, norm) = (head.channels, head.norm);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let ema = cfg.ema_channels;
        let ema_module = EmaModule::new(
            &mut p.sub("ema_module"),
            ema,
            cfg.num_bases,
            cfg.num_stages,
            cfg.momentum,
        );
        let ema_in_conv = ConvModule::new(
            &mut p.sub("ema_in_conv"),
            ConvSpec::new(in_channels, ema, 3).padding(1),
            norm,
            true,
        );
        let mark = p.registered();
        let ema_mid_conv = ConvModule::new(
            &mut p.sub("ema_mid_conv"),
            ConvSpec::new(ema, ema, 1),
            None,
            false,
        );
        // `for param in self.ema_mid_conv.parameters(): param.requires_grad = False`
        p.freeze_since(mark);
        let ema_out_conv = ConvModule::new(
            &mut p.sub("ema_out_conv"),
            ConvSpec::new(ema, ema, 1),
            norm,
            false,
        );
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(ema, channels, 3).padding(1),
            norm,
            true,
        );
        let conv_cat = cfg.concat_input.then(|| {
            ConvModule::new(
                &mut p.sub("conv_cat"),
                ConvSpec::new(in_channels + channels, channels, 3).padding(1),
                norm,
                true,
            )
        });
        EmaHead {
            base,
            ema_module,
            ema_in_conv,
            ema_mid_conv,
            ema_out_conv,
            bottleneck,
            conv_cat,
        }
    }
}

impl BaseHead for EmaHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let x = self.base.transform_inputs(features);
        let identity = self.ema_in_conv.forward(&x, training);
        // `feats` (the frozen conv's output) and `recon` stay live locals of
        // the Python forward until it returns.
        let feats = self.ema_mid_conv.forward(&identity, training);
        let mut recon = self.ema_module.forward(&feats, training);
        let _ = recon.relu_();
        recon = self.ema_out_conv.forward(&recon, training);
        let mut output = &identity + &recon;
        let _ = output.relu_();
        output = self.bottleneck.forward(&output, training);
        if let Some(conv_cat) = &self.conv_cat {
            let cat = Tensor::cat(&[&x, &output], 1);
            output = conv_cat.forward(&cat, training);
        }
        let logits = self.base.cls_seg(output, training);
        drop((feats, recon));
        logits
    }
}

#[cfg(test)]
#[path = "ema_head_tests.rs"]
mod tests;
