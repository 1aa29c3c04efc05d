//! BiSeNet V1's backbone, as MMSeg's `mmseg/models/backbones/bisenetv1.py`
//! builds it: a spatial path and a context path, fused.
//!
//! Yu et al., "BiSeNet: Bilateral Segmentation Network for Real-time
//! Semantic Segmentation", ECCV 2018, arXiv:1808.00897.
//!
//! The spatial path is four ConvModules (1/8 resolution); the context path
//! runs `backbone_cfg` (a ResNet), refines its 1/16 and 1/32 maps with
//! attention refinement modules (a global-pool sigmoid gate), adds the
//! global context and upsamples (nearest) top-down; the feature fusion
//! module concatenates both paths and gates the result by a pooled
//! attention. Outputs: the fusion, the context path's 1/8 and 1/16 maps.
//! The sub-modules are built with their own `dict(type='BN')`: MMSeg does
//! not pass BiSeNetV1's `norm_cfg` down.

use super::{Backbone, BACKBONES};
use crate::config::Dict;
use crate::models::component_config::{type_of, ComponentConfig};
use crate::models::layers::{ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::registry::lookup;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/bisenetv1.py";

/// What every sub-module is built with (`norm_cfg=dict(type='BN')`).
const BN: Option<NormCfg> = Some(NormCfg::BN_DEFAULT);

/// The registry's constructor (`BACKBONES` row `BiSeNetV1`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = BiSeNetV1Cfg::from_cfg(cfg)?;
    Ok(Box::new(BiSeNetV1::new(p, &cfg)?))
}

/// `BiSeNetV1(backbone_cfg, in_channels=3, spatial_channels=(64, 64, 64,
/// 128), context_channels=(128, 256, 512), out_indices=(0, 1, 2),
/// align_corners=False, out_channels=256, ...)`.
#[derive(Debug, Clone, PartialEq)]
pub struct BiSeNetV1Cfg {
    pub backbone_cfg: Dict,
    pub in_channels: i64,
    pub spatial_channels: [i64; 4],
    pub context_channels: [i64; 3],
    pub out_indices: Vec<i64>,
    pub out_channels: i64,
}

impl BiSeNetV1Cfg {
    pub fn from_cfg(d: &Dict) -> Result<BiSeNetV1Cfg, ModelError> {
        let mut c = ComponentConfig::new(d, "BiSeNetV1", SOURCE);
        let backbone_cfg = c
            .dict("backbone_cfg")?
            .ok_or_else(|| c.config_error("lacks `backbone_cfg`"))?
            .clone();
        let spatial_channels = match c.ints("spatial_channels", &[64, 64, 64, 128])?[..] {
            [a, b, e, f] => [a, b, e, f],
            _ => return Err(c.config_error("Length of input channels of Spatial Path must be 4!")),
        };
        let context_channels = match c.ints("context_channels", &[128, 256, 512])?[..] {
            [a, b, e] => [a, b, e],
            _ => return Err(c.config_error("Length of input channels of Context Path must be 3!")),
        };
        let out_indices = c.ints("out_indices", &[0, 1, 2])?;
        if let Some(i) = out_indices.iter().find(|i| !(-3..3).contains(*i)) {
            return Err(c.config_error(format!(
                "out_indices entry {i} is not one of the 3 outputs (fusion, context 1/8, context 1/16)"
            )));
        }
        let cfg = BiSeNetV1Cfg {
            backbone_cfg,
            in_channels: c.int("in_channels", 3)?,
            spatial_channels,
            context_channels,
            out_indices,
            out_channels: c.int("out_channels", 256)?,
        };
        // Stored by BiSeNetV1 but never used by its modules (they take their
        // defaults), as are align_corners (nearest upsampling) and init_cfg.
        c.inert(&[
            "norm_cfg",
            "act_cfg",
            "conv_cfg",
            "align_corners",
            "init_cfg",
        ]);
        c.finish()?;
        Ok(cfg)
    }
}

