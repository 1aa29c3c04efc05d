//! `Feature2Pyramid`, as MMSeg's `mmseg/models/necks/featurepyramid.py`
//! builds it: the neck that turns four single-resolution maps of a plain
//! ViT (BEiT, MAE) into a pyramid for UPerNet.
//!
//! From the BEiT semantic segmentation setup (Bao et al., "BEiT: BERT
//! Pre-Training of Image Transformers", ICLR 2022, arXiv:2106.08254).
//!
//! With a rescale of 4 the four inputs go through `upsample_4x`
//! (ConvTranspose2d 2x2/2, BN, GELU, ConvTranspose2d 2x2/2),
//! `upsample_2x` (ConvTranspose2d 2x2/2), the identity and `downsample_2x`
//! (2x2 max pooling), in that order whatever the order of `rescales`;
//! without one, through `upsample_2x`, the identity, `downsample_2x` and
//! `downsample_4x` (4x4 max pooling). The modules are registered in the
//! order of `rescales`.

use super::Neck;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{BatchNorm2d, ConvTranspose2d};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::Tensor;

const SOURCE: &str = "mmseg/models/necks/featurepyramid.py";

/// The registry's constructor (`NECKS` row `Feature2Pyramid`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Neck>, ModelError> {
    let cfg = Feature2PyramidCfg::from_cfg(cfg)?;
    Ok(Box::new(Feature2Pyramid::new(p, &cfg)))
}

/// One `rescales` entry: the module it builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rescale {
    /// 4: `upsample_4x`.
    Up4,
    /// 2: `upsample_2x`.
    Up2,
    /// 1: `identity`.
    Identity,
    /// 0.5: `downsample_2x`.
    Down2,
    /// 0.25: `downsample_4x`.
    Down4,
}

/// `Feature2Pyramid(embed_dim, rescales=[4, 2, 1, 0.5],
/// norm_cfg=dict(type='SyncBN', requires_grad=True))`.
#[derive(Debug, Clone, PartialEq)]
pub struct Feature2PyramidCfg {
    pub embed_dim: i64,
    /// In the config's order (the registration order).
    pub rescales: Vec<Rescale>,
    pub norm: NormCfg,
}

impl Feature2PyramidCfg {
    pub fn from_cfg(d: &Dict) -> Result<Feature2PyramidCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "Feature2Pyramid", SOURCE);
        c.require("embed_dim")?;
        let embed_dim = c.int("embed_dim", 0)?;
        let scales = c.floats("rescales")?.unwrap_or(vec![4.0, 2.0, 1.0, 0.5]);
        let mut rescales = Vec::with_capacity(scales.len());
        for k in scales {
            rescales.push(match k {
                4.0 => Rescale::Up4,
                2.0 => Rescale::Up2,
                1.0 => Rescale::Identity,
                0.5 => Rescale::Down2,
                0.25 => Rescale::Down4,
                _ => {
                    return Err(c.config_error(format!("invalid {k} for feature2pyramid")));
                }
            });
        }
        // build_norm_layer(None) is a TypeError; the default is SyncBN (BN here).
        let norm = match c.value("norm_cfg") {
            Some(Value::None) => {
                return Err(c.unsupported("norm_cfg", "None (build_norm_layer needs a dict)"))
            }
            _ => c.batch_norm_or_bn("norm_cfg")?,
        }
        .expect("a norm_cfg dict or the SyncBN default");
        c.finish()?;
        let cfg = Feature2PyramidCfg {
            embed_dim,
            rescales,
            norm,
        };
        cfg.checked()
    }

    /// The modules forward applies, in its fixed order.
    pub fn ops(&self) -> [Rescale; 4] {
        if self.rescales.contains(&Rescale::Up4) {
            [
                Rescale::Up4,
                Rescale::Up2,
                Rescale::Identity,
                Rescale::Down2,
            ]
        } else {
            [
                Rescale::Up2,
                Rescale::Identity,
                Rescale::Down2,
                Rescale::Down4,
            ]
        }
    }

    /// forward lists all four modules of its branch (an AttributeError in
    /// MMSeg for one that `rescales` did not build) and asserts one input
    /// per rescale, so `rescales` must be exactly those four.
    fn checked(self) -> Result<Feature2PyramidCfg, ModelError> {
        let ops = self.ops();
        let complete =
            self.rescales.len() == ops.len() && ops.iter().all(|op| self.rescales.contains(op));
        if !complete {
            return Err(ModelError::config(
                "Feature2Pyramid",
                format!(
                    "rescales {:?} do not build the four modules forward applies ({ops:?}): \
                     featurepyramid.py would fail at forward time",
                    self.rescales
                ),
            ));
        }
        Ok(self)
    }
}

