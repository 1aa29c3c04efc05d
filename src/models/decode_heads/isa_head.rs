//! `ISAHead`, the interlaced sparse self-attention head, as MMSeg's
//! `mmseg/models/decode_heads/isa_head.py` builds it.
//!
//! Huang et al., "Interlaced Sparse Self-Attention for Semantic
//! Segmentation", arXiv:1907.12273.
//!
//! After a 3x3 ConvModule the map is cut into `down_factor` local groups
//! (padded to a multiple of it): a global relation attends across the
//! groups at each position within them, a local relation within each
//! group; the result is concatenated with the input of the relations and
//! fused by a 1x1 ConvModule.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::self_attention_block::{SelfAttentionBlock, SelfAttentionBlockCfg};
use crate::models::layers::{ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/isa_head.py";

/// The registry's constructor (`DECODE_HEADS` row `ISAHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "ISAHead", SOURCE);
    c.require("isa_channels")?;
    let isa_channels = c.int("isa_channels", 0)?;
    let down_factor = c.ints("down_factor", &[8, 8])?;
    if down_factor.len() != 2 || down_factor.iter().any(|&f| f <= 0) {
        return Err(c.config_error(format!(
            "down_factor must be two positive ints, not {down_factor:?}"
        )));
    }
    let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
    c.finish()?;
    Ok(Box::new(IsaHead::new(
        p,
        head,
        isa_channels,
        (down_factor[0], down_factor[1]),
    )))
}

/// ISA's `SelfAttentionBlock`: two ConvModules for key and query, a plain
/// value conv, `matmul_norm`, then `output_project`, a 1x1 ConvModule.
struct Relation {
    attention: SelfAttentionBlock,
    output_project: ConvModule,
}

impl Relation {
    fn new(p: &mut ParamScope, in_channels: i64, channels: i64, norm: Option<NormCfg>) -> Relation {
        let attention = SelfAttentionBlock::new(
            p,
            &SelfAttentionBlockCfg {
                key_query_num_convs: 2,
                key_query_norm: true,
                matmul_norm: true,
                norm,
                relu: true,
                ..SelfAttentionBlockCfg::plain(in_channels, channels)
            },
        );
        let output_project = ConvModule::new(
            &mut p.sub("output_project"),
            ConvSpec::new(in_channels, in_channels, 1),
            norm,
            true,
        );
        Relation {
            attention,
            output_project,
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let context = self.attention.forward(x, x, None, None, training);
        self.output_project.forward(&context, training)
    }
}

pub struct IsaHead {
    base: DecodeHeadBase,
    in_conv: ConvModule,
    global_relation: Relation,
    local_relation: Relation,
    out_conv: ConvModule,
    down_factor: (i64, i64),
}

impl IsaHead {
    pub fn new(
        p: &mut ParamScope,
        head: DecodeHeadCfg,
        isa_channels: i64,
        down_factor: (i64, i64),
    ) -> IsaHead {
        let (channels, norm) = (head.channels, head.norm);
        let in_channels: i64 = head.in_channels.iter().sum();
        let base = DecodeHeadBase::new(p, head);
        let in_conv = ConvModule::new(
            &mut p.sub("in_conv"),
            ConvSpec::new(in_channels, channels, 3).padding(1),
            norm,
            true,
        );
        let global_relation =
            Relation::new(&mut p.sub("global_relation"), channels, isa_channels, norm);
        let local_relation =
            Relation::new(&mut p.sub("local_relation"), channels, isa_channels, norm);
        let out_conv = ConvModule::new(
            &mut p.sub("out_conv"),
            ConvSpec::new(channels * 2, channels, 1),
            norm,
            true,
        );
        IsaHead {
            base,
            in_conv,
            global_relation,
            local_relation,
            out_conv,
            down_factor,
        }
    }
}

impl BaseHead for IsaHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let x_ = self.base.transform_inputs(features);
        let residual = self.in_conv.forward(&x_, training); // [B, C, h, w]
        let s = residual.size();
        let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
        let (loc_h, loc_w) = self.down_factor;
        let (glb_h, glb_w) = ((h + loc_h - 1) / loc_h, (w + loc_w - 1) / loc_w);
        let (pad_h, pad_w) = (glb_h * loc_h - h, glb_w * loc_w - w);
        let padded = pad_h > 0 || pad_w > 0;
        // Python rebinds `x` at each step: the tensor before dies unless
        // autograd saved it.
        let mut x = if padded {
            residual.constant_pad_nd([pad_w / 2, pad_w - pad_w / 2, pad_h / 2, pad_h - pad_h / 2])
        } else {
            residual.shallow_clone()
        };
        x = x
            .view([n, c, glb_h, loc_h, glb_w, loc_w])
            .permute([0, 3, 5, 1, 2, 4]) // [n, loc_h, loc_w, c, glb_h, glb_w]
            .reshape([-1, c, glb_h, glb_w]);
        x = self.global_relation.forward(&x, training);
        x = x
            .view([n, loc_h, loc_w, c, glb_h, glb_w])
            .permute([0, 4, 5, 3, 1, 2]) // [n, glb_h, glb_w, c, loc_h, loc_w]
            .reshape([-1, c, loc_h, loc_w]);
        x = self.local_relation.forward(&x, training);
        x = x
            .view([n, glb_h, glb_w, c, loc_h, loc_w])
            .permute([0, 3, 1, 4, 2, 5]) // [n, c, glb_h, loc_h, glb_w, loc_w]
            .reshape([n, c, glb_h * loc_h, glb_w * loc_w]);
        if padded {
            x = x.narrow(2, pad_h / 2, h).narrow(3, pad_w / 2, w);
        }
        let cat = Tensor::cat(&[&x, &residual], 1);
        drop(x);
        let fused = self.out_conv.forward(&cat, training);
        drop(cat);
        self.base.cls_seg(fused, training)
    }
}

#[cfg(test)]
#[path = "isa_head_tests.rs"]
mod tests;
