//! K-Net's `IterativeDecodeHead`, `KernelUpdateHead` and `KernelUpdator`,
//! as MMSeg's `mmseg/models/decode_heads/knet_head.py` builds them.
//!
//! Zhang, Pang, Chen and Loy, "K-Net: Towards Unified Image Segmentation",
//! NeurIPS 2021, arXiv:2106.14855.
//!
//! A kernel generate head (FCN, PSP, ASPP or UPerNet) gives the features and
//! the first logits; its classifier's weight is the first set of kernels,
//! one per class. Each of `num_stages` kernel update heads then gathers a
//! feature per class from the softmax of the previous logits (einsum),
//! updates the kernels with it (the gated `KernelUpdator`), lets the kernels
//! attend to each other (mmcv's `MultiheadAttention`) and through an FFN,
//! and convolves the features with the new kernels, image by image, into
//! the next logits. Every stage's logits get the generate head's loss
//! (`loss_ce.s0` ... `loss_ce.s3`).

use super::decode_head::FeatureHead;
use super::{DecodeHead, LossItems, DECODE_HEADS};
use crate::config::{Dict, Value};
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::{
    count_flops, resize_bilinear, softmax_saved, ConvModule, ConvSpec, Ffn, FfnActivation,
    LayerNorm, Linear, MultiheadAttention,
};
use crate::models::params::ParamScope;
use crate::models::scope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/knet_head.py";

/// `nn.LayerNorm`'s default eps (`build_norm_layer(dict(type='LN'), ..)`).
const LN_EPS: f64 = 1e-5;

/// The registry's constructor (`DECODE_HEADS` row `IterativeDecodeHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "IterativeDecodeHead", SOURCE);
    c.require("num_stages")?;
    c.require("kernel_generate_head")?;
    c.require("kernel_update_head")?;
    let num_stages = c.int("num_stages", 0)?;
    let generate_cfg = c.dict("kernel_generate_head")?.ok_or_else(|| {
        c.config_error("`kernel_generate_head` must be a head's config dict, not None")
    })?;
    let update_cfgs: Vec<&Dict> = match c.value("kernel_update_head") {
        Some(Value::List(items) | Value::Tuple(items)) => items
            .iter()
            .map(|v| {
                v.as_dict().ok_or_else(|| {
                    c.config_error("`kernel_update_head` must be a list of config dicts")
                })
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(c.config_error("`kernel_update_head` must be a list of config dicts")),
    };
    // `assert num_stages == len(kernel_update_head)`.
    if num_stages != update_cfgs.len() as i64 {
        return Err(c.config_error(format!(
            "num_stages is {num_stages} but kernel_update_head lists {} heads",
            update_cfgs.len()
        )));
    }
    // BaseModule.__init__'s own keyword (the rest would be a TypeError).
    c.inert(&["init_cfg"]);
    c.finish()?;

    let generate_type = generate_cfg
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("<no type>");
    // The heads that can generate the kernels are the `DECODE_HEADS` rows
    // with a `FeatureHead` constructor.
    let Some(build_generate) = DECODE_HEADS
        .iter()
        .find(|(name, _)| *name == generate_type)
        .and_then(|(_, builders)| builders.build_feature_head)
    else {
        let names: Vec<&str> = DECODE_HEADS
            .iter()
            .filter(|(_, builders)| builders.build_feature_head.is_some())
            .map(|(name, _)| *name)
            .collect();
        return Err(ModelError::unsupported_in(
            "IterativeDecodeHead",
            SOURCE,
            "kernel_generate_head",
            format!(
                "type '{generate_type}' is not one segtune can generate K-Net's kernels with \
                 (supported: {})",
                names.join(", ")
            ),
        ));
    };
    let generate = build_generate(&mut p.sub("kernel_generate_head"), generate_cfg)?;
    let channels = generate.base().cfg.channels;
    let mut heads = p.sub("kernel_update_head");
    let update_heads = update_cfgs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let cfg = KernelUpdateHeadCfg::from_cfg(d)?;
            // The first kernels are conv_seg's: channels x 1 x 1 each.
            if cfg.in_channels * cfg.conv_kernel_size.pow(2) != channels {
                return Err(ModelError::config(
                    format!("KernelUpdateHead {i}"),
                    format!(
                        "in_channels {} x conv_kernel_size^2 must equal the kernel generate \
                         head's channels {channels} (its conv_seg weights are the first kernels)",
                        cfg.in_channels
                    ),
                ));
            }
            Ok(KernelUpdateHead::new(&mut heads.sub(i), cfg))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Box::new(IterativeDecodeHead {
        generate,
        update_heads,
    }))
}