/// `upsample_4x`: `nn.Sequential(ConvTranspose2d, BN, GELU, ConvTranspose2d)`.
struct Upsample4x {
    deconv1: ConvTranspose2d,
    bn: BatchNorm2d,
    deconv2: ConvTranspose2d,
}

enum Op {
    Up4(Upsample4x),
    Up2(ConvTranspose2d),
    Identity,
    /// `nn.MaxPool2d(kernel_size=k, stride=k)`.
    MaxPool(i64),
}

impl Op {
    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        match self {
            Op::Up4(up) => {
                // nn.Sequential keeps only the latest output.
                let mut y = up.deconv1.forward(x);
                y = up.bn.forward(&y, training);
                y = y.gelu("none");
                up.deconv2.forward(&y)
            }
            Op::Up2(deconv) => deconv.forward(x),
            Op::Identity => x.shallow_clone(),
            Op::MaxPool(k) => x.max_pool2d([*k, *k], [*k, *k], [0, 0], [1, 1], false),
        }
    }
}

pub struct Feature2Pyramid {
    /// The modules in forward's order.
    ops: Vec<Op>,
}

impl Feature2Pyramid {
    pub fn new(p: &mut ParamScope, c: &Feature2PyramidCfg) -> Feature2Pyramid {
        let dims = c.embed_dim;
        let deconv = |p: &mut ParamScope| ConvTranspose2d::new(p, dims, dims, 2, 2, 0);
        let mut built: Vec<(Rescale, Op)> = c
            .rescales
            .iter()
            .map(|r| {
                let op = match r {
                    Rescale::Up4 => {
                        let mut s = p.sub("upsample_4x");
                        Op::Up4(Upsample4x {
                            deconv1: deconv(&mut s.sub(0)),
                            bn: BatchNorm2d::from_cfg(&mut s.sub(1), dims, &c.norm),
                            deconv2: deconv(&mut s.sub(3)),
                        })
                    }
                    Rescale::Up2 => Op::Up2(deconv(&mut p.sub("upsample_2x").sub(0))),
                    Rescale::Identity => Op::Identity,
                    Rescale::Down2 => Op::MaxPool(2),
                    Rescale::Down4 => Op::MaxPool(4),
                };
                (*r, op)
            })
            .collect();
        let ops = c
            .ops()
            .iter()
            .map(|want| {
                let at = built.iter().position(|(r, _)| r == want);
                built
                    .remove(at.expect("checked: rescales build every op"))
                    .1
            })
            .collect();
        Feature2Pyramid { ops }
    }
}

impl Neck for Feature2Pyramid {
    fn forward(&self, features: Vec<Tensor>, training: bool) -> Vec<Tensor> {
        assert_eq!(
            features.len(),
            self.ops.len(),
            "Feature2Pyramid: assert len(inputs) == len(self.rescales)"
        );
        let outs = self
            .ops
            .iter()
            .zip(&features)
            .map(|(op, x)| op.forward(x, training))
            .collect();
        drop(features);
        outs
    }
}

#[cfg(test)]
#[path = "feature2pyramid_tests.rs"]
mod tests;
