//! ERFNet's backbone, as MMSeg's `mmseg/models/backbones/erfnet.py` builds
//! it: an encoder of downsampler and factorised non-bottleneck blocks and a
//! decoder of transposed-conv upsamplers, one output map.
//!
//! Romera et al., "ERFNet: Efficient Residual Factorized ConvNet for
//! Real-time Semantic Segmentation", IEEE T-ITS 2018.
//!
//! The blocks are built with their own defaults (`dict(type='BN',
//! eps=1e-3)`, a non-inplace `ReLU`): MMSeg stores ERFNet's `norm_cfg`,
//! `act_cfg` and `conv_cfg` but does not pass them down.

use super::Backbone;
use crate::config::Dict;
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::{count_flops, dropout, resize_bilinear, BatchNorm2d, Conv2d, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/erfnet.py";

/// The norm of every block: `dict(type='BN', eps=1e-3)`, the blocks' default.
const BLOCK_BN: NormCfg = NormCfg {
    eps: 1e-3,
    ..NormCfg::BN_DEFAULT
};

/// The registry's constructor (`BACKBONES` row `ERFNet`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = ErfNetCfg::from_cfg(cfg)?;
    Ok(Box::new(ErfNet::new(p, &cfg)))
}

/// `ERFNet(in_channels=3, enc_downsample_channels=(16, 64, 128),
/// enc_stage_non_bottlenecks=(5, 8), enc_non_bottleneck_dilations=(2, 4, 8,
/// 16), enc_non_bottleneck_channels=(64, 128), dec_upsample_channels=(64,
/// 16), dec_stages_non_bottleneck=(2, 2), dec_non_bottleneck_channels=(64,
/// 16), dropout_ratio=0.1, ...)`. `enc_non_bottleneck_channels` and
/// `dec_upsample_channels` are only checked for their length, as MMSeg does.
#[derive(Debug, Clone, PartialEq)]
pub struct ErfNetCfg {
    pub in_channels: i64,
    pub enc_downsample_channels: Vec<i64>,
    pub enc_stage_non_bottlenecks: Vec<i64>,
    pub enc_non_bottleneck_dilations: Vec<i64>,
    pub dec_stages_non_bottleneck: Vec<i64>,
    pub dec_non_bottleneck_channels: Vec<i64>,
    pub dropout_ratio: f64,
}

impl ErfNetCfg {
    pub fn from_cfg(d: &Dict) -> Result<ErfNetCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "ERFNet", SOURCE);
        let cfg = ErfNetCfg {
            in_channels: c.int("in_channels", 3)?,
            enc_downsample_channels: c.ints("enc_downsample_channels", &[16, 64, 128])?,
            enc_stage_non_bottlenecks: c.ints("enc_stage_non_bottlenecks", &[5, 8])?,
            enc_non_bottleneck_dilations: c.ints("enc_non_bottleneck_dilations", &[2, 4, 8, 16])?,
            dec_stages_non_bottleneck: c.ints("dec_stages_non_bottleneck", &[2, 2])?,
            dec_non_bottleneck_channels: c.ints("dec_non_bottleneck_channels", &[64, 16])?,
            dropout_ratio: c.float("dropout_ratio", 0.1)?,
        };
        let enc_nb_channels = c.ints("enc_non_bottleneck_channels", &[64, 128])?;
        let dec_up_channels = c.ints("dec_upsample_channels", &[64, 16])?;
        let downsamples = cfg.enc_downsample_channels.len();
        // MMSeg's asserts, in its order and with its messages.
        let checks = [
            (
                downsamples == dec_up_channels.len() + 1,
                "Number of downsample block of encoder does not match number of upsample block of decoder!",
            ),
            (
                downsamples == cfg.enc_stage_non_bottlenecks.len() + 1,
                "Number of downsample block of encoder does not match number of Non-bottleneck block of encoder!",
            ),
            (
                downsamples == enc_nb_channels.len() + 1,
                "Number of downsample block of encoder does not match number of channels of Non-bottleneck block of encoder!",
            ),
            (
                cfg.enc_stage_non_bottlenecks.last().is_some_and(|n| {
                    !cfg.enc_non_bottleneck_dilations.is_empty()
                        && n % cfg.enc_non_bottleneck_dilations.len() as i64 == 0
                }),
                "Number of Non-bottleneck block of encoder does not match number of Non-bottleneck block of encoder!",
            ),
            (
                dec_up_channels.len() == cfg.dec_stages_non_bottleneck.len(),
                "Number of upsample block of decoder does not match number of Non-bottleneck block of decoder!",
            ),
            (
                cfg.dec_stages_non_bottleneck.len() == cfg.dec_non_bottleneck_channels.len(),
                "Number of Non-bottleneck block of decoder does not match number of channels of Non-bottleneck block of decoder!",
            ),
        ];
        if let Some((_, message)) = checks.iter().find(|(ok, _)| !ok) {
            return Err(c.config_error(message));
        }
        // Stored by ERFNet but never passed to its blocks, which take their
        // own defaults; init_cfg only sets initial values.
        c.inert(&["norm_cfg", "act_cfg", "conv_cfg", "init_cfg"]);
        c.finish()?;
        Ok(cfg)
    }
}

