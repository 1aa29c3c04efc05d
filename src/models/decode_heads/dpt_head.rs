//! `DPTHead`, as MMSeg's `mmseg/models/decode_heads/dpt_head.py` builds it
//! (`ReassembleBlocks`, `PreActResidualConvUnit`, `FeatureFusionBlock`).
//!
//! Ranftl et al., "Vision Transformers for Dense Prediction", ICCV 2021,
//! arXiv:2103.13413.
//!
//! The head takes a ViT's `[map, cls_token]` output pairs
//! (`output_cls_token=True`; the backbone's list holds each pair flat, the
//! map then its class token, see `backbones/vit.rs`). Reassemble: each map
//! gets the class token's readout (ignored, added, or concatenated and
//! projected by a Linear + GELU), a 1x1 conv to its `post_process_channels`
//! entry, and a resize to 4x, 2x, 1x and 1/2 of the patch grid (two
//! transposed convs, the identity, a strided conv). A 3x3 conv per level to
//! `channels`, then fusion from the coarsest level up: each block adds the
//! finer level through a pre-activation residual unit, refines with another,
//! upsamples 2x (bilinear, `align_corners=True`) and projects 1x1. A final
//! 3x3 ConvModule and the classifier, at half the input resolution.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, InputTransform};
use super::DecodeHead;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{
    resize_bilinear, Conv2d, ConvModule, ConvNorm, ConvSpec, ConvTranspose2d, Linear,
};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/dpt_head.py";

/// The registry's constructor (`DECODE_HEADS` row `DPTHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = DptHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(DptHead::new(p, cfg)))
}

/// `readout_type`: what the class token does to each map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readout {
    Ignore,
    Add,
    Project,
}

/// `DPTHead(embed_dims=768, post_process_channels=[96, 192, 384, 768],
/// readout_type='ignore', patch_size=16, expand_channels=False,
/// act_cfg=dict(type='ReLU'), norm_cfg=dict(type='BN'), **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct DptHeadCfg {
    pub head: DecodeHeadCfg,
    pub embed_dims: i64,
    pub post_process_channels: Vec<i64>,
    pub readout: Readout,
    /// DPTHead's own `norm_cfg` (its residual units and `project`).
    pub norm: NormCfg,
}

impl DptHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<DptHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "DPTHead", SOURCE);
        let embed_dims = c.int("embed_dims", 768)?;
        let post_process_channels = c.ints("post_process_channels", &[96, 192, 384, 768])?;
        let readout = match c.string("readout_type")? {
            None | Some("ignore") => Readout::Ignore,
            Some("add") => Readout::Add,
            Some("project") => Readout::Project,
            Some(other) => {
                return Err(c.config_error(format!(
                    "assert readout_type in ['ignore', 'add', 'project'] (got '{other}')"
                )))
            }
        };
        // DPTHead takes norm_cfg and act_cfg itself (BaseDecodeHead gets
        // neither): BN by default; the activation is read (ReLU only) below.
        let norm = match c.value("norm_cfg") {
            Some(Value::None) => {
                return Err(c.unsupported("norm_cfg", "None (the residual units' BN is built)"))
            }
            _ => c.batch_norm_or_bn("norm_cfg")?,
        }
        .expect("a norm_cfg dict or the BN default");
        // expand_channels gives float channel counts (math.pow) to nn.Conv2d
        // and 2**i-fold channels the reassembled maps do not have.
        c.unimplemented("expand_channels", &Value::Bool(false))?;
        // patch_size is only stored by ReassembleBlocks.
        c.inert(&["patch_size"]);
        let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
        c.finish()?;
        if head.input_transform != InputTransform::MultipleSelect {
            // _transform_inputs would index a pair, or concatenate pairs.
            return Err(ModelError::config(
                "DPTHead",
                "takes its four [map, cls_token] pairs with input_transform='multiple_select'",
            ));
        }
        if post_process_channels.len() != 4 || head.in_index.len() != 4 {
            // assert self.num_fusion_blocks == self.num_reassemble_blocks (4),
            // and forward's assert len(inputs) == self.num_reassemble_blocks.
            return Err(ModelError::config(
                "DPTHead",
                format!(
                    "needs four post_process_channels and four in_index entries (one per \
                     reassemble block), not {} and {}",
                    post_process_channels.len(),
                    head.in_index.len()
                ),
            ));
        }
        Ok(DptHeadCfg {
            head,
            embed_dims,
            post_process_channels,
            readout,
            norm,
        })
    }
}

/// `ReassembleBlocks`.
struct ReassembleBlocks {
    projects: Vec<ConvModule>,
    /// `resize_layers[0]` and `[1]`.
    upsample: [ConvTranspose2d; 2],
    /// `resize_layers[3]`.
    downsample: Conv2d,
    /// `readout_projects[i]`: `Sequential(Linear(2C, C), GELU)`.
    readout_projects: Vec<Linear>,
    readout: Readout,
}

