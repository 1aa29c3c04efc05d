//! BiSeNet V2's backbone, as MMSeg's `mmseg/models/backbones/bisenetv2.py`
//! builds it: a detail branch and a semantic branch, fused by the bilateral
//! guided aggregation layer.
//!
//! Yu et al., "BiSeNet V2: Bilateral Network with Guided Aggregation for
//! Real-time Semantic Segmentation", IJCV 2021, arXiv:2004.02147.
//!
//! The detail branch is stages of strided 3x3 ConvModules (1/8); the
//! semantic branch a stem block (a strided conv, then a 1x1 + strided 3x3
//! pair beside a max pool, fused), gather-and-expansion layers (a 3x3 conv,
//! depthwise expansion, a linear 1x1 projection, plus the input or a
//! depthwise-separable shortcut, then an out-of-place ReLU) and a context
//! embedding block (a global average pool and BN, a 1x1 ConvModule, added
//! to its input, then a 3x3 ConvModule); the BGA layer gates each branch by
//! the sigmoid of the other and sums them at the detail branch's
//! resolution. Outputs: the BGA map, then each semantic stage's output but
//! the last, picked by `out_indices`. The sub-modules are built with their
//! own `dict(type='BN')` and ReLU: MMSeg does not pass BiSeNetV2's
//! `norm_cfg`, `act_cfg` or `conv_cfg` down.

use super::Backbone;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::DepthwiseSeparableConvModule;
use crate::models::layers::{resize_bilinear, BatchNorm2d, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/bisenetv2.py";

/// What every sub-module is built with (`norm_cfg=dict(type='BN')`).
const BN: Option<NormCfg> = Some(NormCfg::BN_DEFAULT);

/// The registry's constructor (`BACKBONES` row `BiSeNetV2`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = BiSeNetV2Cfg::from_cfg(cfg)?;
    Ok(Box::new(BiSeNetV2::new(p, &cfg)))
}

/// `BiSeNetV2(in_channels=3, detail_channels=(64, 64, 128),
/// semantic_channels=(16, 32, 64, 128), semantic_expansion_ratio=6,
/// bga_channels=128, out_indices=(0, 1, 2, 3, 4), align_corners=False,
/// conv_cfg=None, norm_cfg=dict(type='BN'), act_cfg=dict(type='ReLU'),
/// init_cfg=None)`.
#[derive(Debug, Clone, PartialEq)]
pub struct BiSeNetV2Cfg {
    pub in_channels: i64,
    pub detail_channels: Vec<i64>,
    pub semantic_channels: Vec<i64>,
    pub semantic_expansion_ratio: i64,
    pub bga_channels: i64,
    pub out_indices: Vec<i64>,
    pub align_corners: bool,
}

impl BiSeNetV2Cfg {
    pub fn from_cfg(d: &Dict) -> Result<BiSeNetV2Cfg, ModelError> {
        let mut c = ComponentConfig::new(d, "BiSeNetV2", SOURCE);
        let detail_channels = c.ints("detail_channels", &[64, 64, 128])?;
        let semantic_channels = c.ints("semantic_channels", &[16, 32, 64, 128])?;
        let semantic_expansion_ratio = c.int("semantic_expansion_ratio", 6)?;
        let bga_channels = c.int("bga_channels", 128)?;
        for (key, v) in [
            ("detail_channels", &detail_channels),
            ("semantic_channels", &semantic_channels),
        ] {
            if v.is_empty() || v.iter().any(|&ch| ch < 1) {
                return Err(c.config_error(format!("`{key}` must be positive channel counts")));
            }
        }
        if semantic_expansion_ratio < 1 || bga_channels < 1 {
            return Err(
                c.config_error("`semantic_expansion_ratio` and `bga_channels` must be at least 1")
            );
        }
        // outs = [x_head] + semantic_outs[:-1]: the BGA map and each
        // semantic stage's output (the CE block's is left out).
        let outputs = semantic_channels.len() as i64 + 1;
        let out_indices = c.ints("out_indices", &[0, 1, 2, 3, 4])?;
        if let Some(i) = out_indices
            .iter()
            .find(|i| !(-outputs..outputs).contains(*i))
        {
            return Err(c.config_error(format!(
                "out_indices entry {i} is not one of the {outputs} outputs (BGA, then the semantic stages)"
            )));
        }
        let cfg = BiSeNetV2Cfg {
            in_channels: c.int("in_channels", 3)?,
            detail_channels,
            semantic_channels,
            semantic_expansion_ratio,
            bga_channels,
            out_indices,
            align_corners: c.flag("align_corners", false),
        };
        // Stored by BiSeNetV2 but never passed to its modules (they take
        // their defaults); init_cfg draws weights.
        c.inert(&["norm_cfg", "act_cfg", "conv_cfg", "init_cfg"]);
        c.finish()?;
        Ok(cfg)
    }
}

