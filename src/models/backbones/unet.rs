//! UNet, as MMSeg's `mmseg/models/backbones/unet.py` builds it, with the
//! decoder block of `mmseg/models/utils/up_conv_block.py`.
//!
//! Ronneberger, Fischer and Brox, "U-Net: Convolutional Networks for
//! Biomedical Image Segmentation", MICCAI 2015, arXiv:1505.04597.
//!
//! Encoder: `num_stages` stages (`encoder.<i>`, an `nn.Sequential` of an
//! optional `MaxPool2d(2)` then a [`BasicConvBlock`]: `enc_num_convs[i]` 3x3
//! ConvModules with `base_channels * 2^i` channels). Decoder: one
//! [`UpConvBlock`] per stage after the first (`decoder.<i>`, run from the
//! deepest): the deeper map upsampled to the skip's channels ([`InterpConv`]:
//! bilinear x2 then a 1x1 ConvModule; or [`DeconvModule`]: a transposed conv,
//! BN and ReLU; or a 1x1 ConvModule where the stage did not downsample),
//! concatenated after the encoder's skip map, then a [`BasicConvBlock`].
//!
//! The outputs are MMSeg's `dec_outs`: the deepest encoder map, then each
//! decoder output from the coarsest to the finest (`num_stages` maps, the
//! last at the input's resolution with `base_channels` channels).
//!
//! The input's height and width must be divisible by the whole downsample
//! rate (2 per stage that max-pools or strides); MMSeg asserts it in
//! `UNet._check_input_divisible` at forward time, and so does
//! [`UNet::forward`] (a panic with MMSeg's message, which a trial reports as
//! its failure). [`UNetCfg::whole_downsample_rate`] gives the rate for a
//! check before any forward.

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::{ComponentConfig, NormCfg};
use crate::models::layers::{resize_bilinear, BatchNorm2d, ConvModule, ConvSpec, ConvTranspose2d};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/backbones/unet.py";

/// The registry's constructor (`BACKBONES` row `UNet`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = UNetCfg::from_cfg(cfg)?;
    Ok(Box::new(UNet::new(p, &cfg)))
}

/// The decoder's upsampling module (`upsample_cfg`), built by mmcv's
/// `build_upsample_layer` with the remaining keys of the dict as keyword
/// arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum UpsampleCfg {
    /// `InterpConv(...)`.
    InterpConv(InterpConvCfg),
    /// `DeconvModule(kernel_size=4, scale_factor=2)`.
    DeconvModule { kernel_size: i64, scale_factor: i64 },
}

/// `InterpConv(conv_first=False, kernel_size=1, stride=1, padding=0,
/// upsample_cfg=dict(scale_factor=2, mode='bilinear', align_corners=False))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InterpConvCfg {
    pub conv_first: bool,
    pub kernel_size: i64,
    pub stride: i64,
    pub padding: i64,
    /// mmseg's `Upsample` (bilinear only): `scale_factor`, `align_corners`.
    pub scale_factor: f64,
    pub align_corners: bool,
}

impl Default for InterpConvCfg {
    fn default() -> Self {
        InterpConvCfg {
            conv_first: false,
            kernel_size: 1,
            stride: 1,
            padding: 0,
            scale_factor: 2.0,
            align_corners: false,
        }
    }
}

