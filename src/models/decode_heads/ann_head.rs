//! `ANNHead`, the asymmetric non-local head, as MMSeg's
//! `mmseg/models/decode_heads/ann_head.py` builds it.
//!
//! Zhu et al., "Asymmetric Non-local Neural Networks for Semantic
//! Segmentation", ICCV 2019, arXiv:1908.07678.
//!
//! Two inputs (`multiple_select`, low and high level). AFNB fuses them: the
//! high-level map queries the low-level one, whose keys and values are
//! pyramid-pooled to a few positions (`PPMConcat`, 1+9+36+64 by default);
//! a 3x3 bottleneck follows, then APNB, the same attention of the map on
//! itself with shared key/query projections.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, InputTransform};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::self_attention_block::{SelfAttentionBlock, SelfAttentionBlockCfg};
use crate::models::layers::{ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/ann_head.py";

/// The registry's constructor (`DECODE_HEADS` row `ANNHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = AnnHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(AnnHead::new(p, cfg)))
}

/// `ANNHead(project_channels, query_scales=(1,), key_pool_scales=(1, 3, 6,
/// 8), **kwargs)` with `input_transform='multiple_select'`.
#[derive(Debug, Clone, PartialEq)]
pub struct AnnHeadCfg {
    pub head: DecodeHeadCfg,
    pub project_channels: i64,
    pub query_scales: Vec<i64>,
    pub key_pool_scales: Vec<i64>,
}

impl AnnHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<AnnHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "ANNHead", SOURCE);
        c.require("project_channels")?;
        let project_channels = c.int("project_channels", 0)?;
        let query_scales = c.ints("query_scales", &[1])?;
        let key_pool_scales = c.ints("key_pool_scales", &[1, 3, 6, 8])?;
        if query_scales.iter().chain(&key_pool_scales).any(|&s| s <= 0) {
            return Err(c.config_error("query_scales and key_pool_scales must be positive"));
        }
        let head = DecodeHeadCfg::from_cfg(&mut c, Some(InputTransform::MultipleSelect))?;
        if head.in_channels.len() != 2 {
            return Err(c.config_error("takes two inputs: in_channels and in_index of length 2"));
        }
        c.finish()?;
        Ok(AnnHeadCfg {
            head,
            project_channels,
            query_scales,
            key_pool_scales,
        })
    }
}

/// ANN's `SelfAttentionBlock`: ConvModule key/query projections, a plain
/// value and output conv, `matmul_norm`, queries max-pooled by
/// `query_scale`, keys and values pyramid-pooled.
struct Stage {
    attention: SelfAttentionBlock,
    query_scale: i64,
    key_pool_scales: Vec<i64>,
}

/// What AFNB and APNB share: the stages' settings.
struct StageSpec<'a> {
    low_in: i64,
    high_in: i64,
    channels: i64,
    out_channels: i64,
    share_key_query: bool,
    key_pool_scales: &'a [i64],
    norm: Option<NormCfg>,
}

impl Stage {
    fn new(p: &mut ParamScope, spec: &StageSpec, query_scale: i64) -> Stage {
        let attention = SelfAttentionBlock::new(
            p,
            &SelfAttentionBlockCfg {
                key_in_channels: spec.low_in,
                query_in_channels: spec.high_in,
                channels: spec.channels,
                out_channels: spec.out_channels,
                share_key_query: spec.share_key_query,
                key_query_num_convs: 1,
                value_out_num_convs: 1,
                key_query_norm: true,
                value_out_norm: false,
                matmul_norm: true,
                with_out: true,
                norm: spec.norm,
                relu: true,
            },
        );
        Stage {
            attention,
            query_scale,
            key_pool_scales: spec.key_pool_scales.to_vec(),
        }
    }

    fn forward(&self, query_feats: &Tensor, key_feats: &Tensor, training: bool) -> Tensor {
        let k = self.query_scale;
        let max_pool = |q: &Tensor| q.max_pool2d([k, k], [k, k], [0, 0], [1, 1], false);
        // PPMConcat: each adaptive average pool flattened, concatenated.
        let ppm_concat = |feats: &Tensor| {
            let s = feats.size();
            let outs: Vec<Tensor> = self
                .key_pool_scales
                .iter()
                .map(|&scale| {
                    feats
                        .adaptive_avg_pool2d([scale, scale])
                        .view([s[0], s[1], -1])
                })
                .collect();
            Tensor::cat(&outs, 2) // [B, C, sum(scale^2)]
        };
        let query_downsample: Option<&dyn Fn(&Tensor) -> Tensor> =
            (k > 1).then_some(&max_pool as &dyn Fn(&Tensor) -> Tensor);
        self.attention.forward(
            query_feats,
            key_feats,
            query_downsample,
            Some(&ppm_concat),
            training,
        )
    }
}