/// A 3x3 ConvModule with BN and the in-place ReLU.
fn conv3x3(p: &mut ParamScope, from: i64, to: i64, stride: i64) -> ConvModule {
    let spec = ConvSpec::new(from, to, 3).stride(stride).padding(1);
    ConvModule::new(p, spec, BN, true)
}

/// Runs an `nn.Sequential` of ConvModules: each intermediate dies once the
/// next exists.
fn sequential(convs: &[ConvModule], x: &Tensor, training: bool) -> Tensor {
    let mut y = convs[0].forward(x, training);
    for conv in &convs[1..] {
        y = conv.forward(&y, training);
    }
    y
}

/// `DetailBranch`: `detail_branch.<i>`, a strided 3x3 ConvModule and one
/// (first stage) or two more 3x3 ConvModules per stage.
struct DetailBranch {
    stages: Vec<Vec<ConvModule>>,
}

impl DetailBranch {
    fn new(p: &mut ParamScope, channels: &[i64], in_channels: i64) -> DetailBranch {
        let mut bp = p.sub("detail_branch");
        let stages = channels
            .iter()
            .enumerate()
            .map(|(i, &ch)| {
                let mut sp = bp.sub(i);
                let from = if i == 0 { in_channels } else { channels[i - 1] };
                let mut stage = vec![conv3x3(&mut sp.sub(0), from, ch, 2)];
                let extra = if i == 0 { 1 } else { 2 };
                for j in 1..=extra {
                    stage.push(conv3x3(&mut sp.sub(j), ch, ch, 1));
                }
                stage
            })
            .collect();
        DetailBranch { stages }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut y = sequential(&self.stages[0], x, training); // [B, c_0, H/2, W/2]
        for stage in &self.stages[1..] {
            y = sequential(stage, &y, training); // [B, c_i, H/2^(i+1), W/2^(i+1)]
        }
        y
    }
}

/// `StemBlock`: `conv_first` (strided), then `convs` (1x1 to half the
/// channels, strided 3x3 back) beside a 3x3 max pool, concatenated and fused
/// by `fuse_last`.
struct StemBlock {
    conv_first: ConvModule,
    convs: [ConvModule; 2],
    fuse_last: ConvModule,
}

impl StemBlock {
    fn new(p: &mut ParamScope, in_channels: i64, out_channels: i64) -> StemBlock {
        let conv_first = conv3x3(&mut p.sub("conv_first"), in_channels, out_channels, 2);
        let half = out_channels / 2;
        let convs = [
            ConvModule::new(
                &mut p.sub("convs").sub(0),
                ConvSpec::new(out_channels, half, 1),
                BN,
                true,
            ),
            conv3x3(&mut p.sub("convs").sub(1), half, out_channels, 2),
        ];
        let fuse_last = conv3x3(&mut p.sub("fuse_last"), out_channels * 2, out_channels, 1);
        StemBlock {
            conv_first,
            convs,
            fuse_last,
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let x = self.conv_first.forward(x, training); // [B, C, H/2, W/2]
        let x_left = sequential(&self.convs, &x, training); // [B, C, H/4, W/4]
        let x_right = x.max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false); // [B, C, H/4, W/4]
                                                                           // The concatenation lives until fuse_last returns; the locals until
                                                                           // the block returns.
        self.fuse_last
            .forward(&Tensor::cat(&[&x_left, &x_right], 1), training) // [B, C, H/4, W/4]
    }
}

