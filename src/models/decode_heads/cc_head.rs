//! `CCHead`, the criss-cross attention head of CCNet, as MMSeg's
//! `mmseg/models/decode_heads/cc_head.py` builds it: an FCNHead with two
//! convs and mmcv's `CrissCrossAttention` (`mmcv/ops/cc_attention.py`)
//! applied `recurrence` times between them.
//!
//! Huang et al., "CCNet: Criss-Cross Attention for Semantic Segmentation",
//! ICCV 2019, arXiv:1811.11721.
//!
//! mmcv 2.x writes the attention with `torch.einsum` (no compiled op): each
//! pixel attends to the pixels of its column (its own position masked by
//! `-inf`) and of its row, one softmax over both, and a learnt `gamma`
//! scales the result onto a residual. The same module (the same weights) is
//! applied each recurrence.

use super::fcn_head::{FcnHead, FcnHeadCfg, MidBlock};
use super::DecodeHead;
use crate::config::Dict;
use crate::models::component_config::ComponentConfig;
use crate::models::layers::host::scalar_from_host;
use crate::models::layers::{count_flops, softmax_saved, Conv2d, ConvSpec};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/decode_heads/cc_head.py";

/// The registry's constructor (`DECODE_HEADS` row `CCHead`):
/// `CCHead(recurrence=2, **kwargs)` over `FCNHead(num_convs=2, **kwargs)`.
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn DecodeHead>, ModelError> {
    let mut c = ComponentConfig::new(cfg, "CCHead", SOURCE);
    let recurrence = c.int("recurrence", 2)?;
    if recurrence < 0 {
        return Err(c.config_error(format!("recurrence must be >= 0, not {recurrence}")));
    }
    let fcn = FcnHeadCfg::read(&mut c, Some(2))?;
    c.finish()?;
    Ok(Box::new(FcnHead::with_block(p, fcn, |p, channels, _| {
        Box::new(Recurrent {
            cca: CrissCrossAttention::new(&mut p.sub("cca"), channels),
            recurrence,
        })
    })))
}

/// mmcv's `CrissCrossAttention(in_channels)`.
pub struct CrissCrossAttention {
    query_conv: Conv2d,
    key_conv: Conv2d,
    value_conv: Conv2d,
    gamma: Tensor,
}

impl CrissCrossAttention {
    pub fn new(p: &mut ParamScope, in_channels: i64) -> CrissCrossAttention {
        let conv = |p: &mut ParamScope, name: &str, out: i64| {
            Conv2d::new(&mut p.sub(name), ConvSpec::new(in_channels, out, 1))
        };
        let query_conv = conv(p, "query_conv", in_channels / 8);
        let key_conv = conv(p, "key_conv", in_channels / 8);
        let value_conv = conv(p, "value_conv", in_channels);
        let gamma = p.sub("gamma").param_zeros("scale", &[1]);
        CrissCrossAttention {
            query_conv,
            key_conv,
            value_conv,
            gamma,
        }
    }

    /// `[B, C, H, W]` in and out.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let s = x.size();
        let (b, c, h, w) = (s[0], s[1], s[2], s[3]);
        let query = self.query_conv.forward(x);
        let key = self.key_conv.forward(x);
        let value = self.value_conv.forward(x);
        let cq = query.size()[1];
        count_flops(2.0 * (b * h * w * (h + w) * (cq + c)) as f64);
        let energy_h = {
            let e = Tensor::einsum("bchw,bciw->bwhi", &[&query, &key], None::<&[i64]>);
            // NEG_INF_DIAG(H): torch.diag(torch.tensor(-inf).to(device).repeat(H), 0)
            let neg_inf_diag = scalar_from_host(f32::NEG_INFINITY)
                .to_device(x.device())
                .repeat([h])
                .diag(0);
            e + neg_inf_diag
        }
        .transpose(1, 2); // [B, H, W, H]
        let energy_w = Tensor::einsum("bchw,bchj->bhwj", &[&query, &key], None::<&[i64]>);
        let attn = {
            let energy = Tensor::cat(&[&energy_h, &energy_w], -1); // [B, H, W, H + W]
            let attn = energy.softmax(-1, None::<Kind>);
            softmax_saved(&energy, &attn);
            attn
        };
        let mut out = Tensor::einsum(
            "bciw,bhwi->bchw",
            &[&value, &attn.narrow(-1, 0, h)],
            None::<&[i64]>,
        );
        let row = Tensor::einsum(
            "bchj,bhwj->bchw",
            &[&value, &attn.narrow(-1, h, w)],
            None::<&[i64]>,
        );
        let _ = out.g_add_(&row);
        drop(row);
        let out = {
            let scaled = &out * &self.gamma;
            scaled + x
        };
        // Locals of the Python forward live until it returns.
        drop((query, key, value, energy_h, energy_w, attn));
        out.contiguous()
    }
}

/// `for _ in range(recurrence): output = self.cca(output)`.
struct Recurrent {
    cca: CrissCrossAttention,
    recurrence: i64,
}

impl MidBlock for Recurrent {
    fn forward(&self, x: &Tensor, _training: bool) -> Tensor {
        let mut output = x.shallow_clone();
        for _ in 0..self.recurrence {
            output = self.cca.forward(&output);
        }
        output
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::params::ParamStore;
    use tch::Device;

    /// Criss-cross attention written out per pixel: the softmax over the
    /// pixel's column (itself excluded) and row, then `gamma * out + x`.
    #[test]
    fn each_pixel_attends_to_its_row_and_column() {
        let mut store = ParamStore::new(Device::Cpu);
        let cca = CrissCrossAttention::new(&mut store.scope("cca"), 16);
        tch::no_grad(|| {
            let _ = cca.gamma.shallow_clone().fill_(0.5);
        });
        let x = Tensor::randn([1, 16, 3, 4], (Kind::Float, Device::Cpu));
        let got = cca.forward(&x);
        let (q, k, v) = (
            cca.query_conv.forward(&x),
            cca.key_conv.forward(&x),
            cca.value_conv.forward(&x),
        );
        let (h, w) = (3i64, 4i64);
        let dot = |a: &Tensor, b: &Tensor| (a * b).sum(Kind::Double).double_value(&[]);
        for ph in 0..h {
            for pw in 0..w {
                let qp = q.get(0).select(1, ph).select(1, pw); // [C/8]
                let mut energies = Vec::new();
                for i in 0..h {
                    let e = dot(&qp, &k.get(0).select(1, i).select(1, pw));
                    energies.push(if i == ph { f64::NEG_INFINITY } else { e });
                }
                for j in 0..w {
                    energies.push(dot(&qp, &k.get(0).select(1, ph).select(1, j)));
                }
                let max = energies.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exp: Vec<f64> = energies.iter().map(|e| (e - max).exp()).collect();
                let total: f64 = exp.iter().sum();
                for c in 0..16 {
                    let mut out = 0.0;
                    for i in 0..h {
                        out += exp[i as usize] / total * v.double_value(&[0, c, i, pw]);
                    }
                    for j in 0..w {
                        out += exp[(h + j) as usize] / total * v.double_value(&[0, c, ph, j]);
                    }
                    let want = 0.5 * out + x.double_value(&[0, c, ph, pw]);
                    let have = got.double_value(&[0, c, ph, pw]);
                    assert!(
                        (want - have).abs() < 1e-4,
                        "{c} {ph} {pw}: {have} vs {want}"
                    );
                }
            }
        }
    }
}
