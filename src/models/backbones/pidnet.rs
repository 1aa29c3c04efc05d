//! PIDNet's backbone, as MMSeg's `mmseg/models/backbones/pidnet.py` builds
//! it: a stem to 1/8, then three branches, a detailed P(roportional)
//! branch at 1/8, a context I(ntegral) branch down to 1/64 ending in a
//! PAPPM (DAPPM for PIDNet-L), and a boundary D(erivative) branch at 1/8;
//! the I branch guides the P branch through pixel-attention fusion
//! (`PagFM`) and feeds the D branch its differences (`diff_1`, `diff_2`),
//! and a boundary-attention fusion (`LightBag`, `Bag` for PIDNet-L) merges
//! the three.
//!
//! Xu et al., "PIDNet: A Real-time Semantic Segmentation Network Inspired
//! by PID Controllers", CVPR 2023, arXiv:2206.02066.
//!
//! In training it returns `(temp_p, out, temp_d)`: copies of the P branch
//! after its first fusion and of the D branch after its second (PIDHead's
//! semantic and boundary heads take them) and the fused map; in inference
//! the fused map alone. `self.relu` and the stem's two ReLUs are
//! `nn.ReLU()`, not in place.

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

const SOURCE: &str = "mmseg/models/backbones/pidnet.py";

/// The norm of what PIDNet builds without passing its `norm_cfg` (the
/// blocks of `_make_layer`, `PagFM`): `dict(type='BN')`.
const BN: NormCfg = NormCfg::BN_DEFAULT;

/// The registry's constructor (`BACKBONES` row `PIDNet`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = PidNetCfg::from_cfg(cfg)?;
    Ok(Box::new(PidNet::new(p, &cfg)))
}

/// `PIDNet(in_channels=3, channels=64, ppm_channels=96, num_stem_blocks=2,
/// num_branch_blocks=3, align_corners=False, norm_cfg=dict(type='BN'),
/// act_cfg=dict(type='ReLU', inplace=True), init_cfg=None, **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct PidNetCfg {
    pub in_channels: i64,
    pub channels: i64,
    pub ppm_channels: i64,
    pub num_stem_blocks: i64,
    pub num_branch_blocks: i64,
    pub align_corners: bool,
    pub norm: NormCfg,
    /// `act_cfg`: a ReLU (`true`) or `None`.
    pub relu: bool,
}

impl PidNetCfg {
    pub fn from_cfg(d: &Dict) -> Result<PidNetCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "PIDNet", SOURCE);
        let norm = c.batch_norm_or_bn("norm_cfg")?.ok_or_else(|| {
            c.unsupported(
                "norm_cfg",
                "None (the downsample ConvModules need a norm dict)",
            )
        })?;
        let cfg = PidNetCfg {
            in_channels: c.int("in_channels", 3)?,
            channels: c.int("channels", 64)?,
            ppm_channels: c.int("ppm_channels", 96)?,
            num_stem_blocks: c.int("num_stem_blocks", 2)?,
            num_branch_blocks: c.int("num_branch_blocks", 3)?,
            align_corners: c.flag("align_corners", false),
            norm,
            relu: c.relu_or_none("act_cfg", true)?,
        };
        if cfg.num_stem_blocks < 1 || cfg.num_branch_blocks < 1 {
            // nn.Sequential of no blocks would pass its input through; the
            // first block is always built, so MMSeg never gives that.
            return Err(c.config_error("num_stem_blocks and num_branch_blocks must be at least 1"));
        }
        // init_cfg only loads weights. PIDNet takes **kwargs and drops them;
        // segtune refuses any other key by name.
        c.inert(&["init_cfg"]);
        c.finish()?;
        Ok(cfg)
    }
}

/// A `downsample` ConvModule (`ConvModule(in, out, 1, stride, norm_cfg,
/// act_cfg=None)`) on the first block when the stride or channels change.
fn downsample_of(
    kind: BlockKind,
    in_channels: i64,
    channels: i64,
    stride: i64,
    norm: NormCfg,
) -> Option<impl Fn(&mut ParamScope) -> Downsample> {
    let out = channels * kind.expansion();
    (stride != 1 || in_channels != out).then_some(move |p: &mut ParamScope| {
        Downsample::new(p, DownsampleStyle::Module, in_channels, out, stride, &norm)
    })
}

