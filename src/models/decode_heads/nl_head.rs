//! `NLHead`, the non-local head, as MMSeg's
//! `mmseg/models/decode_heads/nl_head.py` builds it: an FCNHead with two
//! convs and mmcv's `NonLocal2d` (`mmcv/cnn/bricks/non_local.py`) between
//! them. The block is shared with `DNLHead` (`dnl_head.rs`), whose
//! `DisentangledNonLocal2d` extends it.
//!
//! Wang et al., "Non-local Neural Networks", CVPR 2018, arXiv:1711.07971.
//!
//! Every pixel attends to every pixel: `theta`, `phi` and `g` 1x1 convs
//! project the map to `channels / reduction`, the `[HW, HW]` pairwise
//! weights (embedded Gaussian: a scaled softmax of `theta^T phi`) mix `g`,
//! and `conv_out` (with the head's norm) projects back onto a residual.

use super::fcn_head::{FcnHead, FcnHeadCfg, MidBlock};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{count_flops, softmax_saved, Conv2d, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::{ModelError, NormCfg};
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/nl_head.py";

/// The registry's constructor (`DECODE_HEADS` row `NLHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    build_with_block(p, cfg, ("NLHead", SOURCE), None, "nl_block")
}

/// An FCNHead(num_convs=2) with a non-local block named `block_name`
/// between its convs: NLHead's, or (with a default `temperature`)
/// DNLHead's disentangled one.
pub(super) fn build_with_block(
    p: &mut ParamScope,
    cfg: &Dict,
    (class, source): (&'static str, &'static str),
    default_temperature: Option<f64>,
    block_name: &'static str,
) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, class, source);
    let block = NonLocalCfg::read(&mut c, default_temperature)?;
    let fcn = FcnHeadCfg::read(&mut c, Some(2))?;
    c.finish()?;
    Ok(Box::new(FcnHead::with_block(
        p,
        fcn,
        |p, channels, norm| {
            Box::new(NonLocal2d::new(
                &mut p.sub(block_name),
                channels,
                norm,
                &block,
            ))
        },
    )))
}

/// How the pairwise weights are made (`_NonLocalNd.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairwiseMode {
    Gaussian,
    EmbeddedGaussian,
    DotProduct,
    Concatenation,
}

/// `NonLocal2d(reduction=2, use_scale=True, mode='embedded_gaussian')`,
/// and `DisentangledNonLocal2d`'s `temperature` when there is one.
#[derive(Debug, Clone, PartialEq)]
pub struct NonLocalCfg {
    pub reduction: i64,
    pub use_scale: bool,
    pub mode: PairwiseMode,
    /// `Some` for the disentangled block (DNLHead).
    pub temperature: Option<f64>,
}

impl NonLocalCfg {
    /// The head's block keys; `temperature` (a DNLHead key) is read when
    /// `default_temperature` is given.
    pub fn read(
        c: &mut ComponentConfig,
        default_temperature: Option<f64>,
    ) -> Result<NonLocalCfg, ModelError> {
        let reduction = c.int("reduction", 2)?;
        let use_scale = c.flag("use_scale", true);
        let mode = match c.string("mode")?.unwrap_or("embedded_gaussian") {
            "gaussian" => PairwiseMode::Gaussian,
            "embedded_gaussian" => PairwiseMode::EmbeddedGaussian,
            "dot_product" => PairwiseMode::DotProduct,
            "concatenation" => PairwiseMode::Concatenation,
            other => {
                return Err(c.config_error(format!(
                    "mode must be 'gaussian', 'concatenation', 'embedded_gaussian' or 'dot_product', not '{other}'"
                )))
            }
        };
        if reduction <= 0 {
            return Err(c.config_error(format!("reduction must be positive, not {reduction}")));
        }
        let temperature = match default_temperature {
            Some(t) => Some(c.float("temperature", t)?),
            None => None,
        };
        Ok(NonLocalCfg {
            reduction,
            use_scale,
            mode,
            temperature,
        })
    }
}

/// mmcv's `NonLocal2d` (`sub_sample=False`), or MMSeg's
/// `DisentangledNonLocal2d` when built with a temperature.
pub struct NonLocal2d {
    g: ConvModule,
    conv_out: ConvModule,
    theta_phi: Option<(ConvModule, ConvModule)>,
    concat_project: Option<ConvModule>,
    /// `DisentangledNonLocal2d.conv_mask`, the unary branch.
    conv_mask: Option<Conv2d>,
    in_channels: i64,
    inter_channels: i64,
    cfg: NonLocalCfg,
}

impl NonLocal2d {
    /// Modules in `_NonLocalNd.__init__`'s order: g, conv_out, theta, phi,
    /// concat_project; then the disentangled block's conv_mask.
    pub fn new(
        p: &mut ParamScope,
        in_channels: i64,
        norm: Option<NormCfg>,
        cfg: &NonLocalCfg,
    ) -> NonLocal2d {
        let inter = (in_channels / cfg.reduction).max(1);
        let project = |p: &mut ParamScope, name: &str, from: i64, to: i64| {
            ConvModule::new(&mut p.sub(name), ConvSpec::new(from, to, 1), None, false)
        };
        let g = project(p, "g", in_channels, inter);
        let conv_out = ConvModule::new(
            &mut p.sub("conv_out"),
            ConvSpec::new(inter, in_channels, 1),
            norm,
            false,
        );
        let theta_phi = (cfg.mode != PairwiseMode::Gaussian).then(|| {
            (
                project(p, "theta", in_channels, inter),
                project(p, "phi", in_channels, inter),
            )
        });
        let concat_project = (cfg.mode == PairwiseMode::Concatenation).then(|| {
            ConvModule::with_conv_bias(
                &mut p.sub("concat_project"),
                ConvSpec::new(inter * 2, 1, 1),
                None,
                true,
                false,
            )
        });
        let conv_mask = cfg
            .temperature
            .map(|_| Conv2d::new(&mut p.sub("conv_mask"), ConvSpec::new(in_channels, 1, 1)));
        NonLocal2d {
            g,
            conv_out,
            theta_phi,
            concat_project,
            conv_mask,
            in_channels,
            inter_channels: inter,
            cfg: cfg.clone(),
        }
    }