/// `AttentionRefinementModule`: a 3x3 ConvModule, gated by
/// `sigmoid(ConvModule(avg_pool(x)))` (STDC's context path uses it too).
pub(crate) struct AttentionRefinement {
    conv_layer: ConvModule,
    atten_conv: ConvModule,
}

impl AttentionRefinement {
    pub(crate) fn new(
        p: &mut ParamScope,
        in_channels: i64,
        out_channels: i64,
    ) -> AttentionRefinement {
        AttentionRefinement {
            conv_layer: ConvModule::new(
                &mut p.sub("conv_layer"),
                ConvSpec::new(in_channels, out_channels, 3).padding(1),
                BN,
                true,
            ),
            atten_conv: ConvModule::with_conv_bias(
                &mut p.sub("atten_conv_layer").sub(1),
                ConvSpec::new(out_channels, out_channels, 1),
                BN,
                false,
                false,
            ),
        }
    }

    pub(crate) fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let x = self.conv_layer.forward(x, training);
        // nn.Sequential(AdaptiveAvgPool2d(1), ConvModule, Sigmoid).
        let x_atten = {
            let pooled = x.adaptive_avg_pool2d([1, 1]);
            self.atten_conv.forward(&pooled, training).sigmoid()
        };
        &x * &x_atten
    }
}

/// `ContextPath`.
struct ContextPath {
    backbone: Box<dyn Backbone>,
    arm16: AttentionRefinement,
    arm32: AttentionRefinement,
    conv_head32: ConvModule,
    conv_head16: ConvModule,
    gap_conv: ConvModule,
}

impl ContextPath {
    fn new(p: &mut ParamScope, c: &BiSeNetV1Cfg) -> Result<ContextPath, ModelError> {
        let build_backbone = lookup(
            BACKBONES,
            "backbone (BiSeNetV1's backbone_cfg)",
            type_of(&c.backbone_cfg, "backbone_cfg")?,
        )?;
        let backbone = build_backbone(&mut p.sub("backbone"), &c.backbone_cfg)?;
        let [c8, c16, c32] = c.context_channels;
        let head = |p: &mut ParamScope, name: &str| {
            ConvModule::new(
                &mut p.sub(name),
                ConvSpec::new(c8, c8, 3).padding(1),
                BN,
                true,
            )
        };
        let arm16 = AttentionRefinement::new(&mut p.sub("arm16"), c16, c8);
        let arm32 = AttentionRefinement::new(&mut p.sub("arm32"), c32, c8);
        let conv_head32 = head(p, "conv_head32");
        let conv_head16 = head(p, "conv_head16");
        let gap_conv = ConvModule::new(
            &mut p.sub("gap_conv").sub(1),
            ConvSpec::new(c32, c8, 1),
            BN,
            true,
        );
        Ok(ContextPath {
            backbone,
            arm16,
            arm32,
            conv_head32,
            conv_head16,
            gap_conv,
        })
    }

    /// `(x_16_up, x_32_up)`: the 1/8 and 1/16 context maps.
    fn forward(&self, x: &Tensor, training: bool) -> (Tensor, Tensor) {
        let feats = self.backbone.forward(x, training);
        assert_eq!(
            feats.len(),
            4,
            "BiSeNetV1's context path unpacks 4 backbone outputs"
        );
        let (x_8, x_16, x_32) = (&feats[1], &feats[2], &feats[3]);
        let size = |t: &Tensor| [t.size()[2], t.size()[3]];
        let x_gap = {
            let pooled = x_32.adaptive_avg_pool2d([1, 1]);
            self.gap_conv.forward(&pooled, training)
        };
        let x_32_arm = self.arm32.forward(x_32, training);
        let x_32_sum = &x_32_arm + &x_gap;
        let x_32_up = x_32_sum.upsample_nearest2d(size(x_16), None, None);
        let x_32_up = self.conv_head32.forward(&x_32_up, training);
        let x_16_arm = self.arm16.forward(x_16, training);
        let x_16_sum = &x_16_arm + &x_32_up;
        let x_16_up = x_16_sum.upsample_nearest2d(size(x_8), None, None);
        let x_16_up = self.conv_head16.forward(&x_16_up, training);
        // Every Python local (the sums, the backbone's maps) lives until return.
        drop((feats, x_gap, x_32_arm, x_32_sum, x_16_arm, x_16_sum));
        (x_16_up, x_32_up)
    }
}