/// `IterativeDecodeHead(num_stages, kernel_generate_head, kernel_update_head)`.
pub struct IterativeDecodeHead {
    generate: Box<dyn FeatureHead>,
    update_heads: Vec<KernelUpdateHead>,
}

impl IterativeDecodeHead {
    /// `forward(inputs)` in training: every stage's logits, the generate
    /// head's first.
    fn stage_logits(&self, features: &[Tensor], training: bool) -> Vec<Tensor> {
        let base = self.generate.base();
        let (feats, first) = {
            let _part = scope::enter("kernel_generate_head");
            let feats = self.generate.forward_feature(features, training);
            let first = base.cls_seg(feats.shallow_clone(), training);
            (feats, first)
        };
        // `conv_seg.weight.clone()[None].expand(B, ...)`.
        let weight = base.conv_seg_weight().copy();
        let mut kernels = weight.unsqueeze(0).expand(
            [
                feats.size()[0],
                weight.size()[0],
                weight.size()[1],
                weight.size()[2],
                weight.size()[3],
            ],
            false,
        );
        drop(weight);
        let mut stage_segs = vec![first];
        for (i, head) in self.update_heads.iter().enumerate() {
            let _part = scope::enter(&format!("kernel_update_head.{i}"));
            let previous = stage_segs.last().expect("the first stage");
            let (seg, next_kernels) = head.forward(&feats, &kernels, previous, training);
            kernels = next_kernels;
            stage_segs.push(seg);
        }
        stage_segs
    }
}

impl DecodeHead for IterativeDecodeHead {
    /// The last stage's logits (what `predict` uses).
    fn forward(&self, features: &[Tensor], _prev: Option<&Tensor>, training: bool) -> Tensor {
        self.stage_logits(features, training)
            .pop()
            .expect("the first stage")
    }

    /// `loss_by_feat`: the generate head's loss of each stage's logits,
    /// `<item>.s<i>`; all the logits live until the last is done.
    fn loss(&self, features: &[Tensor], _prev: Option<&Tensor>, labels: &[Tensor]) -> LossItems {
        let stage_segs = self.stage_logits(features, true);
        let mut items = Vec::new();
        for (i, logits) in stage_segs.iter().enumerate() {
            for (name, value) in self.generate.base().loss_by_feat(logits, labels) {
                items.push((format!("{name}.s{i}"), value));
            }
        }
        items
    }

    // `IterativeDecodeHead.__init__` copies these from the generate head.
    fn num_classes(&self) -> i64 {
        self.generate.base().cfg.num_classes
    }

    fn ignore_index(&self) -> i64 {
        self.generate.base().cfg.ignore_index
    }

    fn align_corners(&self) -> bool {
        self.generate.base().cfg.align_corners
    }
}

/// `nn.ReLU(inplace)` on an owned tensor.
fn relu(x: Tensor, inplace: bool) -> Tensor {
    if inplace {
        let mut x = x;
        let _ = x.relu_();
        x
    } else {
        x.relu()
    }
}

/// An `act_cfg` that must be `dict(type='ReLU', inplace=..)`: whether it
/// works in place (`inplace_default` when the key is unset: the classes'
/// defaults say `inplace=True`; `dict(type='ReLU')` alone builds
/// `nn.ReLU()`, not in place).
fn relu_cfg(c: &mut ComponentConfig, key: &str) -> Result<bool, ModelError> {
    match c.value(key) {
        None => Ok(true),
        Some(Value::Dict(d))
            if d.get("type").and_then(Value::as_str) == Some("ReLU")
                && d.keys().all(|k| k == "type" || k == "inplace") =>
        {
            Ok(d.get("inplace").is_some_and(Value::truthy))
        }
        Some(_) => Err(c.unsupported(key, "only dict(type='ReLU', inplace=..) is implemented")),
    }
}