    /// The `[B, HW, HW]` pairwise weights (`self.<mode>(theta_x, phi_x)`).
    fn pairwise(&self, theta_x: &Tensor, phi_x: &Tensor) -> Tensor {
        if self.cfg.mode == PairwiseMode::Concatenation {
            let (h, w) = (theta_x.size()[2], phi_x.size()[3]);
            let theta = theta_x.repeat([1, 1, 1, w]);
            let phi = phi_x.repeat([1, 1, h, 1]);
            let concat = Tensor::cat(&[&theta, &phi], 1); // [B, 2c, HW, HW]
            drop((theta, phi));
            let project = self.concat_project.as_ref().expect("built for this mode");
            let weights = project.forward(&concat, true); // [B, 1, HW, HW]
            let n = weights.size()[0];
            let mut weights = weights.view([n, h, w]);
            let _ = weights.divide_scalar_(w);
            return weights;
        }
        let s = theta_x.size();
        count_flops(2.0 * (s[0] * s[1] * s[1] * s[2]) as f64);
        let mut weights = theta_x.matmul(phi_x); // [B, HW, HW]
        match self.cfg.mode {
            PairwiseMode::DotProduct => {
                let n = weights.size()[2];
                let _ = weights.divide_scalar_(n);
                weights
            }
            _ => {
                let embedded = self.cfg.mode == PairwiseMode::EmbeddedGaussian;
                if embedded && self.cfg.use_scale {
                    let _ = weights.divide_scalar_((s[2] as f64).sqrt());
                }
                if let (true, Some(t)) = (embedded, self.cfg.temperature) {
                    let _ = weights.divide_scalar_(t);
                }
                let probs = weights.softmax(-1, None::<Kind>);
                softmax_saved(&weights, &probs);
                probs
            }
        }
    }
}

impl MidBlock for NonLocal2d {
    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        let s = x.size();
        let (n, h, w) = (s[0], s[2], s[3]);
        let inter = self.inter_channels;
        let g_x = self
            .g
            .forward(x, training)
            .view([n, inter, -1])
            .permute([0, 2, 1]); // [B, HW, c]
        let (mut theta_x, mut phi_x) = match (&self.theta_phi, self.cfg.mode) {
            (None, _) => (
                x.view([n, self.in_channels, -1]).permute([0, 2, 1]),
                x.view([n, self.in_channels, -1]),
            ),
            (Some((theta, phi)), PairwiseMode::Concatenation) => (
                theta.forward(x, training).view([n, inter, -1, 1]),
                phi.forward(x, training).view([n, inter, 1, -1]),
            ),
            (Some((theta, phi)), _) => (
                theta
                    .forward(x, training)
                    .view([n, inter, -1])
                    .permute([0, 2, 1]), // [B, HW, c]
                phi.forward(x, training).view([n, inter, -1]), // [B, c, HW]
            ),
        };
        if self.conv_mask.is_some() {
            // DisentangledNonLocal2d whitens the pairwise term in place.
            let theta_mean = theta_x.mean_dim(-2, true, None::<Kind>);
            let _ = theta_x.g_sub_(&theta_mean);
            let phi_mean = phi_x.mean_dim(-1, true, None::<Kind>);
            let _ = phi_x.g_sub_(&phi_mean);
        }
        let weights = self.pairwise(&theta_x, &phi_x);
        drop((theta_x, phi_x));
        let hw = h * w;
        count_flops(2.0 * (n * hw * hw * inter) as f64);
        // One chain: the matmul's [B, HW, c] output dies with the statement.
        let y = weights
            .matmul(&g_x)
            .permute([0, 2, 1])
            .contiguous()
            .reshape([n, inter, h, w]); // [B, c, H, W]
        drop(weights);
        let Some(conv_mask) = &self.conv_mask else {
            drop(g_x);
            return x + self.conv_out.forward(&y, training);
        };
        {
            let mask = conv_mask.forward(x).view([n, 1, -1]); // [B, 1, HW]
            let unary = mask.softmax(-1, None::<Kind>);
            softmax_saved(&mask, &unary);
            drop(mask);
            count_flops(2.0 * (n * hw * inter) as f64);
            let unary_x = unary
                .matmul(&g_x) // [B, 1, c]
                .permute([0, 2, 1])
                .contiguous()
                .reshape([n, inter, 1, 1]);
            // `y` stays a live local of the Python forward while conv_out runs.
            let summed = &y + unary_x;
            x + self.conv_out.forward(&summed, training)
        }
    }
}

#[cfg(test)]
#[path = "nl_head_tests.rs"]
mod tests;