impl UpsampleCfg {
    fn from_cfg(v: Option<&Value>) -> Result<UpsampleCfg, ModelError> {
        let d = match v {
            None => {
                return Ok(UpsampleCfg::InterpConv(InterpConvCfg::default()))
            }
            Some(Value::Dict(d)) => d,
            Some(other) => {
                return Err(ModelError::unsupported_in(
                    "UNet",
                    SOURCE,
                    "upsample_cfg",
                    format!(
                        "{} (only dict(type='InterpConv') and dict(type='DeconvModule') are implemented)",
                        other.type_name()
                    ),
                ))
            }
        };
        match d.get("type").and_then(Value::as_str) {
            Some("InterpConv") => {
                let mut c = ComponentConfig::new(d, "InterpConv", SOURCE);
                let conv_first = c.flag("conv_first", false);
                let kernel_size = c.int("kernel_size", 1)?;
                let stride = c.int("stride", 1)?;
                let padding = c.int("padding", 0)?;
                c.unimplemented("conv_cfg", &Value::None)?;
                let (scale_factor, align_corners) = match c.value("upsample_cfg") {
                    None => (2.0, false),
                    Some(Value::Dict(u)) => interp_upsample(u)?,
                    Some(other) => {
                        return Err(c.config_error(format!(
                            "`upsample_cfg` must be a dict, not {}",
                            other.type_name()
                        )))
                    }
                };
                c.finish()?;
                Ok(UpsampleCfg::InterpConv(InterpConvCfg {
                    conv_first,
                    kernel_size,
                    stride,
                    padding,
                    scale_factor,
                    align_corners,
                }))
            }
            Some("DeconvModule") => {
                let mut c = ComponentConfig::new(d, "DeconvModule", SOURCE);
                let kernel_size = c.int("kernel_size", 4)?;
                let scale_factor = c.int("scale_factor", 2)?;
                c.finish()?;
                // DeconvModule.__init__'s assertion.
                if kernel_size < scale_factor || (kernel_size - scale_factor) % 2 != 0 {
                    return Err(ModelError::config("DeconvModule", format!(
                        "kernel_size should be greater than or equal to scale_factor and (kernel_size - scale_factor) should be even numbers, while the kernel size is {kernel_size} and scale_factor is {scale_factor}"
                    )));
                }
                Ok(UpsampleCfg::DeconvModule {
                    kernel_size,
                    scale_factor,
                })
            }
            other => Err(ModelError::unsupported_in(
                "UNet",
                SOURCE,
                "upsample_cfg",
                format!(
                    "type {} (only InterpConv and DeconvModule are implemented)",
                    other.map_or("None".to_string(), |t| format!("'{t}'"))
                ),
            )),
        }
    }
}

/// InterpConv's `upsample_cfg`: the arguments of mmseg's `Upsample(size=None,
/// scale_factor=None, mode='nearest', align_corners=None)`.
fn interp_upsample(u: &Dict) -> Result<(f64, bool), ModelError> {
    let mut c = ComponentConfig::new(u, "Upsample", "mmseg/models/utils/wrappers.py");
    c.unimplemented("size", &Value::None)?;
    let scale_factor = match c.value("scale_factor") {
        Some(v @ (Value::Int(_) | Value::Float(_))) => v.as_f64().unwrap_or(0.0),
        _ => {
            return Err(c.unsupported(
                "scale_factor",
                "only a number is implemented (with size=None)",
            ))
        }
    };
    if scale_factor.is_nan() || scale_factor <= 0.0 {
        return Err(c.config_error("`scale_factor` must be positive"));
    }
    match c.string("mode")? {
        Some("bilinear") => {}
        other => {
            return Err(c.unsupported(
                "mode",
                format!(
                    "'{}' (only 'bilinear' is implemented)",
                    other.unwrap_or("nearest")
                ),
            ))
        }
    }
    // F.interpolate takes align_corners=None as False for bilinear.
    let align_corners = c.flag("align_corners", false);
    c.finish()?;
    Ok((scale_factor, align_corners))
}

/// The backbone's settings (`model.backbone` of the config), with the
/// defaults of `UNet.__init__`.
#[derive(Debug, Clone, PartialEq)]
pub struct UNetCfg {
    pub in_channels: i64,
    pub base_channels: i64,
    pub num_stages: usize,
    pub strides: Vec<i64>,
    pub enc_num_convs: Vec<i64>,
    pub dec_num_convs: Vec<i64>,
    pub downsamples: Vec<bool>,
    pub enc_dilations: Vec<i64>,
    pub dec_dilations: Vec<i64>,
    /// `None`: `norm_cfg=None` (convs with a bias, no norm).
    pub norm: Option<NormCfg>,
    /// The ReLU of the DeconvModule is built by `build_activation_layer`,
    /// whose `inplace` defaults to False (ConvModule's to True).
    pub act_inplace: Option<bool>,
    pub upsample: UpsampleCfg,
    pub norm_eval: bool,
}