/// `GELayer`: `conv1`, `dwconv` (one depthwise ConvModule, or at stride 2 a
/// strided linear one and a second with ReLU), `shortcut` (at stride 2: a
/// depthwise-separable conv, both parts with BN and no ReLU), `conv2` (the
/// linear 1x1 projection), then `act`, an out-of-place ReLU.
struct GeLayer {
    conv1: ConvModule,
    dwconv: Vec<ConvModule>,
    shortcut: Option<DepthwiseSeparableConvModule>,
    conv2: ConvModule,
}

impl GeLayer {
    fn new(
        p: &mut ParamScope,
        in_channels: i64,
        out_channels: i64,
        exp_ratio: i64,
        stride: i64,
    ) -> GeLayer {
        let mid = in_channels * exp_ratio;
        let conv1 = conv3x3(&mut p.sub("conv1"), in_channels, in_channels, 1);
        let depthwise = |from: i64, stride: i64| {
            ConvSpec::new(from, mid, 3)
                .stride(stride)
                .padding(1)
                .groups(from)
        };
        let mut dp = p.sub("dwconv");
        let (dwconv, shortcut) = if stride == 1 {
            let dw = ConvModule::new(&mut dp.sub(0), depthwise(in_channels, stride), BN, true);
            (vec![dw], None)
        } else {
            let dwconv = vec![
                ConvModule::new(&mut dp.sub(0), depthwise(in_channels, stride), BN, false),
                ConvModule::new(&mut dp.sub(1), depthwise(mid, 1), BN, true),
            ];
            let shortcut = DepthwiseSeparableConvModule::with_parts(
                &mut p.sub("shortcut").sub(0),
                ConvSpec::new(in_channels, out_channels, 3)
                    .stride(stride)
                    .padding(1),
                (BN, false),
                (BN, false),
            );
            (dwconv, Some(shortcut))
        };
        let conv2 = ConvModule::new(
            &mut p.sub("conv2").sub(0),
            ConvSpec::new(mid, out_channels, 1),
            BN,
            false,
        );
        GeLayer {
            conv1,
            dwconv,
            shortcut,
            conv2,
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let y = self.conv1.forward(x, training); // [B, C_in, h, w]
        let y = sequential(&self.dwconv, &y, training); // [B, C_in * exp, h / s, w / s]
        let y = self.conv2.forward(&y, training); // [B, C_out, h / s, w / s]
        let (sum, shortcut) = match &self.shortcut {
            Some(s) => {
                let shortcut = s.forward(x, training); // [B, C_out, h / 2, w / 2]
                (y + &shortcut, Some(shortcut))
            }
            None => (y + x, None),
        };
        // nn.ReLU() (inplace=False); the sum dies at the rebinding, the
        // shortcut when the layer returns.
        let out = sum.relu();
        drop((sum, shortcut));
        out
    }
}

/// `CEBlock`: `gap` (a global average pool, then `gap.1`, a BN),
/// `conv_gap` (1x1), added to the input, then `conv_last` (3x3).
struct CeBlock {
    gap_bn: BatchNorm2d,
    conv_gap: ConvModule,
    conv_last: ConvModule,
}

impl CeBlock {
    fn new(p: &mut ParamScope, in_channels: i64, out_channels: i64) -> CeBlock {
        CeBlock {
            gap_bn: BatchNorm2d::from_cfg(
                &mut p.sub("gap").sub(1),
                in_channels,
                &NormCfg::BN_DEFAULT,
            ),
            conv_gap: ConvModule::new(
                &mut p.sub("conv_gap"),
                ConvSpec::new(in_channels, out_channels, 1),
                BN,
                true,
            ),
            conv_last: conv3x3(&mut p.sub("conv_last"), out_channels, out_channels, 1),
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let gap = {
            let pooled = x.adaptive_avg_pool2d([1, 1]); // [B, C, 1, 1]
            self.gap_bn.forward(&pooled, training)
        };
        let gap = self.conv_gap.forward(&gap, training); // [B, C, 1, 1]
        let sum = x + gap; // [B, C, h, w]
        self.conv_last.forward(&sum, training)
    }
}

/// `SemanticBranch`: `stage1` (the stem), `stage2..` (GE layers: a strided
/// one and one more, four in the last stage), `stage<n>_CEBlock`.
struct SemanticBranch {
    stem: StemBlock,
    stages: Vec<Vec<GeLayer>>,
    ce: CeBlock,
}

impl SemanticBranch {
    fn new(
        p: &mut ParamScope,
        channels: &[i64],
        in_channels: i64,
        exp_ratio: i64,
    ) -> SemanticBranch {
        let stem = StemBlock::new(&mut p.sub("stage1"), in_channels, channels[0]);
        let last = channels.len() - 1;
        let stages = (1..channels.len())
            .map(|i| {
                let mut sp = p.sub(format!("stage{}", i + 1));
                let (from, to) = (channels[i - 1], channels[i]);
                let mut layers = vec![GeLayer::new(&mut sp.sub(0), from, to, exp_ratio, 2)];
                let more = if i == last { 3 } else { 1 };
                for j in 1..=more {
                    layers.push(GeLayer::new(&mut sp.sub(j), to, to, exp_ratio, 1));
                }
                layers
            })
            .collect();
        let c = channels[last];
        let ce = CeBlock::new(&mut p.sub(format!("stage{}_CEBlock", channels.len())), c, c);
        SemanticBranch { stem, stages, ce }
    }

