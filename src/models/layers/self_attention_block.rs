//! MMSeg's `SelfAttentionBlock` (`mmseg/models/utils/self_attention_block.py`),
//! the key/query/value attention over pixels that DANet's PAM, ANN's AFNB
//! and APNB and ISANet's blocks are built on: 1x1 projections (plain convs or
//! ConvModules), optional downsampling of the queries and keys, a softmax
//! over `query^T key`, and an optional output projection.

use super::{count_flops, softmax_saved, Conv2d, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::NormCfg;
use tch::{Kind, Tensor};

/// `SelfAttentionBlock.__init__`'s arguments.
#[derive(Debug, Clone, Copy)]
pub struct SelfAttentionBlockCfg {
    pub key_in_channels: i64,
    pub query_in_channels: i64,
    pub channels: i64,
    pub out_channels: i64,
    pub share_key_query: bool,
    pub key_query_num_convs: i64,
    pub value_out_num_convs: i64,
    /// ConvModules (norm + activation) for key/query, else plain convs.
    pub key_query_norm: bool,
    pub value_out_norm: bool,
    pub matmul_norm: bool,
    pub with_out: bool,
    pub norm: Option<NormCfg>,
    /// `act_cfg=dict(type='ReLU')` (else `None`) of the ConvModules.
    pub relu: bool,
}

impl SelfAttentionBlockCfg {
    /// Query and key from `in_channels` to `channels` and the value back to
    /// `in_channels` by one plain 1x1 conv each: no norms, activations,
    /// scaling or output projection (DANet's position attention; the other
    /// heads change what they set).
    pub fn plain(in_channels: i64, channels: i64) -> SelfAttentionBlockCfg {
        SelfAttentionBlockCfg {
            key_in_channels: in_channels,
            query_in_channels: in_channels,
            channels,
            out_channels: in_channels,
            share_key_query: false,
            key_query_num_convs: 1,
            value_out_num_convs: 1,
            key_query_norm: false,
            value_out_norm: false,
            matmul_norm: false,
            with_out: false,
            norm: None,
            relu: false,
        }
    }
}

/// `build_project`: `num_convs` 1x1 convs or ConvModules, one module or an
/// `nn.Sequential`.
pub enum Projection {
    Convs(Vec<Conv2d>),
    Modules(Vec<ConvModule>),
}

impl Projection {
    fn new(
        p: &mut ParamScope,
        in_channels: i64,
        channels: i64,
        num_convs: i64,
        use_conv_module: bool,
        cfg: &SelfAttentionBlockCfg,
    ) -> Projection {
        let sequential = num_convs > 1;
        let mut convs = Vec::new();
        let mut modules = Vec::new();
        for i in 0..num_convs {
            let from = if i == 0 { in_channels } else { channels };
            let spec = ConvSpec::new(from, channels, 1);
            // One module is the projection itself; more are an nn.Sequential.
            let mut build = |scope: &mut ParamScope| {
                if use_conv_module {
                    modules.push(ConvModule::new(scope, spec, cfg.norm, cfg.relu));
                } else {
                    convs.push(Conv2d::new(scope, spec));
                }
            };
            if sequential {
                build(&mut p.sub(i));
            } else {
                build(p);
            }
        }
        if use_conv_module {
            Projection::Modules(modules)
        } else {
            Projection::Convs(convs)
        }
    }

    pub fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let mut y = x.shallow_clone();
        match self {
            Projection::Convs(convs) => {
                for conv in convs {
                    y = conv.forward(&y);
                }
            }
            Projection::Modules(modules) => {
                for module in modules {
                    y = module.forward(&y, training);
                }
            }
        }
        y
    }
}

/// A downsampling of the projected queries or keys (ANN's `PPMConcat`).
pub type Downsample<'a> = Option<&'a dyn Fn(&Tensor) -> Tensor>;