impl UNetCfg {
    pub fn from_cfg(cfg: &Dict) -> Result<UNetCfg, ModelError> {
        let mut r = ComponentConfig::new(cfg, "UNet", SOURCE);
        let num_stages = r.int("num_stages", 5)?;
        if num_stages < 1 {
            return Err(r.config_error("num_stages must be at least 1"));
        }
        let norm = r.batch_norm_or_bn("norm_cfg")?;
        let c = UNetCfg {
            in_channels: r.int("in_channels", 3)?,
            base_channels: r.int("base_channels", 64)?,
            num_stages: num_stages as usize,
            strides: r.ints("strides", &[1, 1, 1, 1, 1])?,
            enc_num_convs: r.ints("enc_num_convs", &[2, 2, 2, 2, 2])?,
            dec_num_convs: r.ints("dec_num_convs", &[2, 2, 2, 2])?,
            downsamples: r
                .ints("downsamples", &[1, 1, 1, 1])?
                .into_iter()
                .map(|d| d != 0)
                .collect(),
            enc_dilations: r.ints("enc_dilations", &[1, 1, 1, 1, 1])?,
            dec_dilations: r.ints("dec_dilations", &[1, 1, 1, 1])?,
            norm,
            act_inplace: match r.value("act_cfg").and_then(Value::as_dict) {
                Some(a) => a.get("inplace").map(Value::truthy),
                None => None,
            },
            upsample: UpsampleCfg::from_cfg(r.value("upsample_cfg"))?,
            norm_eval: r.flag("norm_eval", false),
        };
        r.default_activation("act_cfg", "ReLU")?;
        if c.act_inplace == Some(false) {
            return Err(r.unsupported(
                "act_cfg",
                "inplace=False (only ConvModule's default in-place ReLU is implemented)",
            ));
        }
        r.unimplemented("with_cp", &Value::Bool(false))?;
        r.unimplemented("conv_cfg", &Value::None)?;
        r.unimplemented("dcn", &Value::None)?;
        r.unimplemented("plugins", &Value::None)?;
        let pretrained = r.value("pretrained").is_some_and(Value::truthy);
        let init_cfg = r.value("init_cfg").is_some_and(Value::truthy);
        if pretrained && init_cfg {
            return Err(
                r.config_error("init_cfg and pretrained cannot be setting at the same time")
            );
        }
        r.inert(&["pretrained", "init_cfg"]);
        r.finish()?;
        // UNet.__init__'s assertions.
        let n = c.num_stages;
        for (name, len, want) in [
            ("strides", c.strides.len(), n),
            ("enc_num_convs", c.enc_num_convs.len(), n),
            ("dec_num_convs", c.dec_num_convs.len(), n - 1),
            ("downsamples", c.downsamples.len(), n - 1),
            ("enc_dilations", c.enc_dilations.len(), n),
            ("dec_dilations", c.dec_dilations.len(), n - 1),
        ] {
            if len != want {
                return Err(ModelError::config(
                    "UNet",
                    format!("the length of {name} should be {want} (num_stages={n}), not {len}"),
                ));
            }
        }
        if c.norm.is_none() && matches!(c.upsample, UpsampleCfg::DeconvModule { .. }) {
            return Err(ModelError::config(
                "UNet",
                "DeconvModule needs a norm_cfg (build_norm_layer(None) fails)",
            ));
        }
        Ok(c)
    }

    /// Whether stage `i` (>= 1) halves the map (a stride or a max-pool),
    /// as `UNet.__init__` decides the decoder's `upsample`.
    fn downsamples_at(&self, i: usize) -> bool {
        self.strides[i] != 1 || self.downsamples[i - 1]
    }

    /// `UNet._check_input_divisible`'s rate: the input's height and width
    /// must be multiples of it.
    pub fn whole_downsample_rate(&self) -> i64 {
        (1..self.num_stages)
            .filter(|&i| self.strides[i] == 2 || self.downsamples[i - 1])
            .fold(1, |rate, _| rate * 2)
    }
}

/// `BasicConvBlock`: `num_convs` 3x3 ConvModules (`convs.<j>`), the first
/// with the block's stride and no dilation, the others dilated.
pub struct BasicConvBlock {
    convs: Vec<ConvModule>,
}

impl BasicConvBlock {
    /// `p`: the block (`encoder.<i>.<k>`, `decoder.<i>.conv_block`).
    fn new(
        p: &mut ParamScope,
        c: &UNetCfg,
        in_channels: i64,
        out_channels: i64,
        num_convs: i64,
        stride: i64,
        dilation: i64,
    ) -> BasicConvBlock {
        let mut cp = p.sub("convs");
        let convs = (0..num_convs)
            .map(|j| {
                let spec = if j == 0 {
                    ConvSpec::new(in_channels, out_channels, 3)
                        .stride(stride)
                        .padding(1)
                } else {
                    ConvSpec::new(out_channels, out_channels, 3)
                        .padding(dilation)
                        .dilation(dilation)
                };
                ConvModule::new(&mut cp.sub(j), spec, c.norm, true)
            })
            .collect();
        BasicConvBlock { convs }
    }

    /// `bn_training`: BN in training mode (`training and not norm_eval`).
    fn forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        // nn.Sequential rebinds its input: each intermediate dies when the next exists.
        let mut x = x.shallow_clone();
        for conv in &self.convs {
            x = conv.forward(&x, bn_training);
        }
        x
    }
}