/// A `norm_cfg` that must be `dict(type='LN')` (optionally with `eps`):
/// the eps.
fn layer_norm_cfg(c: &mut ComponentConfig, key: &str) -> Result<f64, ModelError> {
    match c.value(key) {
        None => Ok(LN_EPS),
        Some(Value::Dict(d))
            if d.get("type").and_then(Value::as_str) == Some("LN")
                && d.keys()
                    .all(|k| k == "type" || k == "eps" || k == "requires_grad")
                && d.get("requires_grad").is_none_or(Value::truthy) =>
        {
            Ok(d.get("eps").and_then(Value::as_f64).unwrap_or(LN_EPS))
        }
        Some(_) => Err(c.unsupported(key, "only dict(type='LN') is implemented")),
    }
}

/// `KernelUpdator(in_channels=256, feat_channels=64, out_channels=None,
/// gate_sigmoid=True, gate_norm_act=False, activate_out=False,
/// norm_cfg=dict(type='LN'), act_cfg=dict(type='ReLU', inplace=True))`.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelUpdatorCfg {
    pub in_channels: i64,
    pub feat_channels: i64,
    pub out_channels: i64,
    pub gate_sigmoid: bool,
    pub gate_norm_act: bool,
    pub activate_out: bool,
    pub norm_eps: f64,
    pub relu_inplace: bool,
}

impl KernelUpdatorCfg {
    pub fn from_cfg(d: &Dict) -> Result<KernelUpdatorCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "KernelUpdator", SOURCE);
        let in_channels = c.int("in_channels", 256)?;
        let feat_channels = c.int("feat_channels", 64)?;
        let out_channels = match c.value("out_channels") {
            None | Some(Value::None) => in_channels,
            Some(v) => v.as_i64().filter(|&o| o != 0).unwrap_or(in_channels),
        };
        let cfg = KernelUpdatorCfg {
            in_channels,
            feat_channels,
            out_channels,
            gate_sigmoid: c.flag("gate_sigmoid", true),
            gate_norm_act: c.flag("gate_norm_act", false),
            activate_out: c.flag("activate_out", false),
            norm_eps: layer_norm_cfg(&mut c, "norm_cfg")?,
            relu_inplace: relu_cfg(&mut c, "act_cfg")?,
        };
        c.finish()?;
        // `input_layer` (in_channels -> 2 feat_channels) runs on rows of
        // feat_channels, and the kernels come back with out_channels each.
        if feat_channels != in_channels || out_channels != in_channels {
            return Err(ModelError::config(
                "KernelUpdator",
                format!(
                    "in_channels {in_channels}, feat_channels {feat_channels} and \
                     out_channels {out_channels} must be equal (its forward reshapes one into \
                     the other; MMSeg fails there)"
                ),
            ));
        }
        Ok(cfg)
    }
}

/// The gated kernel update of K-Net's Eq. (4) and (5).
pub struct KernelUpdator {
    cfg: KernelUpdatorCfg,
    dynamic_layer: Linear,
    input_layer: Linear,
    input_gate: Linear,
    update_gate: Linear,
    gate_norm: Option<LayerNorm>,
    norm_in: LayerNorm,
    norm_out: LayerNorm,
    input_norm_in: LayerNorm,
    input_norm_out: LayerNorm,
    fc_layer: Linear,
    fc_norm: LayerNorm,
}