impl ReassembleBlocks {
    /// `p`: `reassemble_blocks`.
    fn new(p: &mut ParamScope, c: &DptHeadCfg) -> ReassembleBlocks {
        let (dims, out) = (c.embed_dims, &c.post_process_channels);
        let projects = out
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let spec = ConvSpec::new(dims, *o, 1);
                ConvModule::new(&mut p.sub("projects").sub(i), spec, None, false)
            })
            .collect();
        let mut resize = p.sub("resize_layers");
        let upsample = [
            ConvTranspose2d::new(&mut resize.sub(0), out[0], out[0], 4, 4, 0),
            ConvTranspose2d::new(&mut resize.sub(1), out[1], out[1], 2, 2, 0),
        ];
        let downsample = Conv2d::new(
            &mut resize.sub(3),
            ConvSpec::new(out[3], out[3], 3).stride(2).padding(1),
        );
        let readout_projects = match c.readout {
            Readout::Project => (0..out.len())
                .map(|i| {
                    Linear::new(
                        &mut p.sub("readout_projects").sub(i).sub(0),
                        2 * dims,
                        dims,
                        true,
                    )
                })
                .collect(),
            _ => Vec::new(),
        };
        ReassembleBlocks {
            projects,
            upsample,
            downsample,
            readout_projects,
            readout: c.readout,
        }
    }

    /// One pair: the readout, the 1x1 projection, the resize.
    fn forward_one(&self, i: usize, x: &Tensor, cls_token: &Tensor, training: bool) -> Tensor {
        let shape = x.size();
        let x = match self.readout {
            Readout::Project => {
                let tokens = x.flatten(2, -1).permute([0, 2, 1]);
                let readout = cls_token.unsqueeze(1).expand_as(&tokens);
                let joined = Tensor::cat(&[&tokens, &readout], -1);
                // nn.Sequential keeps only the latest output.
                let projected = self.readout_projects[i].forward(&joined).gelu("none");
                drop(joined);
                projected.permute([0, 2, 1]).reshape(&shape)
            }
            Readout::Add => (x.flatten(2, -1) + cls_token.unsqueeze(-1)).reshape(&shape),
            Readout::Ignore => x.shallow_clone(),
        };
        let x = self.projects[i].forward(&x, training);
        match i {
            0 | 1 => self.upsample[i].forward(&x),
            2 => x,
            _ => self.downsample.forward(&x),
        }
    }
}

/// `PreActResidualConvUnit`: `conv2(conv1(x)) + x.clone()`, each
/// ConvModule in the order act (ReLU in place), conv (no bias), norm.
struct PreActResidualConvUnit {
    conv1: (Conv2d, ConvNorm),
    conv2: (Conv2d, ConvNorm),
}

impl PreActResidualConvUnit {
    fn new(p: &mut ParamScope, channels: i64, norm: &NormCfg) -> PreActResidualConvUnit {
        let mut conv = |name: &str| {
            let mut s = p.sub(name);
            let spec = ConvSpec::new(channels, channels, 3).padding(1).bias(false);
            let conv = Conv2d::new(&mut s.sub("conv"), spec);
            (
                conv,
                ConvNorm::new(&mut s.sub(norm.module_name()), channels, norm),
            )
        };
        let conv1 = conv("conv1");
        let conv2 = conv("conv2");
        PreActResidualConvUnit { conv1, conv2 }
    }

    /// The ReLU of `conv1` overwrites `inputs` (hence the clone).
    fn forward(&self, inputs: &Tensor, training: bool) -> Tensor {
        let inputs_ = inputs.copy();
        let act_conv_norm = |(conv, norm): &(Conv2d, ConvNorm), x: &Tensor| {
            let _ = x.shallow_clone().relu_();
            norm.forward(&conv.forward(x), training)
        };
        let x = act_conv_norm(&self.conv1, inputs);
        let x = act_conv_norm(&self.conv2, &x);
        x + inputs_
    }
}

/// `FeatureFusionBlock` (`expand=False`, `align_corners=True`).
struct FeatureFusionBlock {
    project: ConvModule,
    /// `None` in the first block (`fusion_blocks[0].res_conv_unit1 = None`).
    res_conv_unit1: Option<PreActResidualConvUnit>,
    res_conv_unit2: PreActResidualConvUnit,
}

impl FeatureFusionBlock {
    fn new(p: &mut ParamScope, channels: i64, norm: &NormCfg, first: bool) -> FeatureFusionBlock {
        let project = ConvModule::with_conv_bias(
            &mut p.sub("project"),
            ConvSpec::new(channels, channels, 1),
            None,
            false,
            true,
        );
        let res_conv_unit1 = (!first)
            .then(|| PreActResidualConvUnit::new(&mut p.sub("res_conv_unit1"), channels, norm));
        let res_conv_unit2 =
            PreActResidualConvUnit::new(&mut p.sub("res_conv_unit2"), channels, norm);
        FeatureFusionBlock {
            project,
            res_conv_unit1,
            res_conv_unit2,
        }
    }