/// `InterpConv`: mmseg's `Upsample` (`F.interpolate` to
/// `int(size * scale_factor)`) and a ConvModule, in `interp_upsample`
/// (`nn.Sequential(upsample, conv)`, or `(conv, upsample)` with
/// `conv_first`).
pub struct InterpConv {
    conv: ConvModule,
    conv_first: bool,
    scale_factor: f64,
    align_corners: bool,
}

impl InterpConv {
    fn upsample(&self, x: &Tensor) -> Tensor {
        let s = x.size();
        // Python: [int(t * self.scale_factor) for t in x.shape[-2:]]
        let size = |t: i64| (t as f64 * self.scale_factor) as i64;
        resize_bilinear(x, (size(s[2]), size(s[3])), self.align_corners)
    }

    fn forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        if self.conv_first {
            let y = self.conv.forward(x, bn_training);
            self.upsample(&y)
        } else {
            let y = self.upsample(x);
            self.conv.forward(&y, bn_training)
        }
    }
}

/// `DeconvModule`: `deconv_upsamping = nn.Sequential(ConvTranspose2d, BN,
/// ReLU)`, the ReLU from `build_activation_layer` (not in place unless
/// `act_cfg` says so).
pub struct DeconvModule {
    deconv: ConvTranspose2d,
    bn: BatchNorm2d,
    relu_inplace: bool,
}

impl DeconvModule {
    fn forward(&self, x: &Tensor, bn_training: bool) -> Tensor {
        let y = self.deconv.forward(x);
        let y = self.bn.forward(&y, bn_training);
        if self.relu_inplace {
            let mut y = y;
            let _ = y.relu_();
            y
        } else {
            y.relu()
        }
    }
}

/// `UpConvBlock.upsample`.
enum Upsample {
    Interp(InterpConv),
    Deconv(DeconvModule),
    /// A 1x1 ConvModule where the encoder stage did not downsample.
    Conv(ConvModule),
}

/// `UpConvBlock` (`mmseg/models/utils/up_conv_block.py`): upsample the
/// deeper map to `skip_channels`, `torch.cat([skip, x], dim=1)`, then a
/// [`BasicConvBlock`] (`conv_block`).
pub struct UpConvBlock {
    conv_block: BasicConvBlock,
    upsample: Upsample,
}

impl UpConvBlock {
    /// `p`: `decoder.<i - 1>` for encoder stage `i`.
    fn new(p: &mut ParamScope, c: &UNetCfg, i: usize) -> UpConvBlock {
        let in_channels = c.base_channels << i;
        let skip = c.base_channels << (i - 1);
        // Registered first: conv_block, then upsample.
        let conv_block = BasicConvBlock::new(
            &mut p.sub("conv_block"),
            c,
            2 * skip,
            skip,
            c.dec_num_convs[i - 1],
            1,
            c.dec_dilations[i - 1],
        );
        let mut up = p.sub("upsample");
        let upsample = if !c.downsamples_at(i) {
            Upsample::Conv(ConvModule::new(
                &mut up,
                ConvSpec::new(in_channels, skip, 1),
                c.norm,
                true,
            ))
        } else {
            match &c.upsample {
                UpsampleCfg::InterpConv(ic) => {
                    let index = if ic.conv_first { 0 } else { 1 };
                    let spec = ConvSpec::new(in_channels, skip, ic.kernel_size)
                        .stride(ic.stride)
                        .padding(ic.padding);
                    let conv = ConvModule::new(
                        &mut up.sub("interp_upsample").sub(index),
                        spec,
                        c.norm,
                        true,
                    );
                    Upsample::Interp(InterpConv {
                        conv,
                        conv_first: ic.conv_first,
                        scale_factor: ic.scale_factor,
                        align_corners: ic.align_corners,
                    })
                }
                UpsampleCfg::DeconvModule {
                    kernel_size,
                    scale_factor,
                } => {
                    let mut seq = up.sub("deconv_upsamping");
                    let deconv = ConvTranspose2d::new(
                        &mut seq.sub(0),
                        in_channels,
                        skip,
                        *kernel_size,
                        *scale_factor,
                        (kernel_size - scale_factor) / 2,
                    );
                    let n = c
                        .norm
                        .expect("UNetCfg::from_cfg refuses DeconvModule without norm");
                    let bn =
                        BatchNorm2d::new(&mut seq.sub(1), skip, n.eps, n.momentum, n.requires_grad);
                    Upsample::Deconv(DeconvModule {
                        deconv,
                        bn,
                        relu_inplace: c.act_inplace.unwrap_or(false),
                    })
                }
            }
        };
        UpConvBlock {
            conv_block,
            upsample,
        }
    }