impl KernelUpdator {
    pub fn new(p: &mut ParamScope, cfg: KernelUpdatorCfg) -> KernelUpdator {
        let (c, f, o, eps) = (
            cfg.in_channels,
            cfg.feat_channels,
            cfg.out_channels,
            cfg.norm_eps,
        );
        let dynamic_layer = Linear::new(&mut p.sub("dynamic_layer"), c, 2 * f, true);
        let input_layer = Linear::new(&mut p.sub("input_layer"), c, 2 * f, true);
        let input_gate = Linear::new(&mut p.sub("input_gate"), c, f, true);
        let update_gate = Linear::new(&mut p.sub("update_gate"), c, f, true);
        let gate_norm = cfg
            .gate_norm_act
            .then(|| LayerNorm::new(&mut p.sub("gate_norm"), f, eps));
        KernelUpdator {
            dynamic_layer,
            input_layer,
            input_gate,
            update_gate,
            gate_norm,
            norm_in: LayerNorm::new(&mut p.sub("norm_in"), f, eps),
            norm_out: LayerNorm::new(&mut p.sub("norm_out"), f, eps),
            input_norm_in: LayerNorm::new(&mut p.sub("input_norm_in"), f, eps),
            input_norm_out: LayerNorm::new(&mut p.sub("input_norm_out"), f, eps),
            fc_layer: Linear::new(&mut p.sub("fc_layer"), f, o, true),
            fc_norm: LayerNorm::new(&mut p.sub("fc_norm"), o, eps),
            cfg,
        }
    }

    /// `update_feature`: the gathered class features `[B, N, C]`;
    /// `input_feature`: the kernels `[B, N, K*K, C]`. Returns
    /// `[B*N*C/in_channels, K*K, out_channels]`.
    pub fn forward(&self, update_feature: &Tensor, input_feature: &Tensor) -> Tensor {
        let (f, inplace) = (self.cfg.feat_channels, self.cfg.relu_inplace);
        let update_feature = update_feature.reshape([-1, self.cfg.in_channels]);
        let num_proposals = update_feature.size()[0];
        let parameters = self.dynamic_layer.forward(&update_feature); // [R, 2f]
        let param_in = parameters.slice(1, 0, f, 1).view([-1, f]);
        let mut param_out = parameters.slice(1, f, 2 * f, 1).view([-1, f]);
        let input_feats = self
            .input_layer
            .forward(&input_feature.reshape([num_proposals, -1, f])); // [R, K*K, 2f]
        let input_in = input_feats.slice(-1, 0, f, 1);
        let mut input_out = input_feats.slice(-1, f, 2 * f, 1);
        let mut gate_feats = &input_in * param_in.unsqueeze(-2); // [R, K*K, f]
        if let Some(norm) = &self.gate_norm {
            gate_feats = relu(norm.forward(&gate_feats), inplace);
        }
        let mut input_gate = self
            .input_norm_in
            .forward(&self.input_gate.forward(&gate_feats));
        let mut update_gate = self.norm_in.forward(&self.update_gate.forward(&gate_feats));
        if self.cfg.gate_sigmoid {
            input_gate = input_gate.sigmoid();
            update_gate = update_gate.sigmoid();
        }
        param_out = self.norm_out.forward(&param_out);
        input_out = self.input_norm_out.forward(&input_out);
        if self.cfg.activate_out {
            param_out = relu(param_out, inplace);
            input_out = relu(input_out, inplace);
        }
        // Eq. (5): both products exist before their sum.
        let features = {
            let updated = &update_gate * param_out.unsqueeze(-2);
            let kept = &input_gate * &input_out;
            updated + kept
        };
        let features = {
            let projected = self.fc_layer.forward(&features);
            drop(features);
            self.fc_norm.forward(&projected)
        };
        relu(features, inplace)
    }
}

/// `KernelUpdateHead(...)`'s settings (see the MMSeg docstring for each).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelUpdateHeadCfg {
    pub num_heads: i64,
    pub num_mask_fcs: i64,
    pub feedforward_channels: i64,
    pub in_channels: i64,
    pub out_channels: i64,
    pub relu_inplace: bool,
    pub ffn_activation: FfnActivation,
    pub conv_kernel_size: i64,
    /// `feat_transform_cfg`: (kernel size, norm, ReLU) of its ConvModule.
    pub feat_transform: Option<(i64, Option<NormCfg>, bool)>,
    pub with_ffn: bool,
    pub feat_gather_stride: i64,
    pub mask_transform_stride: i64,
    pub updator: KernelUpdatorCfg,
}