/// `FeatureFusionModule`: concat, a 1x1 ConvModule, then
/// `x + x * sigmoid(ConvModule(avg_pool(x)))`.
struct FeatureFusion {
    conv1: ConvModule,
    conv_atten: ConvModule,
}

impl FeatureFusion {
    fn forward(&self, x_sp: &Tensor, x_cp: &Tensor, training: bool) -> Tensor {
        let x_concat = Tensor::cat(&[x_sp, x_cp], 1);
        let x_fuse = self.conv1.forward(&x_concat, training);
        let x_atten = x_fuse.adaptive_avg_pool2d([1, 1]);
        let x_atten = self.conv_atten.forward(&x_atten, training).sigmoid();
        let x_atten = &x_fuse * &x_atten;
        &x_atten + &x_fuse
    }
}

pub struct BiSeNetV1 {
    context_path: ContextPath,
    spatial_path: Vec<ConvModule>,
    ffm: FeatureFusion,
    out_indices: Vec<i64>,
}

impl BiSeNetV1 {
    pub fn new(p: &mut ParamScope, c: &BiSeNetV1Cfg) -> Result<BiSeNetV1, ModelError> {
        let context_path = ContextPath::new(&mut p.sub("context_path"), c)?;
        let s = c.spatial_channels;
        let shapes = [
            (c.in_channels, s[0], 7, 2, 3),
            (s[0], s[1], 3, 2, 1),
            (s[1], s[2], 3, 2, 1),
            (s[2], s[3], 1, 1, 0),
        ];
        let spatial_path = shapes
            .iter()
            .enumerate()
            .map(|(i, &(from, to, k, stride, pad))| {
                ConvModule::new(
                    &mut p.sub("spatial_path").sub(format!("layer{}", i + 1)),
                    ConvSpec::new(from, to, k).stride(stride).padding(pad),
                    BN,
                    true,
                )
            })
            .collect();
        let mut fp = p.sub("ffm");
        let out = c.out_channels;
        let ffm = FeatureFusion {
            conv1: ConvModule::new(
                &mut fp.sub("conv1"),
                ConvSpec::new(c.context_channels[1], out, 1),
                BN,
                true,
            ),
            conv_atten: ConvModule::with_conv_bias(
                &mut fp.sub("conv_atten").sub(0),
                ConvSpec::new(out, out, 1),
                BN,
                true,
                false,
            ),
        };
        Ok(BiSeNetV1 {
            context_path,
            spatial_path,
            ffm,
            out_indices: c.out_indices.clone(),
        })
    }
}

impl Backbone for BiSeNetV1 {
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let (x_context8, x_context16) = {
            let _part = crate::models::scope::enter("context_path");
            self.context_path.forward(x, training)
        };
        let x_spatial = {
            let _part = crate::models::scope::enter("spatial_path");
            let mut y = x.shallow_clone();
            for layer in &self.spatial_path {
                y = layer.forward(&y, training);
            }
            y
        };
        let x_fuse = {
            let _part = crate::models::scope::enter("ffm");
            self.ffm.forward(&x_spatial, &x_context8, training)
        };
        let outs = [x_fuse, x_context8, x_context16];
        self.out_indices
            .iter()
            .map(|i| outs[i.rem_euclid(3) as usize].shallow_clone())
            .collect()
    }
}

#[cfg(test)]
#[path = "bisenetv1_tests.rs"]
mod tests;
