//! DDRNet's backbone, as MMSeg's `mmseg/models/backbones/ddrnet.py` builds
//! it: a stem to 1/8, then two branches, a high-resolution spatial branch
//! (1/8) and a low-resolution context branch (1/16 to 1/64), exchanging
//! features twice (bilateral fusion), the context branch ending in a DAPPM.
//!
//! Hong et al., "Deep Dual-resolution Networks for Real-time and Accurate
//! Semantic Segmentation of Road Scenes", arXiv:2101.06085.
//!
//! In training it returns `(temp_context, x_s + x_c)`: a copy of the
//! spatial branch after the first fusion (what DDRHead's auxiliary head
//! classifies) and the sum of both branches; in inference the sum alone.
//! `self.relu` (and the stem's two ReLUs) are `nn.ReLU()`, not in place.

use super::Backbone;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::basic_block::{
    BlockArgs, BlockKind, BranchStem, Downsample, DownsampleStyle, ResBlock, ResLayer,
};
use crate::models::layers::ppm::Pappm;
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/ddrnet.py";

/// The registry's constructor (`BACKBONES` row `DDRNet`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = DdrNetCfg::from_cfg(cfg)?;
    Ok(Box::new(DdrNet::new(p, &cfg)))
}

/// `DDRNet(in_channels=3, channels=32, ppm_channels=128,
/// align_corners=False, norm_cfg=dict(type='BN', requires_grad=True),
/// act_cfg=dict(type='ReLU', inplace=True), init_cfg=None)`.
#[derive(Debug, Clone, PartialEq)]
pub struct DdrNetCfg {
    pub in_channels: i64,
    pub channels: i64,
    pub ppm_channels: i64,
    pub align_corners: bool,
    pub norm: NormCfg,
    /// `act_cfg`: a ReLU (`true`) or `None`.
    pub relu: bool,
}

impl DdrNetCfg {
    pub fn from_cfg(d: &Dict) -> Result<DdrNetCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "DDRNet", SOURCE);
        let norm = c.batch_norm_or_bn("norm_cfg")?.ok_or_else(|| {
            c.unsupported("norm_cfg", "None (build_norm_layer needs a norm dict)")
        })?;
        let cfg = DdrNetCfg {
            in_channels: c.int("in_channels", 3)?,
            channels: c.int("channels", 32)?,
            ppm_channels: c.int("ppm_channels", 128)?,
            align_corners: c.flag("align_corners", false),
            norm,
            relu: c.relu_or_none("act_cfg", true)?,
        };
        // init_cfg only loads weights.
        c.inert(&["init_cfg"]);
        c.finish()?;
        Ok(cfg)
    }
}

/// `_make_layer(block, inplanes, planes, num_blocks, stride)`: a
/// `downsample` (`nn.Sequential(nn.Conv2d, norm)`) on the first block when
/// the stride or the channels change; the first block takes the blocks'
/// default norm and final activation, the others the backbone's `norm_cfg`
/// and its `act_cfg` (none after the last).
fn make_layer(
    p: &mut ParamScope,
    c: &DdrNetCfg,
    kind: BlockKind,
    inplanes: i64,
    planes: i64,
    num_blocks: i64,
    stride: i64,
) -> ResLayer {
    let out = planes * kind.expansion();
    let norm = c.norm;
    let downsample = move |p: &mut ParamScope| {
        Downsample::new(p, DownsampleStyle::ConvNorm, inplanes, out, stride, &norm)
    };
    let needs_downsample = stride != 1 || inplanes != out;
    let first = BlockArgs {
        in_channels: inplanes,
        channels: planes,
        stride,
        norm: NormCfg::BN_DEFAULT,
        act_out: kind.default_act_out(),
    };
    let mut blocks = vec![ResBlock::new(
        &mut p.sub(0),
        kind,
        &first,
        needs_downsample.then_some(&downsample as &dyn Fn(&mut ParamScope) -> Downsample),
    )];
    for i in 1..num_blocks {
        let args = BlockArgs {
            in_channels: out,
            channels: planes,
            stride: 1,
            norm: c.norm,
            act_out: i != num_blocks - 1 && c.relu,
        };
        blocks.push(ResBlock::new(&mut p.sub(i), kind, &args, None));
    }
    ResLayer::new(blocks)
}

pub struct DdrNet {
    stem: BranchStem,
    context_branch_layers: Vec<ResLayer>,
    compression_1: ConvModule,
    down_1: ConvModule,
    compression_2: ConvModule,
    down_2: [ConvModule; 2],
    spatial_branch_layers: Vec<ResLayer>,
    spp: Pappm,
    align_corners: bool,
}