pub struct SelfAttentionBlock {
    key_project: Projection,
    /// `None` when shared with the key projection.
    query_project: Option<Projection>,
    value_project: Projection,
    out_project: Option<Projection>,
    channels: i64,
    matmul_norm: bool,
}

impl SelfAttentionBlock {
    /// Modules in `__init__`'s order: key, query (unless shared), value, out.
    pub fn new(p: &mut ParamScope, cfg: &SelfAttentionBlockCfg) -> SelfAttentionBlock {
        let key_project = Projection::new(
            &mut p.sub("key_project"),
            cfg.key_in_channels,
            cfg.channels,
            cfg.key_query_num_convs,
            cfg.key_query_norm,
            cfg,
        );
        let query_project = (!cfg.share_key_query).then(|| {
            Projection::new(
                &mut p.sub("query_project"),
                cfg.query_in_channels,
                cfg.channels,
                cfg.key_query_num_convs,
                cfg.key_query_norm,
                cfg,
            )
        });
        let value_project = Projection::new(
            &mut p.sub("value_project"),
            cfg.key_in_channels,
            if cfg.with_out {
                cfg.channels
            } else {
                cfg.out_channels
            },
            cfg.value_out_num_convs,
            cfg.value_out_norm,
            cfg,
        );
        let out_project = cfg.with_out.then(|| {
            Projection::new(
                &mut p.sub("out_project"),
                cfg.channels,
                cfg.out_channels,
                cfg.value_out_num_convs,
                cfg.value_out_norm,
                cfg,
            )
        });
        SelfAttentionBlock {
            key_project,
            query_project,
            value_project,
            out_project,
            channels: cfg.channels,
            matmul_norm: cfg.matmul_norm,
        }
    }

    /// `forward(query_feats, key_feats)`: `[B, out_channels, H, W]` at the
    /// queries' resolution.
    pub fn forward(
        &self,
        query_feats: &Tensor,
        key_feats: &Tensor,
        query_downsample: Downsample,
        key_downsample: Downsample,
        training: bool,
    ) -> Tensor {
        let qs = query_feats.size();
        let (batch, h, w) = (qs[0], qs[2], qs[3]);
        let query_project = self.query_project.as_ref().unwrap_or(&self.key_project);
        let mut query = query_project.forward(query_feats, training); // [B, c, H, W]
        if let Some(down) = query_downsample {
            query = down(&query);
        }
        let c = query.size()[1];
        // Each rebinding frees the tensor before it unless autograd saved it.
        let query = query
            .reshape([batch, c, -1])
            .permute([0, 2, 1])
            .contiguous(); // [B, Nq, c]
        let mut key = self.key_project.forward(key_feats, training);
        let mut value = self.value_project.forward(key_feats, training);
        if let Some(down) = key_downsample {
            key = down(&key);
            value = down(&value);
        }
        let key = key.reshape([batch, c, -1]); // [B, c, Nk]
        let vc = value.size()[1];
        let value = value
            .reshape([batch, vc, -1])
            .permute([0, 2, 1])
            .contiguous(); // [B, Nk, c_v]
        let (nq, nk) = (query.size()[1], key.size()[2]);
        count_flops(2.0 * (batch * nq * nk * (c + vc)) as f64);
        let mut sim_map = query.matmul(&key); // [B, Nq, Nk]
        if self.matmul_norm {
            sim_map = (self.channels as f64).powf(-0.5) * sim_map;
        }
        let probs = sim_map.softmax(-1, None::<Kind>);
        softmax_saved(&sim_map, &probs);
        drop(sim_map);
        let context = probs
            .matmul(&value) // [B, Nq, c_v]
            .permute([0, 2, 1])
            .contiguous()
            .reshape([batch, -1, h, w]); // [B, c_v, H, W]
        match &self.out_project {
            Some(out) => out.forward(&context, training),
            None => context,
        }
    }
}

#[cfg(test)]
#[path = "self_attention_block_tests.rs"]
mod tests;