/// `_make_layer(block, in_channels, channels, num_blocks, stride)`: the
/// first block with its defaults (and the downsample), the others with
/// `act_cfg_out=None if last else act_cfg`; every block's norm is its
/// default BN.
fn make_layer(
    p: &mut ParamScope,
    c: &PidNetCfg,
    kind: BlockKind,
    (in_channels, channels): (i64, i64),
    num_blocks: i64,
    stride: i64,
) -> ResLayer {
    let downsample = downsample_of(kind, in_channels, channels, stride, c.norm);
    let first = BlockArgs {
        in_channels,
        channels,
        stride,
        norm: BN,
        act_out: kind.default_act_out(),
    };
    let ds = downsample
        .as_ref()
        .map(|d| d as &dyn Fn(&mut ParamScope) -> Downsample);
    let mut blocks = vec![ResBlock::new(&mut p.sub(0), kind, &first, ds)];
    for i in 1..num_blocks {
        let args = BlockArgs {
            in_channels: channels * kind.expansion(),
            channels,
            stride: 1,
            norm: BN,
            act_out: i != num_blocks - 1 && c.relu,
        };
        blocks.push(ResBlock::new(&mut p.sub(i), kind, &args, None));
    }
    ResLayer::new(blocks)
}

/// `_make_single_layer(block, in_channels, channels)`: one block without
/// a final activation.
fn make_single_layer(
    p: &mut ParamScope,
    c: &PidNetCfg,
    kind: BlockKind,
    in_channels: i64,
    channels: i64,
) -> ResLayer {
    let downsample = downsample_of(kind, in_channels, channels, 1, c.norm);
    let args = BlockArgs {
        in_channels,
        channels,
        stride: 1,
        norm: BN,
        act_out: false,
    };
    let ds = downsample
        .as_ref()
        .map(|d| d as &dyn Fn(&mut ParamScope) -> Downsample);
    ResLayer::new(vec![ResBlock::new(p, kind, &args, ds)])
}

/// `d_branch_layers` and `channel_expand`: for PIDNet-S/M (`light`) a
/// BasicBlock to `channels` and a Bottleneck (expand 1), else two
/// BasicBlocks at `2 * channels` (expand 2); then the Bottleneck appended
/// at the end of `__init__` (the state dict lists it with the ModuleList,
/// before `diff_1`).
fn d_branch(p: &mut ParamScope, c: &PidNetCfg, light: bool) -> (Vec<ResLayer>, i64) {
    let ch = c.channels;
    let (mut layers, expand) = if light {
        let first = make_single_layer(&mut p.sub(0), c, BlockKind::Basic, ch * 2, ch);
        let second = make_layer(&mut p.sub(1), c, BlockKind::Bottleneck, (ch, ch), 1, 1);
        (vec![first, second], 1)
    } else {
        let layers = (0..2)
            .map(|i| make_single_layer(&mut p.sub(i), c, BlockKind::Basic, ch * 2, ch * 2))
            .collect();
        (layers, 2)
    };
    let pair = (ch * 2, ch * 2);
    layers.push(make_layer(
        &mut p.sub(2),
        c,
        BlockKind::Bottleneck,
        pair,
        1,
        1,
    ));
    (layers, expand)
}

/// `PagFM(in_channels, channels)`: pixel-attention-guided fusion of the P
/// branch with the I branch (`after_relu=False`, `with_channel=False`,
/// bilinear upsampling without aligned corners).
struct PagFm {
    f_i: ConvModule,
    f_p: ConvModule,
}

impl PagFm {
    fn new(p: &mut ParamScope, in_channels: i64, channels: i64) -> PagFm {
        let spec = ConvSpec::new(in_channels, channels, 1);
        PagFm {
            f_i: ConvModule::new(&mut p.sub("f_i"), spec, Some(BN), false),
            f_p: ConvModule::new(&mut p.sub("f_p"), spec, Some(BN), false),
        }
    }