    /// Each stage's output, the CE block's last.
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut outs = vec![self.stem.forward(x, training)]; // [B, c_0, H/4, W/4]
        for stage in &self.stages {
            let mut y = stage[0].forward(outs.last().expect("the stem's output"), training);
            for layer in &stage[1..] {
                y = layer.forward(&y, training); // [B, c_i, H/2^(i+2), W/2^(i+2)]
            }
            outs.push(y);
        }
        let ce = self
            .ce
            .forward(outs.last().expect("the last stage's output"), training);
        outs.push(ce);
        outs
    }
}

/// `BGALayer`: `detail_dwconv` (depthwise with BN, pointwise with a bias),
/// `detail_down` (strided conv + BN, then a 3x3 average pool),
/// `semantic_conv`, `semantic_dwconv`, then `conv` on the gated sum.
struct BgaLayer {
    detail_dwconv: DepthwiseSeparableConvModule,
    detail_down: ConvModule,
    semantic_conv: ConvModule,
    semantic_dwconv: DepthwiseSeparableConvModule,
    conv: ConvModule,
    align_corners: bool,
}

impl BgaLayer {
    fn new(p: &mut ParamScope, channels: i64, align_corners: bool) -> BgaLayer {
        let spec = ConvSpec::new(channels, channels, 3).padding(1);
        let dwsep = |p: &mut ParamScope, name: &str| {
            DepthwiseSeparableConvModule::with_parts(
                &mut p.sub(name).sub(0),
                spec,
                (BN, false),
                (None, false),
            )
        };
        let detail_dwconv = dwsep(p, "detail_dwconv");
        let detail_down =
            ConvModule::new(&mut p.sub("detail_down").sub(0), spec.stride(2), BN, false);
        let semantic_conv = ConvModule::new(&mut p.sub("semantic_conv").sub(0), spec, BN, false);
        let semantic_dwconv = dwsep(p, "semantic_dwconv");
        let conv = ConvModule::new(&mut p.sub("conv"), spec, BN, true);
        BgaLayer {
            detail_dwconv,
            detail_down,
            semantic_conv,
            semantic_dwconv,
            conv,
            align_corners,
        }
    }

