//! `FastSCNN`, as MMSeg's `mmseg/models/backbones/fast_scnn.py` builds it,
//! with the MobileNetV2 `InvertedResidual` of
//! `mmseg/models/utils/inverted_residual.py` and `PPM` from `psp_head.py`.
//!
//! Poudel, Liwicki and Cipolla, "Fast-SCNN: Fast Semantic Segmentation
//! Network", BMVC 2019, arXiv:1902.04502.
//!
//! Learning to downsample (a strided ConvModule and two strided
//! depthwise-separable ConvModules, 1/8), the global feature extractor
//! (three groups of inverted residual blocks, a pyramid pooling module and a
//! 3x3 ConvModule, 1/32) and the feature fusion module (the low-resolution
//! map upsampled, a depthwise ConvModule and a 1x1 one, added to the
//! high-resolution map's 1x1 ConvModule, then an in-place ReLU). The outputs
//! are `[higher_res_features, lower_res_features, fusion_output]` picked by
//! `out_indices`.

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::decode_heads::psp_head::Ppm;
use crate::models::layers::inverted_residual::{BlockAct, InvertedResidual};
use crate::models::layers::{resize_bilinear, ConvModule, ConvSpec, DepthwiseSeparableConvModule};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/fast_scnn.py";

/// `GlobalFeatureExtractor`'s defaults, which `FastSCNN` does not pass on.
const EXPAND_RATIO: i64 = 6;
const NUM_BLOCKS: [i64; 3] = [3, 3, 3];
const POOL_SCALES: [i64; 4] = [1, 2, 3, 6];

/// The registry's constructor (`BACKBONES` row `FastSCNN`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = FastScnnCfg::from_cfg(cfg)?;
    Ok(Box::new(FastScnn::new(p, &cfg)))
}

/// `FastSCNN(in_channels=3, downsample_dw_channels=(32, 48),
/// global_in_channels=64, global_block_channels=(64, 96, 128),
/// global_block_strides=(2, 2, 1), global_out_channels=128,
/// higher_in_channels=64, lower_in_channels=128, fusion_out_channels=128,
/// out_indices=(0, 1, 2), conv_cfg=None, norm_cfg=dict(type='BN'),
/// act_cfg=dict(type='ReLU'), align_corners=False, dw_act_cfg=None,
/// init_cfg=None)`.
#[derive(Debug, Clone, PartialEq)]
pub struct FastScnnCfg {
    pub in_channels: i64,
    pub downsample_dw_channels: (i64, i64),
    pub global_in_channels: i64,
    pub global_block_channels: [i64; 3],
    pub global_block_strides: [i64; 3],
    pub global_out_channels: i64,
    pub lower_in_channels: i64,
    pub fusion_out_channels: i64,
    pub out_indices: Vec<i64>,
    pub norm: Option<NormCfg>,
    /// `act_cfg`: a ReLU (every ConvModule that takes it) or `None`.
    pub relu: bool,
    /// `dw_act_cfg`: the ReLU of the downsampling depthwise convs.
    pub dw_relu: bool,
    pub align_corners: bool,
}

impl FastScnnCfg {
    pub fn from_cfg(d: &Dict) -> Result<FastScnnCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "FastSCNN", SOURCE);
        let downsample_dw_channels = match c.ints("downsample_dw_channels", &[32, 48])?[..] {
            [a, b] => (a, b),
            _ => return Err(c.config_error("`downsample_dw_channels` must be two ints")),
        };
        let global_block_channels = three(&mut c, "global_block_channels", [64, 96, 128])?;
        let global_block_strides = three(&mut c, "global_block_strides", [2, 2, 1])?;
        let global_in_channels = c.int("global_in_channels", 64)?;
        let higher_in_channels = c.int("higher_in_channels", 64)?;
        let global_out_channels = c.int("global_out_channels", 128)?;
        let lower_in_channels = c.int("lower_in_channels", 128)?;
        // FastSCNN.__init__'s checks.
        if global_in_channels != higher_in_channels {
            return Err(c.config_error(
                "Global Input Channels must be the same with Higher Input Channels!",
            ));
        }
        if global_out_channels != lower_in_channels {
            return Err(c.config_error(
                "Global Output Channels must be the same with Lower Input Channels!",
            ));
        }
        if global_block_strides.iter().any(|s| ![1, 2].contains(s)) {
            return Err(c.config_error("InvertedResidual's stride must be 1 or 2"));
        }
        let out_indices = c.ints("out_indices", &[0, 1, 2])?;
        if let Some(bad) = out_indices.iter().find(|i| !(-3..3).contains(*i)) {
            return Err(c.config_error(format!("out_indices picks from 3 outputs, not {bad}")));
        }
        let cfg = FastScnnCfg {
            in_channels: c.int("in_channels", 3)?,
            downsample_dw_channels,
            global_in_channels,
            global_block_channels,
            global_block_strides,
            global_out_channels,
            lower_in_channels,
            fusion_out_channels: c.int("fusion_out_channels", 128)?,
            out_indices,
            norm: c.batch_norm_or_bn("norm_cfg")?,
            relu: c.relu_or_none("act_cfg", true)?,
            dw_relu: read_dw_act_cfg(&mut c)?,
            align_corners: c.flag("align_corners", false),
        };
        c.unimplemented("conv_cfg", &Value::None)?;
        c.inert(&["init_cfg", "pretrained"]);
        c.finish()?;
        Ok(cfg)
    }
}