    /// `x_p` `[B, C, h, w]`, `x_i` `[B, C, h', w']` -> `[B, C, h, w]`.
    fn forward(&self, x_p: &Tensor, x_i: &Tensor, training: bool) -> Tensor {
        let size = (x_p.size()[2], x_p.size()[3]);
        let f_i = resize_bilinear(&self.f_i.forward(x_i, training), size, false);
        let f_p = self.f_p.forward(x_p, training);
        // torch.sum(f_p * f_i, dim=1): the product dies once summed.
        let summed = (&f_p * &f_i).sum_dim_intlist(1, false, None);
        let sigma = summed.unsqueeze(1).sigmoid(); // [B, 1, h, w]
        drop(summed);
        let x_i = resize_bilinear(x_i, size, false);
        let out = &sigma * &x_i + sigma.rsub_scalar(1) * x_p;
        drop((f_i, f_p, x_i));
        out
    }
}

/// The D branch's fusion of the three: `LightBag` (two 1x1 ConvModules,
/// PIDNet-S/M) or `Bag` (one 3x3 `order=('norm', 'act', 'conv')`
/// ConvModule, PIDNet-L).
enum Dfm {
    LightBag { f_p: ConvModule, f_i: ConvModule },
    Bag { conv: ConvModule },
}

impl Dfm {
    fn new(p: &mut ParamScope, light: bool, channels: i64, c: &PidNetCfg) -> Dfm {
        if light {
            let spec = ConvSpec::new(channels, channels, 1);
            return Dfm::LightBag {
                f_p: ConvModule::new(&mut p.sub("f_p"), spec, Some(c.norm), false),
                f_i: ConvModule::new(&mut p.sub("f_i"), spec, Some(c.norm), false),
            };
        }
        let spec = ConvSpec::new(channels, channels, 3).padding(1);
        Dfm::Bag {
            conv: ConvModule::norm_act_conv(&mut p.sub("conv"), spec, c.norm, c.relu),
        }
    }

    fn forward(&self, x_p: &Tensor, x_i: &Tensor, x_d: &Tensor, training: bool) -> Tensor {
        let sigma = x_d.sigmoid();
        match self {
            Dfm::LightBag { f_p, f_i } => {
                let f_p = f_p.forward(&(sigma.rsub_scalar(1) * x_i + x_p), training);
                let f_i = f_i.forward(&(x_i + &sigma * x_p), training);
                f_p + f_i
            }
            Dfm::Bag { conv } => {
                conv.forward(&(&sigma * x_p + sigma.rsub_scalar(1) * x_i), training)
            }
        }
    }
}

pub struct PidNet {
    stem: BranchStem,
    i_branch_layers: Vec<ResLayer>,
    p_branch_layers: Vec<ResLayer>,
    compression_1: ConvModule,
    compression_2: ConvModule,
    pag_1: PagFm,
    pag_2: PagFm,
    d_branch_layers: Vec<ResLayer>,
    diff_1: ConvModule,
    diff_2: ConvModule,
    spp: Pappm,
    dfm: Dfm,
    align_corners: bool,
}

impl PidNet {
    pub fn new(p: &mut ParamScope, c: &PidNetCfg) -> PidNet {
        let ch = c.channels;
        let stem = BranchStem::new(
            &mut p.sub("stem"),
            (c.in_channels, ch),
            (c.norm, c.relu),
            |p, io, stride| make_layer(p, c, BlockKind::Basic, io, c.num_stem_blocks, stride),
        );
        let kind = |i: i64| {
            if i < 2 {
                BlockKind::Basic
            } else {
                BlockKind::Bottleneck
            }
        };
        let i_branch_layers = (0..3)
            .map(|i| {
                let planes = if i > 0 { ch * 8 } else { ch * 4 };
                let blocks = if i < 2 { c.num_branch_blocks } else { 2 };
                let mut lp = p.sub("i_branch_layers");
                make_layer(
                    &mut lp.sub(i),
                    c,
                    kind(i),
                    (ch << (i + 1), planes),
                    blocks,
                    2,
                )
            })
            .collect();
        let p_branch_layers = (0..3)
            .map(|i| {
                let blocks = if i < 2 { c.num_stem_blocks } else { 1 };
                let mut lp = p.sub("p_branch_layers");
                make_layer(&mut lp.sub(i), c, kind(i), (ch * 2, ch * 2), blocks, 1)
            })
            .collect();
        let conv = |p: &mut ParamScope, name: &str, spec: ConvSpec| {
            ConvModule::with_conv_bias(&mut p.sub(name), spec, Some(c.norm), false, false)
        };
        let compression_1 = conv(p, "compression_1", ConvSpec::new(ch * 4, ch * 2, 1));
        let compression_2 = conv(p, "compression_2", ConvSpec::new(ch * 8, ch * 2, 1));
        let pag_1 = PagFm::new(&mut p.sub("pag_1"), ch * 2, ch);
        let pag_2 = PagFm::new(&mut p.sub("pag_2"), ch * 2, ch);
        // PIDNet-S/M (two stem blocks): a lighter D branch, PAPPM, LightBag.
        let light = c.num_stem_blocks == 2;
        let (d_branch_layers, channel_expand) = d_branch(&mut p.sub("d_branch_layers"), c, light);
        let spec3 = |from: i64, to: i64| ConvSpec::new(from, to, 3).padding(1);
        let diff_1 = conv(p, "diff_1", spec3(ch * 4, ch * channel_expand));
        let diff_2 = conv(p, "diff_2", spec3(ch * 8, ch * 2));
        let spp = Pappm::new(&mut p.sub("spp"), ch * 16, c.ppm_channels, ch * 4, 5, light);
        let dfm = Dfm::new(&mut p.sub("dfm"), light, ch * 4, c);
        PidNet {
            stem,
            i_branch_layers,
            p_branch_layers,
            compression_1,
            compression_2,
            pag_1,
            pag_2,
            d_branch_layers,
            diff_1,
            diff_2,
            spp,
            dfm,
            align_corners: c.align_corners,
        }
    }
}

