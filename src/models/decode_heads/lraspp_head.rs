//! `LRASPPHead` (Lite R-ASPP), as MMSeg's
//! `mmseg/models/decode_heads/lraspp_head.py` builds it.
//!
//! Howard et al., "Searching for MobileNetV3", ICCV 2019, arXiv:1905.02244.
//!
//! On the last selected map, a 1x1 ConvModule (`aspp_conv`) times a
//! sigmoid gate (`image_pool`: a 49x49 average pool with stride (16, 20)
//! and a bias-free 1x1 conv with a sigmoid, bilinearly resized back), then a
//! 1x1 conv (`conv_up_input`); then, from the last branch to the first, the
//! map resized to the branch's input, concatenated with the branch's 1x1
//! conv of it (`convs`) and fused by a 1x1 ConvModule (`conv_ups`).
//! MMSeg's pool needs a last map of at least 49x49 (a crop of 392 at
//! output stride 8); smaller inputs fail as they fail in PyTorch.

use super::decode_head::{BaseHead, DecodeHeadBase, DecodeHeadCfg, InputTransform};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{resize_bilinear, Conv2d, ConvModule, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/decode_heads/lraspp_head.py";

/// `image_pool`'s `nn.AvgPool2d(kernel_size=49, stride=(16, 20))`.
const POOL_KERNEL: i64 = 49;
const POOL_STRIDE: [i64; 2] = [16, 20];

/// The registry's constructor (`DECODE_HEADS` row `LRASPPHead`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let cfg = LrasppHeadCfg::from_cfg(cfg)?;
    Ok(Box::new(LrasppHead::new(p, cfg)))
}

/// `LRASPPHead(branch_channels=(32, 64), **kwargs)`.
#[derive(Debug, Clone, PartialEq)]
pub struct LrasppHeadCfg {
    pub head: DecodeHeadCfg,
    pub branch_channels: Vec<i64>,
}

impl LrasppHeadCfg {
    pub fn from_cfg(d: &Dict) -> Result<LrasppHeadCfg, ModelError> {
        let mut c = ComponentConfig::new(d, "LRASPPHead", SOURCE);
        let branch_channels = c.ints("branch_channels", &[32, 64])?;
        let head = DecodeHeadCfg::from_cfg(&mut c, None)?;
        if head.input_transform != InputTransform::MultipleSelect {
            return Err(c.config_error(
                "in Lite R-ASPP (LRASPP) head, input_transform must be 'multiple_select'",
            ));
        }
        if branch_channels.len() + 1 != head.in_channels.len() {
            // `assert len(branch_channels) == len(self.in_channels) - 1`.
            return Err(c.config_error("len(branch_channels) must be len(in_channels) - 1"));
        }
        if head.in_channels.len() < 3 {
            // `image_pool` reads `self.in_channels[2]`.
            return Err(c.config_error("image_pool takes in_channels[2]: IndexError"));
        }
        c.finish()?;
        Ok(LrasppHeadCfg {
            head,
            branch_channels,
        })
    }
}

pub struct LrasppHead {
    base: DecodeHeadBase,
    convs: Vec<Conv2d>,
    conv_ups: Vec<ConvModule>,
    conv_up_input: Conv2d,
    aspp_conv: ConvModule,
    image_pool_conv: Conv2d,
}

impl LrasppHead {
    pub fn new(p: &mut ParamScope, cfg: LrasppHeadCfg) -> LrasppHead {
        let LrasppHeadCfg {
            head,
            branch_channels,
        } = cfg;
        let (channels, norm) = (head.channels, head.norm);
        let in_channels = head.in_channels.clone();
        let base = DecodeHeadBase::new(p, head);
        let mut cp = p.sub("convs");
        let convs = branch_channels
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                let spec = ConvSpec::new(in_channels[i], b, 1).bias(false);
                Conv2d::new(&mut cp.sub(format!("conv{i}")), spec)
            })
            .collect();
        let mut up = p.sub("conv_ups");
        let conv_ups = branch_channels
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                let spec = ConvSpec::new(channels + b, channels, 1);
                ConvModule::with_conv_bias(
                    &mut up.sub(format!("conv_up{i}")),
                    spec,
                    norm,
                    true,
                    false,
                )
            })
            .collect();
        let conv_up_input = Conv2d::new(
            &mut p.sub("conv_up_input"),
            ConvSpec::new(channels, channels, 1),
        );
        let last = *in_channels.last().expect("checked: three or more inputs");
        let aspp_conv = ConvModule::with_conv_bias(
            &mut p.sub("aspp_conv"),
            ConvSpec::new(last, channels, 1),
            norm,
            true,
            false,
        );
        // `image_pool.1`: ConvModule(in_channels[2], channels, 1,
        // act_cfg=Sigmoid, bias=False) without a norm.
        let image_pool_conv = Conv2d::new(
            &mut p.sub("image_pool").sub(1).sub("conv"),
            ConvSpec::new(in_channels[2], channels, 1).bias(false),
        );
        LrasppHead {
            base,
            convs,
            conv_ups,
            conv_up_input,
            aspp_conv,
            image_pool_conv,
        }
    }

    /// `self.image_pool(x)`: `[B, channels, h', w']`, sigmoid-gated.
    fn image_pool(&self, x: &Tensor) -> Tensor {
        let pooled = x.avg_pool2d(
            [POOL_KERNEL, POOL_KERNEL],
            POOL_STRIDE,
            [0, 0],
            false,
            true,
            None,
        );
        self.image_pool_conv.forward(&pooled).sigmoid()
    }
}

impl BaseHead for LrasppHead {
    fn base(&self) -> &DecodeHeadBase {
        &self.base
    }

    fn logits(&self, features: &[Tensor], training: bool) -> Tensor {
        let align_corners = self.base.cfg.align_corners;
        let inputs = self.base.selected_inputs(features);
        let x = inputs[inputs.len() - 1];
        let size = (x.size()[2], x.size()[3]);
        let gate = {
            let aspp = self.aspp_conv.forward(x, training); // [B, channels, h, w]
            let pooled = self.image_pool(x);
            aspp * resize_bilinear(&pooled, size, align_corners)
        };
        let mut x = self.conv_up_input.forward(&gate); // [B, channels, h, w]
        drop(gate);
        for i in (0..self.convs.len()).rev() {
            let size = (inputs[i].size()[2], inputs[i].size()[3]);
            // Each rebinding of `x` frees the previous map (unless saved).
            x = resize_bilinear(&x, size, align_corners);
            let branch = self.convs[i].forward(inputs[i]); // [B, branch_i, h_i, w_i]
            x = Tensor::cat(&[&x, &branch], 1);
            drop(branch);
            x = self.conv_ups[i].forward(&x, training); // [B, channels, h_i, w_i]
        }
        self.base.cls_seg(x, training)
    }
}

#[cfg(test)]
#[path = "lraspp_head_tests.rs"]
mod tests;