impl KernelUpdateHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<KernelUpdateHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "KernelUpdateHead", SOURCE);
        c.unimplemented("num_ffn_fcs", &Value::Int(2))?;
        c.unimplemented("dropout", &Value::Float(0.0))?;
        // Initialisation and the stored class count only.
        c.inert(&["num_classes", "kernel_init", "init_cfg"]);
        let in_channels = c.int("in_channels", 256)?;
        let out_channels = c.int("out_channels", 256)?;
        let relu_inplace = relu_cfg(&mut c, "act_cfg")?;
        let ffn_activation = match c.value("ffn_act_cfg") {
            None => FfnActivation::Relu,
            Some(Value::Dict(a)) => match (
                a.get("type").and_then(Value::as_str),
                a.get("inplace").map(Value::truthy),
            ) {
                (Some("ReLU"), Some(true)) => FfnActivation::Relu,
                (Some("GELU"), None) => FfnActivation::Gelu,
                _ => return Err(c.unsupported(
                    "ffn_act_cfg",
                    "only dict(type='ReLU', inplace=True) and dict(type='GELU') are implemented",
                )),
            },
            Some(_) => return Err(c.config_error("`ffn_act_cfg` must be a dict")),
        };
        let feat_transform = match c.dict("feat_transform_cfg")? {
            None => None,
            Some(t) => Some(read_feat_transform(t)?),
        };
        let updator_dict = c.dict("kernel_updator_cfg")?;
        let updator = match updator_dict {
            Some(u) if u.get("type").and_then(Value::as_str) == Some("KernelUpdator") => {
                KernelUpdatorCfg::from_cfg(u)?
            }
            other => {
                let ty = other
                    .and_then(|u| u.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("DynamicConv");
                return Err(c.unsupported(
                    "kernel_updator_cfg",
                    format!("type '{ty}' is not implemented (only 'KernelUpdator')"),
                ));
            }
        };
        let cfg = KernelUpdateHeadCfg {
            num_heads: c.int("num_heads", 8)?,
            num_mask_fcs: c.int("num_mask_fcs", 3)?,
            feedforward_channels: c.int("feedforward_channels", 2048)?,
            in_channels,
            out_channels,
            relu_inplace,
            ffn_activation,
            conv_kernel_size: c.int("conv_kernel_size", 1)?,
            feat_transform,
            with_ffn: c.flag("with_ffn", true),
            feat_gather_stride: c.int("feat_gather_stride", 1)?,
            mask_transform_stride: c.int("mask_transform_stride", 1)?,
            updator,
        };
        c.finish()?;
        let embed = in_channels * cfg.conv_kernel_size.pow(2);
        let problem = if out_channels != in_channels {
            Some(format!(
                "out_channels {out_channels} must equal in_channels {in_channels} (the new \
                 kernels are reshaped to in_channels each)"
            ))
        } else if cfg.num_heads <= 0 || embed % cfg.num_heads != 0 {
            Some(format!(
                "in_channels x conv_kernel_size^2 = {embed} must be divisible by num_heads {}",
                cfg.num_heads
            ))
        } else if in_channels % cfg.updator.in_channels != 0 {
            Some(format!(
                "in_channels {in_channels} must be a multiple of kernel_updator_cfg.in_channels {}",
                cfg.updator.in_channels
            ))
        } else if ![1, 2].contains(&cfg.mask_transform_stride) || cfg.feat_gather_stride < 1 {
            Some("mask_transform_stride must be 1 or 2, feat_gather_stride positive".to_string())
        } else {
            None
        };
        match problem {
            Some(p) => Err(ModelError::config("KernelUpdateHead", p)),
            None => Ok(cfg),
        }
    }
}