impl Backbone for PidNet {
    /// Stages 3 to 5 as the Python writes them: the stem's output and
    /// each stage's `diff_i` alive until rebound (the last to the end), the
    /// D branch's sums in place, the old branch tensors released as each
    /// is rebound.
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let out_size = (x.size()[2] / 8, x.size()[3] / 8);
        let ac = self.align_corners;
        let x = self.stem.forward(x, training); // [B, 2ch, H/8, W/8]
                                                // stage 3
        let mut x_i = self.i_branch_layers[0].forward(&x, training).relu(); // [B, 4ch, H/16, W/16]
        let mut x_p = self.p_branch_layers[0].forward(&x, training); // [B, 2ch, H/8, W/8]
        let mut x_d = self.d_branch_layers[0].forward(&x, training); // [B, ch * expand, H/8, W/8]
        let mut comp_i = self.compression_1.forward(&x_i, training);
        x_p = self.pag_1.forward(&x_p, &comp_i, training);
        let mut diff_i = self.diff_1.forward(&x_i, training);
        let _ = x_d.g_add_(&resize_bilinear(&diff_i, out_size, ac));
        let temp_p = training.then(|| x_p.copy());
        // stage 4
        x_i = self.i_branch_layers[1].forward(&x_i, training).relu(); // [B, 8ch, H/32, W/32]
        x_p = self.p_branch_layers[1].forward(&x_p.relu(), training);
        x_d = self.d_branch_layers[1].forward(&x_d.relu(), training); // [B, 2ch, H/8, W/8]
        comp_i = self.compression_2.forward(&x_i, training);
        x_p = self.pag_2.forward(&x_p, &comp_i, training);
        diff_i = self.diff_2.forward(&x_i, training);
        let _ = x_d.g_add_(&resize_bilinear(&diff_i, out_size, ac));
        let temp_d = training.then(|| x_d.copy());
        // stage 5
        x_i = self.i_branch_layers[2].forward(&x_i, training); // [B, 16ch, H/64, W/64]
        x_p = self.p_branch_layers[2].forward(&x_p.relu(), training); // [B, 4ch, H/8, W/8]
        x_d = self.d_branch_layers[2].forward(&x_d.relu(), training); // [B, 4ch, H/8, W/8]
        x_i = {
            let _part = crate::models::scope::enter("spp");
            self.spp.forward(&x_i, training) // [B, 4ch, H/64, W/64]
        };
        x_i = resize_bilinear(&x_i, out_size, ac); // [B, 4ch, H/8, W/8]
        let out = self.dfm.forward(&x_p, &x_i, &x_d, training);
        drop((x, comp_i, diff_i, x_i, x_p, x_d));
        match (temp_p, temp_d) {
            (Some(temp_p), Some(temp_d)) => vec![temp_p, out, temp_d],
            _ => vec![out],
        }
    }
}

#[cfg(test)]
#[path = "pidnet_tests.rs"]
mod tests;