/// `nn.Conv2d` with a bias, stride 1, a `(3, 1)` or `(1, 3)` kernel and its
/// own padding and dilation per axis (the factorised convolutions).
struct FactorisedConv {
    weight: Tensor,
    bias: Tensor,
    padding: [i64; 2],
    dilation: [i64; 2],
}

impl FactorisedConv {
    fn new(p: &mut ParamScope, channels: i64, kernel: [i64; 2], dilation: [i64; 2]) -> Self {
        // Values as layers::Conv2d draws them; they do not change memory.
        let std = (2.0 / (kernel[0] * kernel[1] * channels) as f64).sqrt();
        let weight = p.param_normal("weight", &[channels, channels, kernel[0], kernel[1]], std);
        let bias = p.param_zeros("bias", &[channels]);
        let padding = [dilation[0] * (kernel[0] / 2), dilation[1] * (kernel[1] / 2)];
        FactorisedConv {
            weight,
            bias,
            padding,
            dilation,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let s = x.size(); // [B, C, H, W]; the padding keeps H and W
        let ws = self.weight.size();
        count_flops(2.0 * (s[0] * ws[0] * ws[1] * ws[2] * ws[3]) as f64 * (s[2] * s[3]) as f64);
        x.conv2d(
            &self.weight,
            Some(&self.bias),
            [1, 1],
            self.padding,
            self.dilation,
            1,
        )
    }
}

/// `DownsamplerBlock`: a stride-2 3x3 conv to `out - in` channels,
/// concatenated with the 2x2 max-pooled input, then BN and ReLU.
struct Downsampler {
    conv: Conv2d,
    bn: BatchNorm2d,
}

impl Downsampler {
    fn new(p: &mut ParamScope, in_channels: i64, out_channels: i64) -> Self {
        Downsampler {
            conv: Conv2d::new(
                &mut p.sub("conv"),
                ConvSpec::new(in_channels, out_channels - in_channels, 3)
                    .stride(2)
                    .padding(1),
            ),
            bn: BatchNorm2d::from_cfg(&mut p.sub("bn"), out_channels, &BLOCK_BN),
        }
    }

    fn forward(&self, input: &Tensor, training: bool) -> Tensor {
        let conv_out = self.conv.forward(input); // [B, out - in, H/2, W/2]
        let mut pool_out = input.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false);
        let size = (conv_out.size()[2], conv_out.size()[3]);
        // mmseg's resize runs F.interpolate even to the same size: a copy.
        pool_out = resize_bilinear(&pool_out, size, false); // [B, in, H/2, W/2]
        let mut output = Tensor::cat(&[&conv_out, &pool_out], 1); // [B, out, H/2, W/2]
        output = self.bn.forward(&output, training);
        output = output.relu();
        // conv_out and pool_out are locals until return.
        drop((conv_out, pool_out));
        output
    }
}