/// `feat_transform_cfg`: `kernel_size` (popped, default 1) and a
/// ConvModule's `conv_cfg`, `norm_cfg` and `act_cfg`.
fn read_feat_transform(d: &Dict) -> Result<(i64, Option<NormCfg>, bool), ModelError> {
    let mut c = ComponentConfig::new(d, "KernelUpdateHead feat_transform_cfg", SOURCE);
    let kernel_size = c.int("kernel_size", 1)?;
    match c.value("conv_cfg") {
        None | Some(Value::None) => {}
        Some(Value::Dict(conv)) if conv.get("type").and_then(Value::as_str) == Some("Conv2d") => {}
        Some(_) => return Err(c.unsupported("conv_cfg", "only dict(type='Conv2d') is implemented")),
    }
    let norm = c.batch_norm("norm_cfg")?;
    let relu = match c.value("act_cfg") {
        None => true,
        Some(Value::None) => false,
        Some(Value::Dict(a)) if a.get("type").and_then(Value::as_str) == Some("ReLU") => true,
        Some(_) => return Err(c.unsupported("act_cfg", "only ReLU or None is implemented")),
    };
    c.finish()?;
    Ok((kernel_size, norm, relu))
}

/// One stage: new kernels from the previous logits, then new logits.
pub struct KernelUpdateHead {
    cfg: KernelUpdateHeadCfg,
    attention: MultiheadAttention,
    attention_norm: LayerNorm,
    kernel_update_conv: KernelUpdator,
    feat_transform: Option<ConvModule>,
    ffn: Option<(Ffn, LayerNorm)>,
    mask_fcs: Vec<(Linear, LayerNorm)>,
    fc_mask: Linear,
}

impl KernelUpdateHead {
    pub fn new(p: &mut ParamScope, cfg: KernelUpdateHeadCfg) -> KernelUpdateHead {
        let c = cfg.in_channels;
        let embed = c * cfg.conv_kernel_size.pow(2);
        let attention = MultiheadAttention::new(
            &mut p.sub("attention").sub("attn"),
            embed,
            cfg.num_heads,
            true,
        );
        let attention_norm = LayerNorm::new(&mut p.sub("attention_norm"), embed, LN_EPS);
        let kernel_update_conv =
            KernelUpdator::new(&mut p.sub("kernel_update_conv"), cfg.updator.clone());
        let feat_transform = cfg.feat_transform.map(|(kernel, norm, relu)| {
            let stride = cfg.feat_gather_stride;
            ConvModule::new(
                &mut p.sub("feat_transform"),
                ConvSpec::new(c, c, kernel)
                    .stride(stride)
                    .padding(stride / 2),
                norm,
                relu,
            )
        });
        let ffn = cfg.with_ffn.then(|| {
            (
                Ffn::new(
                    &mut p.sub("ffn"),
                    c,
                    cfg.feedforward_channels,
                    cfg.ffn_activation,
                    0.0,
                    0.0,
                ),
                LayerNorm::new(&mut p.sub("ffn_norm"), c, LN_EPS),
            )
        });
        let mut fcs = p.sub("mask_fcs");
        let mask_fcs = (0..cfg.num_mask_fcs)
            .map(|i| {
                (
                    Linear::new(&mut fcs.sub(3 * i), c, c, false),
                    LayerNorm::new(&mut fcs.sub(3 * i + 1), c, LN_EPS),
                )
            })
            .collect();
        let fc_mask = Linear::new(&mut p.sub("fc_mask"), c, cfg.out_channels, true);
        KernelUpdateHead {
            attention,
            attention_norm,
            kernel_update_conv,
            feat_transform,
            ffn,
            mask_fcs,
            fc_mask,
            cfg,
        }
    }