    fn forward(&self, x_d: &Tensor, x_s: &Tensor, training: bool) -> Tensor {
        let detail_dwconv = self.detail_dwconv.forward(x_d, training); // [B, C, h, w]
        let detail_down = {
            let y = self.detail_down.forward(x_d, training); // [B, C, h/2, w/2]
            y.avg_pool2d([3, 3], [2, 2], [1, 1], false, true, None) // [B, C, h/4, w/4]
        };
        let semantic_conv = self.semantic_conv.forward(x_s, training); // [B, C, h/4, w/4]
        let semantic_dwconv = self.semantic_dwconv.forward(x_s, training); // [B, C, h/4, w/4]
        let size = |t: &Tensor| (t.size()[2], t.size()[3]);
        // Python rebinds `semantic_conv`: the BN output dies at once.
        let semantic_conv =
            resize_bilinear(&semantic_conv, size(&detail_dwconv), self.align_corners); // [B, C, h, w]
        let fuse_1 = &detail_dwconv * semantic_conv.sigmoid(); // [B, C, h, w]
        let fuse_2 = &detail_down * semantic_dwconv.sigmoid(); // [B, C, h/4, w/4]
        let fuse_2 = resize_bilinear(&fuse_2, size(&fuse_1), self.align_corners); // [B, C, h, w]
        let output = self.conv.forward(&(&fuse_1 + &fuse_2), training);
        // Every Python local lives until return.
        drop((detail_dwconv, detail_down, semantic_conv, semantic_dwconv));
        drop((fuse_1, fuse_2));
        output
    }
}

pub struct BiSeNetV2 {
    detail: DetailBranch,
    semantic: SemanticBranch,
    bga: BgaLayer,
    out_indices: Vec<i64>,
}

impl BiSeNetV2 {
    pub fn new(p: &mut ParamScope, c: &BiSeNetV2Cfg) -> BiSeNetV2 {
        BiSeNetV2 {
            detail: DetailBranch::new(&mut p.sub("detail"), &c.detail_channels, c.in_channels),
            semantic: SemanticBranch::new(
                &mut p.sub("semantic"),
                &c.semantic_channels,
                c.in_channels,
                c.semantic_expansion_ratio,
            ),
            bga: BgaLayer::new(&mut p.sub("bga"), c.bga_channels, c.align_corners),
            out_indices: c.out_indices.clone(),
        }
    }
}

impl Backbone for BiSeNetV2 {
    /// `[x_head (the BGA map, 1/8), semantic stage outputs but the last]`,
    /// picked by `out_indices`.
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let x_detail = {
            let _part = crate::models::scope::enter("detail");
            self.detail.forward(x, training)
        };
        let semantic = {
            let _part = crate::models::scope::enter("semantic");
            self.semantic.forward(x, training)
        };
        let (x_ce, x_stages) = semantic.split_last().expect("the CE block's output");
        let x_head = {
            let _part = crate::models::scope::enter("bga");
            self.bga.forward(&x_detail, x_ce, training)
        };
        // outs = [x_head] + x_semantic_lst[:-1]
        let mut outs = vec![x_head];
        outs.extend(x_stages.iter().map(Tensor::shallow_clone));
        let n = outs.len() as i64;
        self.out_indices
            .iter()
            .map(|i| outs[i.rem_euclid(n) as usize].shallow_clone())
            .collect()
    }
}

#[cfg(test)]
#[path = "bisenetv2_tests.rs"]
mod tests;