/// A three-int tuple (`assert len(block_channels) == len(num_blocks) == 3`).
fn three(c: &mut ComponentConfig, key: &str, default: [i64; 3]) -> Result<[i64; 3], ModelError> {
    match c.ints(key, &default)?[..] {
        [a, b, d] => Ok([a, b, d]),
        _ => Err(c.config_error(format!("`{key}` must be three ints"))),
    }
}

/// `dw_act_cfg`: `None` (FastSCNN's default), a ReLU, or mmcv's `'default'`
/// (then `DepthwiseSeparableConvModule`'s own `act_cfg`, a ReLU).
fn read_dw_act_cfg(c: &mut ComponentConfig) -> Result<bool, ModelError> {
    if let Some(Value::Str(s)) = c.value("dw_act_cfg") {
        if s == "default" {
            return Ok(true);
        }
        return Err(c.unsupported(
            "dw_act_cfg",
            "only None, dict(type='ReLU') or 'default' is implemented",
        ));
    }
    c.relu_or_none("dw_act_cfg", false)
}

/// `LearningToDownsample`: `conv`, `dsconv1`, `dsconv2` (1/8).
struct LearningToDownsample {
    conv: ConvModule,
    dsconv1: DepthwiseSeparableConvModule,
    dsconv2: DepthwiseSeparableConvModule,
}

impl LearningToDownsample {
    fn new(p: &mut ParamScope, c: &FastScnnCfg) -> Self {
        let (dw1, dw2) = c.downsample_dw_channels;
        let strided = |from, to| ConvSpec::new(from, to, 3).stride(2).padding(1);
        LearningToDownsample {
            conv: ConvModule::new(
                &mut p.sub("conv"),
                strided(c.in_channels, dw1),
                c.norm,
                c.relu,
            ),
            // DepthwiseSeparableConvModule's pointwise act_cfg is its own
            // default ReLU: FastSCNN passes only norm_cfg and dw_act_cfg.
            dsconv1: DepthwiseSeparableConvModule::new(
                &mut p.sub("dsconv1"),
                strided(dw1, dw2),
                c.norm,
                c.dw_relu,
            ),
            dsconv2: DepthwiseSeparableConvModule::new(
                &mut p.sub("dsconv2"),
                strided(dw2, c.global_in_channels),
                c.norm,
                c.dw_relu,
            ),
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let x = self.conv.forward(x, training); // [B, dw1, H/2, W/2]
        let x = self.dsconv1.forward(&x, training); // [B, dw2, H/4, W/4]
        self.dsconv2.forward(&x, training) // [B, global_in, H/8, W/8]
    }
}

/// `GlobalFeatureExtractor`: `bottleneck1..3`, `ppm`, `out`.
struct GlobalFeatureExtractor {
    bottlenecks: Vec<Vec<InvertedResidual>>,
    ppm: Ppm,
    out: ConvModule,
}

impl GlobalFeatureExtractor {
    fn new(p: &mut ParamScope, c: &FastScnnCfg) -> Self {
        let mut in_channels = c.global_in_channels;
        let mut bottlenecks = Vec::new();
        for (i, (&channels, &stride)) in c
            .global_block_channels
            .iter()
            .zip(&c.global_block_strides)
            .enumerate()
        {
            let mut lp = p.sub(format!("bottleneck{}", i + 1));
            let layer = (0..NUM_BLOCKS[i])
                .map(|b| {
                    let block_stride = if b == 0 { stride } else { 1 };
                    let block = InvertedResidual::new(
                        &mut lp.sub(b),
                        (in_channels, channels),
                        (block_stride, 1),
                        EXPAND_RATIO,
                        c.norm,
                        if c.relu {
                            BlockAct::Relu
                        } else {
                            BlockAct::Linear
                        },
                    );
                    in_channels = channels;
                    block
                })
                .collect();
            bottlenecks.push(layer);
        }
        let last = c.global_block_channels[2];
        let ppm = Ppm::new(
            &mut p.sub("ppm"),
            &POOL_SCALES,
            last,
            last / 4,
            c.norm,
            c.align_corners,
        );
        let out = ConvModule::new(
            &mut p.sub("out"),
            ConvSpec::new(last * 2, c.global_out_channels, 3).padding(1),
            c.norm,
            c.relu,
        );
        GlobalFeatureExtractor {
            bottlenecks,
            ppm,
            out,
        }
    }

    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut x = x.shallow_clone();
        for layer in &self.bottlenecks {
            for block in layer {
                x = block.forward(&x, training); // [B, block_channels[i], h_i, w_i]
            }
        }
        let cat = {
            let mut parts = vec![x.shallow_clone()];
            parts.extend(self.ppm.forward(&x, training));
            Tensor::cat(&parts, 1) // [B, 2 * block_channels[2], h, w]
        };
        drop(x);
        self.out.forward(&cat, training) // [B, global_out, h, w]
    }
}