impl DdrNet {
    pub fn new(p: &mut ParamScope, c: &DdrNetCfg) -> DdrNet {
        let ch = c.channels;
        let norm = Some(c.norm);
        let stem = BranchStem::new(
            &mut p.sub("stem"),
            (c.in_channels, ch),
            (c.norm, c.relu),
            |p, (from, to), stride| make_layer(p, c, BlockKind::Basic, from, to, 2, stride),
        );
        let context_branch_layers = (0..3)
            .map(|i| {
                let kind = if i < 2 {
                    BlockKind::Basic
                } else {
                    BlockKind::Bottleneck
                };
                let planes = if i > 0 { ch * 8 } else { ch * 4 };
                let blocks = if i < 2 { 2 } else { 1 };
                let mut lp = p.sub("context_branch_layers");
                make_layer(&mut lp.sub(i), c, kind, ch << (i + 1), planes, blocks, 2)
            })
            .collect();
        let conv = |p: &mut ParamScope, name: &str, spec: ConvSpec, relu: bool| {
            ConvModule::new(&mut p.sub(name), spec, norm, relu)
        };
        let s2 = |from: i64, to: i64| ConvSpec::new(from, to, 3).stride(2).padding(1);
        let compression_1 = conv(p, "compression_1", ConvSpec::new(ch * 4, ch * 2, 1), false);
        let down_1 = conv(p, "down_1", s2(ch * 2, ch * 4), false);
        let compression_2 = conv(p, "compression_2", ConvSpec::new(ch * 8, ch * 2, 1), false);
        let down_2 = [
            conv(&mut p.sub("down_2"), "0", s2(ch * 2, ch * 4), c.relu),
            conv(&mut p.sub("down_2"), "1", s2(ch * 4, ch * 8), false),
        ];
        let spatial_branch_layers = (0..3)
            .map(|i| {
                let kind = if i < 2 {
                    BlockKind::Basic
                } else {
                    BlockKind::Bottleneck
                };
                let blocks = if i < 2 { 2 } else { 1 };
                let mut lp = p.sub("spatial_branch_layers");
                make_layer(&mut lp.sub(i), c, kind, ch * 2, ch * 2, blocks, 1)
            })
            .collect();
        let spp = Pappm::new(&mut p.sub("spp"), ch * 16, c.ppm_channels, ch * 4, 5, false);
        DdrNet {
            stem,
            context_branch_layers,
            compression_1,
            down_1,
            compression_2,
            down_2,
            spatial_branch_layers,
            spp,
            align_corners: c.align_corners,
        }
    }
}

impl Backbone for DdrNet {
    /// Stages 3 to 5 as the Python writes them: in-place sums, `comp_c`
    /// and the stem's output alive to the end, the old branch tensors
    /// released as each is rebound.
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let out_size = (x.size()[2] / 8, x.size()[3] / 8);
        let ac = self.align_corners;
        let x = self.stem.forward(x, training); // [B, 2ch, H/8, W/8]
                                                // stage 3
        let mut x_c = self.context_branch_layers[0].forward(&x, training); // [B, 4ch, H/16, W/16]
        let mut x_s = self.spatial_branch_layers[0].forward(&x, training); // [B, 2ch, H/8, W/8]
        let mut comp_c = self.compression_1.forward(&x_c.relu(), training);
        let _ = x_c.g_add_(&self.down_1.forward(&x_s.relu(), training));
        let _ = x_s.g_add_(&resize_bilinear(&comp_c, out_size, ac));
        let temp_context = training.then(|| x_s.copy());
        // stage 4
        x_c = self.context_branch_layers[1].forward(&x_c.relu(), training); // [B, 8ch, H/32, W/32]
        x_s = self.spatial_branch_layers[1].forward(&x_s.relu(), training);
        comp_c = self.compression_2.forward(&x_c.relu(), training);
        let down = self.down_2[0].forward(&x_s.relu(), training);
        let _ = x_c.g_add_(&self.down_2[1].forward(&down, training));
        drop(down);
        let _ = x_s.g_add_(&resize_bilinear(&comp_c, out_size, ac));
        // stage 5
        x_s = self.spatial_branch_layers[2].forward(&x_s.relu(), training); // [B, 4ch, H/8, W/8]
        x_c = self.context_branch_layers[2].forward(&x_c.relu(), training); // [B, 16ch, H/64, W/64]
        x_c = {
            let _part = crate::models::scope::enter("spp");
            self.spp.forward(&x_c, training) // [B, 4ch, H/64, W/64]
        };
        x_c = resize_bilinear(&x_c, out_size, ac); // [B, 4ch, H/8, W/8]
        let out = &x_s + &x_c;
        drop((x, comp_c));
        match temp_context {
            Some(temp) => vec![temp, out],
            None => vec![out],
        }
    }
}

#[cfg(test)]
#[path = "ddrnet_tests.rs"]
mod tests;