/// `NonBottleneck1d` (two conv layers): per layer a 3x1 conv, ReLU, a 1x3
/// conv, BN, then ReLU (first layer) or `nn.Dropout` (second; the
/// second layer's convs dilated); `relu(output + input)`.
struct NonBottleneck {
    /// `convs_layers.{0, 5}` (3x1) and `convs_layers.{2, 7}` (1x3).
    convs: [(FactorisedConv, FactorisedConv); 2],
    /// `convs_layers.{3, 8}`.
    bns: [BatchNorm2d; 2],
    drop_rate: f64,
}

impl NonBottleneck {
    fn new(p: &mut ParamScope, channels: i64, drop_rate: f64, dilation: i64) -> Self {
        let mut layer = |first: usize, d: i64| {
            let mut convs = p.sub("convs_layers");
            let a = FactorisedConv::new(&mut convs.sub(first), channels, [3, 1], [d, 1]);
            let b = FactorisedConv::new(&mut convs.sub(first + 2), channels, [1, 3], [1, d]);
            let bn = BatchNorm2d::from_cfg(&mut convs.sub(first + 3), channels, &BLOCK_BN);
            ((a, b), bn)
        };
        let (convs0, bn0) = layer(0, 1);
        let (convs1, bn1) = layer(5, dilation);
        NonBottleneck {
            convs: [convs0, convs1],
            bns: [bn0, bn1],
            drop_rate,
        }
    }

    fn forward(&self, input: &Tensor, training: bool) -> Tensor {
        let mut output = input.shallow_clone(); // [B, C, H, W] throughout
        for (i, ((conv_a, conv_b), bn)) in self.convs.iter().zip(&self.bns).enumerate() {
            output = conv_a.forward(&output);
            output = output.relu();
            output = conv_b.forward(&output);
            output = bn.forward(&output, training);
            output = if i == 0 {
                output.relu()
            } else {
                dropout(&output, self.drop_rate, training)
            };
        }
        // self.act(output + input): the sum is freed once the ReLU returns.
        let sum = &output + input;
        let result = sum.relu();
        drop((sum, output));
        result
    }
}

/// `UpsamplerBlock`: `nn.ConvTranspose2d(in, out, 3, stride=2, padding=1,
/// output_padding=1)`, BN, ReLU.
struct Upsampler {
    weight: Tensor,
    bias: Tensor,
    bn: BatchNorm2d,
}

impl Upsampler {
    fn new(p: &mut ParamScope, in_channels: i64, out_channels: i64) -> Self {
        // The values (nn.ConvTranspose2d's kaiming-uniform bound) do not
        // change memory or speed.
        let bound = 1.0 / ((out_channels * 9) as f64).sqrt();
        let mut conv = p.sub("conv");
        let weight = conv.param_uniform("weight", &[in_channels, out_channels, 3, 3], bound);
        let bias = conv.param_uniform("bias", &[out_channels], bound);
        let bn = BatchNorm2d::from_cfg(&mut p.sub("bn"), out_channels, &BLOCK_BN);
        Upsampler { weight, bias, bn }
    }

    fn forward(&self, input: &Tensor, training: bool) -> Tensor {
        let s = input.size(); // [B, C_in, H, W]
        let ws = self.weight.size();
        count_flops(2.0 * (s[0] * ws[0] * ws[1] * ws[2] * ws[3]) as f64 * (s[2] * s[3]) as f64);
        let mut output = input.conv_transpose2d(
            &self.weight,
            Some(&self.bias),
            [2, 2],
            [1, 1],
            [1, 1],
            1,
            [1, 1],
        ); // [B, C_out, 2H, 2W]
        output = self.bn.forward(&output, training);
        output.relu()
    }
}

/// One entry of ERFNet's `encoder` or `decoder` `nn.ModuleList`.
enum Block {
    Down(Downsampler),
    NonBottleneck(Box<NonBottleneck>),
    Up(Upsampler),
}

impl Block {
    fn forward(&self, x: &Tensor, training: bool) -> Tensor {
        match self {
            Block::Down(b) => b.forward(x, training),
            Block::NonBottleneck(b) => b.forward(x, training),
            Block::Up(b) => b.forward(x, training),
        }
    }
}

pub struct ErfNet {
    encoder: Vec<Block>,
    decoder: Vec<Block>,
}

