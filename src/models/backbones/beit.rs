//! BEiT, as MMSeg's `mmseg/models/backbones/beit.py` builds it
//! (`BEiTAttention`, `BEiTTransformerEncoderLayer`, `BEiT`), and the
//! encoder MAE (`mae.rs`) builds on.
//!
//! Bao et al., "BEiT: BERT Pre-Training of Image Transformers", ICLR 2022,
//! arXiv:2106.08254.
//!
//! A ViT without an absolute position embedding: non-overlapping patches (a
//! strided conv with bias), a class token prepended, then `num_layers`
//! pre-norm layers whose attention adds a learned relative position bias
//! (one table per layer, indexed by the `relative_position_index` buffer)
//! and whose two branches are scaled by learned per-channel factors
//! (`gamma_1`, `gamma_2`, layer scale) before their drop path. Each output
//! index gives the tokens without the class token as a `[B, C, H/16, W/16]`
//! map.
//!
//! The bias table is made for `img_size / patch_size` (the
//! `window_size`) and beit.py does not resize it: a crop whose patch grid
//! differs fails in MMSeg when the bias is added to the attention, and so
//! it does here (a panic with the shapes, which a trial reports).

use super::vit::{size_pair, Encoder};
use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::{
    count_flops, host::from_host, linspace_drop_path_rates, softmax_saved, DropPath, Ffn,
    LayerNorm, LayerNormCfg, Linear, PatchEmbed, PatchPadding,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/backbones/beit.py";

/// The registry's constructor (`BACKBONES` row `BEiT`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = BeitConfig::from_cfg(cfg, Variant::Beit)?;
    Ok(Box::new(Beit::new(p, &cfg)))
}

/// Which of beit.py's classes (or mae.py's subclasses) the model is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `BEiT`: no absolute position embedding; q and v biases per `qv_bias`.
    Beit,
    /// `MAE`: an absolute position embedding added after the class token,
    /// and `MAETransformerEncoderLayer`s (a full qkv bias).
    Mae,
}

/// `BEiTAttention(bias=...)`: the qkv projection's bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvBias {
    /// `'qv_bias'`: learned `q_bias` and `v_bias`, a zero key bias.
    QvBias,
    /// `True`: `qkv` has its own bias.
    Full,
    /// `False`: no bias.
    None,
}

/// The backbone's settings (`model.backbone` of the config).
#[derive(Debug, Clone, PartialEq)]
pub struct BeitConfig {
    pub variant: Variant,
    pub img_size: (i64, i64),
    pub patch_size: i64,
    pub in_channels: i64,
    pub embed_dims: i64,
    pub num_layers: i64,
    pub num_heads: i64,
    pub feedforward_channels: i64,
    pub out_indices: Vec<i64>,
    pub bias: QkvBias,
    pub drop_path_rate: f64,
    pub norm: LayerNormCfg,
    pub patch_norm: bool,
    pub final_norm: bool,
    pub init_values: f64,
}