    /// `forward(*inputs)`: `x`, and the finer level `res` but in the first block.
    fn forward(&self, x: &Tensor, res: Option<&Tensor>, training: bool) -> Tensor {
        let x = match res {
            Some(res) => {
                let unit = self
                    .res_conv_unit1
                    .as_ref()
                    .expect("the first fusion block takes one input");
                let (s, r) = (x.size(), res.size());
                let res = if s != r {
                    resize_bilinear(res, (s[2], s[3]), false)
                } else {
                    res.shallow_clone()
                };
                x + unit.forward(&res, training)
            }
            None => x.shallow_clone(),
        };
        // Python rebinds x: each step's input dies unless saved.
        let refined = self.res_conv_unit2.forward(&x, training);
        drop(x);
        // resize(scale_factor=2, align_corners=True): F.interpolate passes the scale on.
        let (h, w) = (refined.size()[2], refined.size()[3]);
        let upsampled = refined.upsample_bilinear2d([h * 2, w * 2], true, Some(2.0), Some(2.0));
        drop(refined);
        self.project.forward(&upsampled, training)
    }
}

pub struct DptHead {
    base: DecodeHeadBase,
    reassemble_blocks: ReassembleBlocks,
    convs: Vec<ConvModule>,
    fusion_blocks: Vec<FeatureFusionBlock>,
    project: ConvModule,
}

impl DptHead {
    pub fn new(p: &mut ParamScope, cfg: DptHeadCfg) -> DptHead {
        // BaseDecodeHead's conv_seg comes first in named_parameters.
        let base = DecodeHeadBase::new(p, cfg.head.clone());
        let reassemble_blocks = ReassembleBlocks::new(&mut p.sub("reassemble_blocks"), &cfg);
        let ch = cfg.head.channels;
        let convs = cfg
            .post_process_channels
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let spec = ConvSpec::new(*c, ch, 3).padding(1);
                ConvModule::with_conv_bias(&mut p.sub("convs").sub(i), spec, None, false, false)
            })
            .collect();
        let fusion_blocks = (0..cfg.post_process_channels.len())
            .map(|i| {
                FeatureFusionBlock::new(&mut p.sub("fusion_blocks").sub(i), ch, &cfg.norm, i == 0)
            })
            .collect();
        let project = ConvModule::new(
            &mut p.sub("project"),
            ConvSpec::new(ch, ch, 3).padding(1),
            Some(cfg.norm),
            true,
        );
        DptHead {
            base,
            reassemble_blocks,
            convs,
            fusion_blocks,
            project,
        }
    }

    /// `_transform_inputs` (`multiple_select`) on the flat `[map, cls_token]`
    /// list: the pairs at `in_index`.
    fn selected_pairs<'a>(&self, features: &'a [Tensor]) -> Vec<(&'a Tensor, &'a Tensor)> {
        let pairs_ok = features.len().is_multiple_of(2)
            && features
                .chunks(2)
                .all(|pair| pair[0].dim() == 4 && pair[1].dim() == 2);
        assert!(
            pairs_ok,
            "DPTHead: ReassembleBlocks asserts len(x) == 2 for each input: it takes the \
             backbone's [map, cls_token] pairs (VisionTransformer with output_cls_token=True)"
        );
        let pairs: Vec<(&Tensor, &Tensor)> = features.chunks(2).map(|p| (&p[0], &p[1])).collect();
        assert_eq!(
            pairs.len(),
            self.fusion_blocks.len(),
            "DPTHead: assert len(inputs) == self.num_reassemble_blocks"
        );
        self.base
            .cfg
            .in_index
            .iter()
            .map(|i| pairs[if *i < 0 { pairs.len() as i64 + i } else { *i } as usize])
            .collect()
    }
}

impl BaseHead for DptHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let x: Vec<Tensor> = {
            let reassembled: Vec<Tensor> = self
                .selected_pairs(features)
                .into_iter()
                .enumerate()
                .map(|(i, (x, cls))| self.reassemble_blocks.forward_one(i, x, cls, training))
                .collect();
            self.convs
                .iter()
                .zip(&reassembled)
                .map(|(conv, feature)| conv.forward(feature, training))
                .collect()
        };
        let n = x.len();
        let mut out = self.fusion_blocks[0].forward(&x[n - 1], None, training);
        for (i, block) in self.fusion_blocks.iter().enumerate().skip(1) {
            out = block.forward(&out, Some(&x[n - 1 - i]), training);
        }
        let out = self.project.forward(&out, training);
        self.base.cls_seg(out, training)
    }
}

#[cfg(test)]
#[path = "dpt_head_tests.rs"]
mod tests;