    /// `forward(skip, x)`: `[B, skip, 2h, 2w]` from the skip map and the
    /// deeper `[B, in, h, w]` map.
    fn forward(&self, skip: &Tensor, x: &Tensor, bn_training: bool) -> Tensor {
        let x = match &self.upsample {
            Upsample::Interp(m) => m.forward(x, bn_training),
            Upsample::Deconv(m) => m.forward(x, bn_training),
            Upsample::Conv(m) => m.forward(x, bn_training),
        }; // [B, skip, 2h, 2w]
        let out = Tensor::cat(&[skip, &x], 1); // [B, 2 * skip, 2h, 2w]
        self.conv_block.forward(&out, bn_training)
    }
}

/// `encoder.<i>`: `nn.Sequential([MaxPool2d(2)], BasicConvBlock)`.
struct EncoderStage {
    max_pool: bool,
    block: BasicConvBlock,
}

/// The UNet backbone.
pub struct UNet {
    encoder: Vec<EncoderStage>,
    /// `decoder[i]` joins encoder stage `i + 1` to stage `i`.
    decoder: Vec<UpConvBlock>,
    norm_eval: bool,
    strides: Vec<i64>,
    downsamples: Vec<bool>,
    whole_downsample_rate: i64,
}

impl UNet {
    pub fn new(p: &mut ParamScope, c: &UNetCfg) -> UNet {
        // named_parameters(): all of `encoder`, then all of `decoder` (MMSeg
        // builds them interleaved, but registers `encoder` first).
        let mut encoder = Vec::new();
        let mut ep = p.sub("encoder");
        let mut in_channels = c.in_channels;
        for i in 0..c.num_stages {
            let max_pool = i != 0 && c.strides[i] == 1 && c.downsamples[i - 1];
            let out_channels = c.base_channels << i;
            let block = BasicConvBlock::new(
                &mut ep.sub(i).sub(if max_pool { 1 } else { 0 }),
                c,
                in_channels,
                out_channels,
                c.enc_num_convs[i],
                c.strides[i],
                c.enc_dilations[i],
            );
            encoder.push(EncoderStage { max_pool, block });
            in_channels = out_channels;
        }
        let mut dp = p.sub("decoder");
        let decoder = (1..c.num_stages)
            .map(|i| UpConvBlock::new(&mut dp.sub(i - 1), c, i))
            .collect();
        UNet {
            encoder,
            decoder,
            norm_eval: c.norm_eval,
            strides: c.strides.clone(),
            downsamples: c.downsamples.clone(),
            whole_downsample_rate: c.whole_downsample_rate(),
        }
    }

    /// `_check_input_divisible`, with MMSeg's message.
    fn check_input_divisible(&self, x: &Tensor) {
        let s = x.size();
        let (h, w) = (s[s.len() - 2], s[s.len() - 1]);
        let rate = self.whole_downsample_rate;
        if h % rate != 0 || w % rate != 0 {
            let py_bools: Vec<&str> = self
                .downsamples
                .iter()
                .map(|d| if *d { "True" } else { "False" })
                .collect();
            panic!(
                "UNet: The input image size ({h}, {w}) should be divisible by the whole downsample rate {rate}, when num_stages is {}, strides is {:?}, and downsamples is [{}]",
                self.encoder.len(),
                self.strides,
                py_bools.join(", ")
            );
        }
    }
}

impl Backbone for UNet {
    /// MMSeg's `dec_outs`: `[B, base * 2^(n-1), H / r, W / r]` (the deepest
    /// encoder map), then each decoder output up to `[B, base, H, W]`.
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        self.check_input_divisible(x);
        // UNet.train(): with norm_eval, every BN stays in eval mode.
        let bn_training = training && !self.norm_eval;
        let mut enc_outs = Vec::with_capacity(self.encoder.len());
        let mut x = x.shallow_clone(); // [B, C_in, H, W]
        for stage in &self.encoder {
            if stage.max_pool {
                // nn.MaxPool2d(kernel_size=2): stride 2, no padding.
                x = x.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false);
            }
            x = stage.block.forward(&x, bn_training); // [B, base * 2^i, h_i, w_i]
            enc_outs.push(x.shallow_clone());
        }
        let mut dec_outs = vec![x.shallow_clone()];
        for (i, block) in self.decoder.iter().enumerate().rev() {
            x = block.forward(&enc_outs[i], &x, bn_training); // [B, base * 2^i, h_i, w_i]
            dec_outs.push(x.shallow_clone());
        }
        dec_outs
    }
}

#[cfg(test)]
#[path = "unet_tests.rs"]
mod tests;