impl BeitConfig {
    /// `variant` picks the class whose keys are read: `MAE.__init__` has no
    /// `qv_bias` (a TypeError in MMSeg, refused here as an unknown key).
    pub fn from_cfg(cfg: &Dict, variant: Variant) -> Result<BeitConfig, ModelError> {
        let (component, source) = match variant {
            Variant::Beit => ("BEiT", SOURCE),
            Variant::Mae => ("MAE", "mmseg/models/backbones/mae.py"),
        };
        let mut r = ComponentConfig::new(cfg, component, source);
        let img_size = size_pair(&mut r, "img_size", 224)?;
        let embed_dims = r.int("embed_dims", 768)?;
        let num_layers = r.int("num_layers", 12)?;
        // `mlp_ratio * embed_dims` goes to nn.Linear, which takes only an int.
        let mlp_ratio = match r.value("mlp_ratio") {
            None => 4,
            Some(Value::Int(m)) => *m,
            Some(_) => return Err(r.unsupported(
                "mlp_ratio",
                "only an int is accepted (beit.py multiplies it into nn.Linear's feature count)",
            )),
        };
        let out_indices = match r.value("out_indices") {
            None | Some(Value::Int(-1)) => vec![num_layers - 1],
            Some(Value::Int(i)) => vec![*i],
            Some(_) => r.ints("out_indices", &[])?,
        };
        let bias = match variant {
            Variant::Mae => QkvBias::Full,
            Variant::Beit if r.flag("qv_bias", true) => QkvBias::QvBias,
            Variant::Beit => QkvBias::None,
        };
        let init_values = match r.value("init_values") {
            None => 0.1,
            Some(v) => v.as_f64().ok_or_else(|| {
                r.unsupported(
                    "init_values",
                    "must be a number (beit.py multiplies it into gamma_1 and gamma_2)",
                )
            })?,
        };
        let c = BeitConfig {
            variant,
            img_size,
            patch_size: r.int("patch_size", 16)?,
            in_channels: r.int("in_channels", 3)?,
            embed_dims,
            num_layers,
            num_heads: r.int("num_heads", 12)?,
            feedforward_channels: mlp_ratio * embed_dims,
            out_indices,
            bias,
            drop_path_rate: r.float("drop_path_rate", 0.0)?,
            norm: LayerNormCfg::from_cfg(&mut r, "norm_cfg", LayerNormCfg::DEFAULT)?,
            patch_norm: r.flag("patch_norm", false),
            final_norm: r.flag("final_norm", false),
            init_values,
        };
        r.unimplemented("num_fcs", &Value::Int(2))?;
        r.default_activation("act_cfg", "GELU")?;
        // BEiTAttention receives attn_drop_rate as `attn_drop` (swallowed by
        // its **kwargs) and keeps its own default of 0: the rate has no effect.
        // norm_eval only puts LayerNorms in eval mode: they have no running
        // statistics.
        r.inert(&["attn_drop_rate", "pretrained", "init_cfg", "norm_eval"]);
        r.finish()?;
        c.checked(component)
    }

    /// The settings beit.py cannot build a model of, refused before libtorch
    /// would fail on them.
    fn checked(self, component: &'static str) -> Result<BeitConfig, ModelError> {
        ModelError::require_positive(
            component,
            &[
                ("img_size", self.img_size.0.min(self.img_size.1)),
                ("patch_size", self.patch_size),
                ("embed_dims", self.embed_dims),
                ("num_heads", self.num_heads),
                ("mlp_ratio * embed_dims", self.feedforward_channels),
            ],
        )?;
        if self.img_size.0 < self.patch_size || self.img_size.1 < self.patch_size {
            return Err(ModelError::config(
                component,
                format!(
                    "img_size {:?} is smaller than patch_size {}: the relative position window would be empty",
                    self.img_size, self.patch_size
                ),
            ));
        }
        if self.embed_dims % self.num_heads != 0 {
            // qkv.reshape(B, N, 3, num_heads, -1) would fail at forward time.
            return Err(ModelError::config(
                component,
                format!(
                    "embed_dims={} is not divisible into num_heads={}",
                    self.embed_dims, self.num_heads
                ),
            ));
        }
        Ok(self)
    }

    /// `window_size` (`patch_shape`): the patch grid of `img_size`.
    pub fn window_size(&self) -> (i64, i64) {
        (
            self.img_size.0 / self.patch_size,
            self.img_size.1 / self.patch_size,
        )
    }
}