    /// `forward(x, proposal_feat, mask_preds)`: `x` the features
    /// `[B, C, H, W]`, `kernels` `[B, N, C, K, K]`, `mask_preds` the previous
    /// logits `[B, N, h, w]`. Returns the new logits `[B, N, H', W']` and the
    /// new kernels.
    pub fn forward(
        &self,
        x: &Tensor,
        kernels: &Tensor,
        mask_preds: &Tensor,
        training: bool,
    ) -> (Tensor, Tensor) {
        let (n, num_proposals) = (kernels.size()[0], kernels.size()[1]);
        let (c, k) = (self.cfg.in_channels, self.cfg.conv_kernel_size);
        let x = match &self.feat_transform {
            Some(transform) => transform.forward(x, training),
            None => x.shallow_clone(),
        };
        let [channels, mut h, mut w] = x.size()[1..] else {
            unreachable!("a feature map is 4-D")
        };
        let mask_size = (mask_preds.size()[2], mask_preds.size()[3]);
        // Python keeps `gather_mask` to the end of forward.
        let gather_mask = if mask_size != (h, w) {
            resize_bilinear(mask_preds, (h, w), false)
        } else {
            mask_preds.shallow_clone()
        };
        let masks = gather_mask.softmax(1, None::<Kind>);
        softmax_saved(&gather_mask, &masks);
        // Group feature assembling, Eq. (3).
        let x_feat = Tensor::einsum("bnhw,bchw->bnc", &[&masks, &x], None::<i64>); // [B, N, C]
        count_flops(2.0 * (n * num_proposals * channels * h * w) as f64);
        let proposal_feat = kernels
            .reshape([n, num_proposals, c, -1])
            .permute([0, 1, 3, 2]); // [B, N, K*K, C]
        let updated = self.kernel_update_conv.forward(&x_feat, &proposal_feat);
        // [B, N, K*K*C] -> [N, B, K*K*C] for the attention between kernels.
        let mut obj_feat = updated.reshape([n, num_proposals, -1]).permute([1, 0, 2]);
        drop(updated);
        obj_feat = {
            let attended = &obj_feat + self.attention.forward_self(&obj_feat);
            self.attention_norm.forward(&attended)
        };
        obj_feat = obj_feat
            .permute([1, 0, 2])
            .reshape([n, num_proposals, -1, c]);
        if let Some((ffn, norm)) = &self.ffn {
            obj_feat = {
                let out = ffn.forward(&obj_feat, &obj_feat, training);
                norm.forward(&out)
            };
        }
        let mut mask_feat = obj_feat.shallow_clone();
        for (fc, norm) in &self.mask_fcs {
            mask_feat = fc.forward(&mask_feat);
            mask_feat = norm.forward(&mask_feat);
            mask_feat = relu(mask_feat, self.cfg.relu_inplace);
        }
        mask_feat = self.fc_mask.forward(&mask_feat).permute([0, 1, 3, 2]); // [B, N, C, K*K]
        let mask_x = if self.cfg.mask_transform_stride == 2 && self.cfg.feat_gather_stride == 1 {
            // F.interpolate(x, scale_factor=0.5): floor sizes, the scale kept.
            let half = x.upsample_bilinear2d([h / 2, w / 2], false, Some(0.5), Some(0.5));
            (h, w) = (h / 2, w / 2);
            half
        } else {
            x.shallow_clone()
        };
        let mask_feat = mask_feat.reshape([n, num_proposals, channels, k, k]);
        // One image at a time (MMSeg's "concat batch"), then one cat.
        let per_image: Vec<Tensor> = (0..n)
            .map(|i| {
                mask_x.slice(0, i, i + 1, 1).conv2d(
                    &mask_feat.get(i),
                    None::<Tensor>,
                    [1, 1],
                    [k / 2, k / 2],
                    [1, 1],
                    1,
                )
            })
            .collect();
        count_flops(2.0 * (n * num_proposals * channels * k * k * h * w) as f64);
        let mut new_mask_preds = Tensor::cat(&per_image, 0);
        drop(per_image);
        new_mask_preds = new_mask_preds.reshape([n, num_proposals, h, w]);
        if self.cfg.mask_transform_stride == 2 {
            new_mask_preds =
                new_mask_preds.upsample_bilinear2d([h * 2, w * 2], false, Some(2.0), Some(2.0));
        }
        let new_kernels = obj_feat
            .permute([0, 1, 3, 2])
            .reshape([n, num_proposals, c, k, k]);
        (new_mask_preds, new_kernels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use crate::models::params::ParamStore;
    use serde_json::{json, Value as Json};
    use tch::Device;

    /// `model.decode_head` of knet/knet-s3_r50-d8_fcn_8xb2-adamw-80k_ade20k-512x512.py,
    /// resolved.
    fn knet_fcn() -> Json {
        let stage = json!({
            "type": "KernelUpdateHead", "num_classes": 150, "num_ffn_fcs": 2, "num_heads": 8,
            "num_mask_fcs": 1, "feedforward_channels": 2048, "in_channels": 512,
            "out_channels": 512, "dropout": 0.0, "conv_kernel_size": 1,
            "ffn_act_cfg": {"type": "ReLU", "inplace": true}, "with_ffn": true,
            "feat_transform_cfg": {"conv_cfg": {"type": "Conv2d"}, "act_cfg": null},
            "kernel_updator_cfg": {
                "type": "KernelUpdator", "in_channels": 256, "feat_channels": 256,
                "out_channels": 256, "act_cfg": {"type": "ReLU", "inplace": true},
                "norm_cfg": {"type": "LN"},
            },
        });
        json!({
            "type": "IterativeDecodeHead", "num_stages": 3,
            "kernel_update_head": [stage.clone(), stage.clone(), stage],
            "kernel_generate_head": {
                "type": "FCNHead", "in_channels": 2048, "in_index": 3, "channels": 512,
                "num_convs": 2, "concat_input": true, "dropout_ratio": 0.1, "num_classes": 150,
                "norm_cfg": {"type": "SyncBN", "requires_grad": true}, "align_corners": false,
                "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
            },
        })
    }

    fn build_error(cfg: Json) -> String {
        let mut store = ParamStore::new(Device::Cpu);
        match build(&mut store.scope("decode_head"), &dict(cfg)) {
            Ok(_) => panic!("built"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn knet_fcn_head_has_mmsegs_parameter_count_and_a_loss_per_stage() {
        let mut store = ParamStore::new(Device::Cpu);
        let head = build(&mut store.scope("decode_head"), &dict(knet_fcn())).unwrap();
        // params_all.json, knet/knet-s3_r50-d8_fcn_8xb2-adamw-80k_ade20k-512x512.py:
        // by_prefix.decode_head.total
        assert_eq!(store.total(), 36_884_886);
        let features: Vec<Tensor> = (0..4)
            .map(|_| Tensor::randn([2, 2048, 4, 4], (Kind::Float, Device::Cpu)))
            .collect();
        let labels: Vec<Tensor> = (0..2)
            .map(|_| Tensor::randint(150, [1, 32, 32], (Kind::Int64, Device::Cpu)))
            .collect();
        let items = head.loss(&features, None, &labels);
        let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "loss_ce.s0",
                "acc_seg.s0",
                "loss_ce.s1",
                "acc_seg.s1",
                "loss_ce.s2",
                "acc_seg.s2",
                "loss_ce.s3",
                "acc_seg.s3"
            ]
        );
        assert!(items.iter().all(|(_, v)| v.double_value(&[]).is_finite()));
        let logits = head.forward(&features, None, false);
        assert_eq!(logits.size(), [2, 150, 4, 4]);
    }

    #[test]
    fn knet_refuses_what_mmseg_cannot_run_or_segtune_lacks() {
        let mut cfg = knet_fcn();
        cfg["num_stages"] = json!(2);
        assert!(build_error(cfg).contains("num_stages is 2 but kernel_update_head lists 3"));

        let mut cfg = knet_fcn();
        cfg["kernel_generate_head"]["type"] = json!("SegformerHead");
        let e = build_error(cfg);
        assert!(
            e.contains("'SegformerHead'") && e.contains("ASPPHead, FCNHead, PSPHead, UPerHead"),
            "{e}"
        );

        let mut cfg = knet_fcn();
        cfg["kernel_update_head"][1]["kernel_updator_cfg"]["type"] = json!("DynamicConv");
        assert!(build_error(cfg).contains("type 'DynamicConv' is not implemented"));

        let mut cfg = knet_fcn();
        cfg["kernel_update_head"][0]["in_channels"] = json!(256);
        cfg["kernel_update_head"][0]["out_channels"] = json!(256);
        assert!(build_error(cfg).contains("must equal the kernel generate head's channels 512"));

        let mut cfg = knet_fcn();
        cfg["kernel_update_head"][2]["dropout"] = json!(0.1);
        assert!(build_error(cfg).contains("`dropout`"));
    }
}