/// `FeatureFusionModule`: `dwconv`, `conv_lower_res`, `conv_higher_res`,
/// then an in-place ReLU of their sum.
struct FeatureFusionModule {
    dwconv: ConvModule,
    conv_lower_res: ConvModule,
    conv_higher_res: ConvModule,
    align_corners: bool,
}

impl FeatureFusionModule {
    fn new(p: &mut ParamScope, c: &FastScnnCfg) -> Self {
        let out = c.fusion_out_channels;
        let dwconv = ConvSpec::new(c.lower_in_channels, out, 3)
            .padding(1)
            .groups(out);
        FeatureFusionModule {
            // FastSCNN passes its act_cfg as dwconv_act_cfg; the 1x1 convs
            // keep conv_act_cfg=None.
            dwconv: ConvModule::new(&mut p.sub("dwconv"), dwconv, c.norm, c.relu),
            conv_lower_res: ConvModule::new(
                &mut p.sub("conv_lower_res"),
                ConvSpec::new(out, out, 1),
                c.norm,
                false,
            ),
            conv_higher_res: ConvModule::new(
                &mut p.sub("conv_higher_res"),
                ConvSpec::new(c.global_in_channels, out, 1),
                c.norm,
                false,
            ),
            align_corners: c.align_corners,
        }
    }

    fn forward(&self, higher: &Tensor, lower: &Tensor, training: bool) -> Tensor {
        let size = (higher.size()[2], higher.size()[3]);
        let lower = resize_bilinear(lower, size, self.align_corners); // [B, lower_in, h, w]
        let lower = self.dwconv.forward(&lower, training); // [B, out, h, w]
        let lower = self.conv_lower_res.forward(&lower, training);
        let higher = self.conv_higher_res.forward(higher, training); // [B, out, h, w]
        let mut out = higher + lower;
        let _ = out.relu_();
        out
    }
}

pub struct FastScnn {
    learning_to_downsample: LearningToDownsample,
    global_feature_extractor: GlobalFeatureExtractor,
    feature_fusion: FeatureFusionModule,
    out_indices: Vec<i64>,
}

impl FastScnn {
    pub fn new(p: &mut ParamScope, c: &FastScnnCfg) -> FastScnn {
        FastScnn {
            learning_to_downsample: LearningToDownsample::new(
                &mut p.sub("learning_to_downsample"),
                c,
            ),
            global_feature_extractor: GlobalFeatureExtractor::new(
                &mut p.sub("global_feature_extractor"),
                c,
            ),
            feature_fusion: FeatureFusionModule::new(&mut p.sub("feature_fusion"), c),
            out_indices: c.out_indices.clone(),
        }
    }
}

impl Backbone for FastScnn {
    /// `[higher_res_features (1/8), lower_res_features (1/32), fusion_output
    /// (1/8)]`, picked by `out_indices`.
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let higher = {
            let _part = crate::models::scope::enter("learning_to_downsample");
            self.learning_to_downsample.forward(x, training)
        };
        let lower = {
            let _part = crate::models::scope::enter("global_feature_extractor");
            self.global_feature_extractor.forward(&higher, training)
        };
        let fusion = {
            let _part = crate::models::scope::enter("feature_fusion");
            self.feature_fusion.forward(&higher, &lower, training)
        };
        let outs = [higher, lower, fusion];
        self.out_indices
            .iter()
            .map(|&i| outs[i.rem_euclid(3) as usize].shallow_clone())
            .collect()
    }
}

#[cfg(test)]
#[path = "fast_scnn_tests.rs"]
mod tests;