/// `BEiTAttention._init_rel_pos_embedding`'s `relative_position_index`:
/// `[Wh*Ww + 1, Wh*Ww + 1]`, the class token's row, column and corner on
/// the table's last three entries.
pub fn relative_position_index(wh: i64, ww: i64) -> Vec<i64> {
    let n = wh * ww;
    let num_relative_distance = (2 * wh - 1) * (2 * ww - 1) + 3;
    let mut index = vec![0i64; ((n + 1) * (n + 1)) as usize];
    for i in 0..n {
        for j in 0..n {
            let dh = i / ww - j / ww + wh - 1;
            let dw = i % ww - j % ww + ww - 1;
            index[((i + 1) * (n + 1) + j + 1) as usize] = dh * (2 * ww - 1) + dw;
        }
    }
    for k in 0..=n {
        index[k as usize] = num_relative_distance - 3;
        index[(k * (n + 1)) as usize] = num_relative_distance - 2;
    }
    index[0] = num_relative_distance - 1;
    index
}

/// `BEiTAttention` (MAE's `MAEAttention` differs only in initialisation).
struct BeitAttention {
    q_bias: Option<Tensor>,
    v_bias: Option<Tensor>,
    relative_position_bias_table: Tensor,
    relative_position_index: Tensor,
    qkv: Linear,
    proj: Linear,
    num_heads: i64,
    window_size: (i64, i64),
    scale: f64,
}

impl BeitAttention {
    /// `p`: `layers.<i>.attn`.
    fn new(p: &mut ParamScope, c: &BeitConfig) -> BeitAttention {
        let dims = c.embed_dims;
        let (q_bias, v_bias) = match c.bias {
            QkvBias::QvBias => (
                Some(p.param_zeros("q_bias", &[dims])),
                Some(p.param_zeros("v_bias", &[dims])),
            ),
            _ => (None, None),
        };
        let (wh, ww) = c.window_size();
        let relative_position_bias_table = p.param_zeros(
            "relative_position_bias_table",
            &[(2 * wh - 1) * (2 * ww - 1) + 3, c.num_heads],
        );
        let index = relative_position_index(wh, ww);
        let relative_position_index = p.buffer(
            "relative_position_index",
            from_host(&index)
                .view([wh * ww + 1, wh * ww + 1])
                .to_device(p.device()),
        );
        let qkv = Linear::new(&mut p.sub("qkv"), dims, 3 * dims, c.bias == QkvBias::Full);
        let proj = Linear::new(&mut p.sub("proj"), dims, dims, true);
        BeitAttention {
            q_bias,
            v_bias,
            relative_position_bias_table,
            relative_position_index,
            qkv,
            proj,
            num_heads: c.num_heads,
            window_size: (wh, ww),
            // `qk_scale or head_embed_dims**-0.5`, qk_scale always None.
            scale: ((dims / c.num_heads) as f64).powf(-0.5),
        }
    }

    /// The qkv projection: `F.linear` with `cat(q_bias, zeros, v_bias)`
    /// under `qv_bias`, else `self.qkv(x)`.
    fn project_qkv(&self, x: &Tensor) -> Tensor {
        match (&self.q_bias, &self.v_bias) {
            (Some(q_bias), Some(v_bias)) => {
                let k_bias = v_bias.zeros_like();
                let qkv_bias = Tensor::cat(&[q_bias, &k_bias, v_bias], 0);
                let w = self.qkv.weight.size();
                let rows: i64 = x.size()[..x.dim() - 1].iter().product();
                count_flops(2.0 * (rows * w[0] * w[1]) as f64);
                x.linear(&self.qkv.weight, Some(&qkv_bias))
            }
            _ => self.qkv.forward(x),
        }
    }