/// AFNB (`share_key_query=False`, bottleneck without activation) or APNB
/// (shared, bottleneck with ReLU): the stages' outputs summed, concatenated
/// with the queried map and fused by a 1x1 ConvModule.
struct NonLocalBlock {
    stages: Vec<Stage>,
    bottleneck: ConvModule,
}

impl NonLocalBlock {
    fn new(
        p: &mut ParamScope,
        spec: &StageSpec,
        query_scales: &[i64],
        bottleneck_in: i64,
        bottleneck_relu: bool,
    ) -> NonLocalBlock {
        let mut sp = p.sub("stages");
        let stages = query_scales
            .iter()
            .enumerate()
            .map(|(i, &scale)| Stage::new(&mut sp.sub(i), spec, scale))
            .collect();
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(bottleneck_in, spec.out_channels, 1),
            spec.norm,
            bottleneck_relu,
        );
        NonLocalBlock { stages, bottleneck }
    }

    /// `forward(low_feats, high_feats)` (APNB: the same map twice).
    fn forward(&self, low_feats: &Tensor, high_feats: &Tensor, training: bool) -> Tensor {
        // `priors` and `context` stay live locals until the block returns.
        let priors: Vec<Tensor> = self
            .stages
            .iter()
            .map(|stage| stage.forward(high_feats, low_feats, training))
            .collect();
        let context = Tensor::stack(&priors, 0).sum_dim_intlist(0, false, None::<tch::Kind>);
        let cat = Tensor::cat(&[&context, high_feats], 1);
        let output = self.bottleneck.forward(&cat, training);
        drop((cat, context, priors));
        output
    }
}

pub struct AnnHead {
    base: DecodeHeadBase,
    fusion: NonLocalBlock,
    bottleneck: ConvModule,
    context: NonLocalBlock,
}

impl AnnHead {
    pub fn new(p: &mut ParamScope, cfg: AnnHeadCfg) -> AnnHead {
        let head = cfg.head;
        let (channels, norm) = (head.channels, head.norm);
        let (low_in, high_in) = (head.in_channels[0], head.in_channels[1]);
        let base = DecodeHeadBase::new(p, head);
        let fusion = NonLocalBlock::new(
            &mut p.sub("fusion"),
            &StageSpec {
                low_in,
                high_in,
                channels: cfg.project_channels,
                out_channels: high_in,
                share_key_query: false,
                key_pool_scales: &cfg.key_pool_scales,
                norm,
            },
            &cfg.query_scales,
            high_in + high_in,
            false,
        );
        let bottleneck = ConvModule::new(
            &mut p.sub("bottleneck"),
            ConvSpec::new(high_in, channels, 3).padding(1),
            norm,
            true,
        );
        let context = NonLocalBlock::new(
            &mut p.sub("context"),
            &StageSpec {
                low_in: channels,
                high_in: channels,
                channels: cfg.project_channels,
                out_channels: channels,
                share_key_query: true,
                key_pool_scales: &cfg.key_pool_scales,
                norm,
            },
            &cfg.query_scales,
            2 * channels,
            true,
        );
        AnnHead {
            base,
            fusion,
            bottleneck,
            context,
        }
    }
}

impl BaseHead for AnnHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let inputs = self.base.selected_inputs(features);
        let (low_feats, high_feats) = (inputs[0], inputs[1]);
        let mut output = self.fusion.forward(low_feats, high_feats, training);
        let ratio = self.base.cfg.dropout_ratio;
        if ratio > 0.0 {
            output = output.feature_dropout(ratio, training);
        }
        output = self.bottleneck.forward(&output, training);
        output = self.context.forward(&output, &output, training);
        self.base.cls_seg(output, training)
    }
}

#[cfg(test)]
#[path = "ann_head_tests.rs"]
mod tests;