impl ErfNet {
    pub fn new(p: &mut ParamScope, c: &ErfNetCfg) -> ErfNet {
        let encoder = Self::encoder_blocks(c)
            .into_iter()
            .enumerate()
            .map(|(i, spec)| spec.build(&mut p.sub("encoder").sub(i)))
            .collect();
        let decoder = Self::decoder_blocks(c)
            .into_iter()
            .enumerate()
            .map(|(i, spec)| spec.build(&mut p.sub("decoder").sub(i)))
            .collect();
        ErfNet { encoder, decoder }
    }

    /// The encoder's blocks in MMSeg's order: a downsampler, then per later
    /// downsampler its non-bottleneck blocks (the last stage's dilated, the
    /// dilations cycled).
    fn encoder_blocks(c: &ErfNetCfg) -> Vec<BlockSpec> {
        let ds = &c.enc_downsample_channels;
        let mut blocks = vec![BlockSpec::Down(c.in_channels, ds[0])];
        for i in 0..ds.len() - 1 {
            blocks.push(BlockSpec::Down(ds[i], ds[i + 1]));
            if i == ds.len() - 2 {
                let dilations = &c.enc_non_bottleneck_dilations;
                let last = c.enc_stage_non_bottlenecks[c.enc_stage_non_bottlenecks.len() - 1];
                let rounds = last / dilations.len() as i64;
                for _ in 0..rounds {
                    for &d in dilations {
                        blocks.push(BlockSpec::NonBottleneck(
                            ds[ds.len() - 1],
                            c.dropout_ratio,
                            d,
                        ));
                    }
                }
            } else {
                for _ in 0..c.enc_stage_non_bottlenecks[i] {
                    blocks.push(BlockSpec::NonBottleneck(ds[i + 1], c.dropout_ratio, 1));
                }
            }
        }
        blocks
    }

    /// The decoder's blocks: per stage an upsampler and its non-bottleneck
    /// blocks (no dropout, no dilation).
    fn decoder_blocks(c: &ErfNetCfg) -> Vec<BlockSpec> {
        let channels = &c.dec_non_bottleneck_channels;
        let mut blocks = Vec::new();
        for (i, &stages) in c.dec_stages_non_bottleneck.iter().enumerate() {
            let from = match i {
                0 => c.enc_downsample_channels[c.enc_downsample_channels.len() - 1],
                _ => channels[i - 1],
            };
            blocks.push(BlockSpec::Up(from, channels[i]));
            for _ in 0..stages {
                blocks.push(BlockSpec::NonBottleneck(channels[i], 0.0, 1));
            }
        }
        blocks
    }
}

/// A block's constructor arguments.
enum BlockSpec {
    /// `DownsamplerBlock(in_channels, out_channels)`.
    Down(i64, i64),
    /// `NonBottleneck1d(channels, drop_rate, dilation)`.
    NonBottleneck(i64, f64, i64),
    /// `UpsamplerBlock(in_channels, out_channels)`.
    Up(i64, i64),
}

impl BlockSpec {
    fn build(&self, p: &mut ParamScope) -> Block {
        match *self {
            BlockSpec::Down(from, to) => Block::Down(Downsampler::new(p, from, to)),
            BlockSpec::NonBottleneck(channels, drop, dilation) => {
                Block::NonBottleneck(Box::new(NonBottleneck::new(p, channels, drop, dilation)))
            }
            BlockSpec::Up(from, to) => Block::Up(Upsampler::new(p, from, to)),
        }
    }
}

impl Backbone for ErfNet {
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let mut x = x.shallow_clone(); // [B, 3, H, W]
        {
            let _part = crate::models::scope::enter("encoder");
            for block in &self.encoder {
                x = block.forward(&x, training);
            }
        } // [B, enc_downsample_channels[-1], H/8, W/8]
        {
            let _part = crate::models::scope::enter("decoder");
            for block in &self.decoder {
                x = block.forward(&x, training);
            }
        } // [B, dec_non_bottleneck_channels[-1], H/2, W/2]
        vec![x]
    }
}

#[cfg(test)]
#[path = "erfnet_tests.rs"]
mod tests;