    /// `x`: `[B, N, C]` with `N = Wh*Ww + 1`.
    fn forward(&self, x: &Tensor) -> Tensor {
        let (b, n, c) = x.size3().expect("BEiT tokens are [B, N, C]");
        let heads = self.num_heads;
        let (wh, ww) = self.window_size;
        let window_tokens = wh * ww + 1;
        if n != window_tokens {
            panic!(
                "BEiTAttention: The size of tensor a ({n}) must match the size of tensor b \
                 ({window_tokens}) at non-singleton dimension 3 (the crop's {} patches plus the \
                 class token against the relative position bias of window_size ({wh}, {ww}), \
                 img_size / patch_size; beit.py does not resize it)",
                n - 1
            );
        }
        let qkv = self
            .project_qkv(x)
            .reshape([b, n, 3, heads, -1])
            .permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.select(0, 0), qkv.select(0, 1), qkv.select(0, 2));
        let q = q * self.scale;
        count_flops(2.0 * 2.0 * (b * heads * n * n * (c / heads)) as f64);
        let mut attn = q.matmul(&k.transpose(-2, -1));
        let relative_position_bias = self
            .relative_position_bias_table
            .index(&[Some(self.relative_position_index.view([-1]))])
            .view([window_tokens, window_tokens, -1])
            .permute([2, 0, 1])
            .contiguous();
        attn = &attn + relative_position_bias.unsqueeze(0);
        let logits = attn;
        let attn = logits.softmax(-1, None::<Kind>);
        softmax_saved(&logits, &attn);
        drop(logits);
        // attn_drop and proj_drop: nn.Dropout(0.0), the identity.
        let out = attn.matmul(&v).transpose(1, 2).reshape([b, n, c]);
        let out = self.proj.forward(&out);
        // (Python's locals qkv, q, k, v, relative_position_bias and attn
        // are released here, on return.)
        drop((qkv, q, k, v, relative_position_bias, attn));
        out
    }
}

/// `BEiTTransformerEncoderLayer` (and MAE's subclass):
/// `x + drop_path(gamma_1 * attn(ln1(x)))`, then
/// `x + drop_path(gamma_2 * ffn(ln2(x)))`, the FFN without its identity.
struct BeitLayer {
    gamma_1: Tensor,
    gamma_2: Tensor,
    ln1: LayerNorm,
    attn: BeitAttention,
    ln2: LayerNorm,
    ffn: Ffn,
    drop_path: DropPath,
}

impl BeitLayer {
    /// `p`: `layers.<i>`. The layer's own parameters (`gamma_1`,
    /// `gamma_2`) come first in `named_parameters`, then its children.
    fn new(p: &mut ParamScope, c: &BeitConfig, drop_path_rate: f64) -> BeitLayer {
        let layer_scale = |p: &mut ParamScope, name: &str| {
            let gamma = p.param_ones(name, &[c.embed_dims]);
            let _ = tch::no_grad(|| gamma.shallow_clone().g_mul_scalar_(c.init_values));
            gamma
        };
        let gamma_1 = layer_scale(p, "gamma_1");
        let gamma_2 = layer_scale(p, "gamma_2");
        let ln1 = c.norm.build(&mut p.sub("ln1"), c.embed_dims);
        let attn = BeitAttention::new(&mut p.sub("attn"), c);
        let ln2 = c.norm.build(&mut p.sub("ln2"), c.embed_dims);
        // The parent TransformerEncoderLayer is built with drop_rate 0 and
        // drop_path_rate 0: the FFN has no dropout and no dropout_layer.
        let ffn = Ffn::gelu(
            &mut p.sub("ffn"),
            c.embed_dims,
            c.feedforward_channels,
            0.0,
            0.0,
        );
        BeitLayer {
            gamma_1,
            gamma_2,
            ln1,
            attn,
            ln2,
            ffn,
            drop_path: DropPath {
                prob: drop_path_rate,
            },
        }
    }

    fn forward(&self, input: &Tensor, training: bool) -> Tensor {
        let x = {
            let attn = {
                let normed = self.ln1.forward(input);
                self.attn.forward(&normed)
            };
            let scaled = &self.gamma_1 * attn;
            // drop_path's argument is released before the sum.
            let dropped = self.drop_path.forward(&scaled, training);
            drop(scaled);
            input + dropped
        };
        let ffn = {
            let normed = self.ln2.forward(&x);
            self.ffn.forward_no_identity(&normed, training)
        };
        let scaled = &self.gamma_2 * ffn;
        let dropped = self.drop_path.forward(&scaled, training);
        drop(scaled);
        &x + dropped
    }
}

/// The BEiT encoder (MAE's too, with its absolute position embedding).
pub struct Beit {
    cls_token: Tensor,
    pos_embed: Option<Tensor>,
    patch_embed: PatchEmbed,
    layers: Vec<BeitLayer>,
    /// `ln1` after the last layer (`final_norm`).
    final_ln: Option<LayerNorm>,
    out_indices: Vec<i64>,
}

impl Beit {
    pub fn new(p: &mut ParamScope, c: &BeitConfig) -> Beit {
        // nn.Module lists its own parameters before its children's; MAE
        // re-assigns cls_token (same place) and adds pos_embed after it.
        let cls_token = p.param_zeros("cls_token", &[1, 1, c.embed_dims]);
        let (wh, ww) = c.window_size();
        let pos_embed = (c.variant == Variant::Mae)
            .then(|| p.param_zeros("pos_embed", &[1, wh * ww + 1, c.embed_dims]));
        // PatchEmbed(conv_type='Conv2d', padding=0), its bias at the default True.
        let patch_embed = PatchEmbed::patchify(
            &mut p.sub("patch_embed"),
            c.in_channels,
            c.embed_dims,
            c.patch_size,
            PatchPadding::Fixed(0),
            true,
            c.patch_norm.then_some(c.norm),
        );
        let dpr = linspace_drop_path_rates(c.drop_path_rate, c.num_layers as usize);
        let layers = dpr
            .iter()
            .enumerate()
            .map(|(i, rate)| BeitLayer::new(&mut p.sub("layers").sub(i), c, *rate))
            .collect();
        let final_ln = c
            .final_norm
            .then(|| c.norm.build(&mut p.sub("ln1"), c.embed_dims));
        Beit {
            cls_token,
            pos_embed,
            patch_embed,
            layers,
            final_ln,
            out_indices: c.out_indices.clone(),
        }
    }

    /// `x + self.pos_embed` (MAE; no resizing).
    fn add_pos_embed(pos_embed: &Tensor, x: Tensor) -> Tensor {
        let (n, expected) = (x.size()[1], pos_embed.size()[1]);
        if n != expected {
            panic!(
                "MAE: The size of tensor a ({n}) must match the size of tensor b ({expected}) \
                 at non-singleton dimension 1 (the crop's {} patches plus the class token \
                 against pos_embed made for img_size; mae.py does not resize it)",
                n - 1
            );
        }
        x + pos_embed
    }
}

impl Backbone for Beit {
    /// One `[B, embed_dims, H / patch, W / patch]` map per output index.
    fn forward(&self, inputs: &Tensor, training: bool) -> Vec<Tensor> {
        let b = inputs.size()[0];
        let (mut x, hw) = {
            let (patches, hw) = self.patch_embed.forward(inputs);
            let cls_tokens = self.cls_token.expand([b, -1, -1], false);
            (Tensor::cat(&[cls_tokens, patches], 1), hw)
        };
        if let Some(pos_embed) = &self.pos_embed {
            x = Self::add_pos_embed(pos_embed, x);
        }
        let mut outs = Vec::new();
        let encoder = Encoder::new(&self.layers, self.final_ln.as_ref(), &self.out_indices);
        encoder.run(
            x,
            |layer, x| layer.forward(x, training),
            |x| {
                let out = x.slice(1, 1, None, 1);
                let c = out.size()[2];
                outs.push(
                    out.reshape([b, hw.0, hw.1, c])
                        .permute([0, 3, 1, 2])
                        .contiguous(),
                );
            },
        );
        outs
    }
}

#[cfg(test)]
#[path = "beit_tests.rs"]
mod tests;
