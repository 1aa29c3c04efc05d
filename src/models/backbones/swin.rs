//! Swin Transformer, as MMSeg's `mmseg/models/backbones/swin.py` builds it
//! (with `PatchEmbed`/`PatchMerging` from `mmseg/models/utils/embed.py` and
//! mmcv's `FFN`).
//!
//! Liu et al., "Swin Transformer: Hierarchical Vision Transformer using
//! Shifted Windows", ICCV 2021, arXiv:2103.14030.
//!
//! A non-overlapping patch embedding (strided conv + LayerNorm), then
//! stages of blocks that attend within `window_size`² windows, every other
//! block on windows shifted by half a window (a rolled feature map and an
//! attention mask that keeps windows that wrapped around apart), with a
//! learned relative position bias; between stages a `PatchMerging`
//! (2x2 unfold, LayerNorm, linear to twice the channels). Each output stage
//! gets its own LayerNorm (`norm{i}`).
//!
//! Every Python local of the forward passes is kept as long as Python keeps
//! it (to the end of its function), because some hold storages that
//! autograd does not save: the padded query and the `qkv` projection live
//! until a window attention returns.

use super::Backbone;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::layers::host::from_host;
use crate::models::layers::{
    checkpoint_if, corner_padding, count_flops, linspace_drop_path_rates, softmax_saved, DropPath,
    Ffn, FfnActivation, LayerNorm, LayerNormCfg, Linear, PatchEmbed, PatchPadding,
};
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/models/backbones/swin.py";

/// The registry's constructor (`BACKBONES` row `SwinTransformer`).
pub fn build(p: &mut ParamScope, cfg: &Dict) -> Result<Box<dyn Backbone>, ModelError> {
    let cfg = SwinConfig::from_cfg(cfg)?;
    Ok(Box::new(SwinTransformer::new(p, &cfg)))
}

/// The backbone's settings (`model.backbone` of the config).
#[derive(Debug, Clone, PartialEq)]
pub struct SwinConfig {
    pub pretrain_img_size: (i64, i64),
    pub in_channels: i64,
    pub embed_dims: i64,
    pub patch_size: i64,
    pub window_size: i64,
    pub mlp_ratio: f64,
    pub depths: Vec<i64>,
    pub num_heads: Vec<i64>,
    pub strides: Vec<i64>,
    pub out_indices: Vec<i64>,
    pub qkv_bias: bool,
    pub qk_scale: Option<f64>,
    pub patch_norm: bool,
    pub drop_rate: f64,
    pub drop_path_rate: f64,
    pub use_abs_pos_embed: bool,
    pub norm: LayerNormCfg,
    pub frozen_stages: i64,
    /// Gradient checkpointing of each block (`with_cp`).
    pub with_cp: bool,
}

impl SwinConfig {
    pub fn from_cfg(cfg: &Dict) -> Result<SwinConfig, ModelError> {
        let mut r = ComponentConfig::new(cfg, "SwinTransformer", SOURCE);
        let pretrain_img_size = match r.value("pretrain_img_size") {
            None => (224, 224),
            Some(v) => match v.as_i64() {
                Some(s) => (s, s),
                None => {
                    let sizes = r.ints("pretrain_img_size", &[])?;
                    match sizes[..] {
                        [s] => (s, s),
                        [h, w] => (h, w),
                        _ => {
                            return Err(r.config_error(
                                "`pretrain_img_size` must be an int or a pair of ints",
                            ))
                        }
                    }
                }
            },
        };
        let c = SwinConfig {
            pretrain_img_size,
            in_channels: r.int("in_channels", 3)?,
            embed_dims: r.int("embed_dims", 96)?,
            patch_size: r.int("patch_size", 4)?,
            window_size: r.int("window_size", 7)?,
            mlp_ratio: r.float("mlp_ratio", 4.0)?,
            depths: r.ints("depths", &[2, 2, 6, 2])?,
            num_heads: r.ints("num_heads", &[3, 6, 12, 24])?,
            strides: r.ints("strides", &[4, 2, 2, 2])?,
            out_indices: r.ints("out_indices", &[0, 1, 2, 3])?,
            qkv_bias: r.flag("qkv_bias", true),
            qk_scale: match r.value("qk_scale") {
                None | Some(Value::None) => None,
                Some(v) => Some(
                    v.as_f64()
                        .ok_or_else(|| r.config_error("`qk_scale` must be a number or None"))?,
                ),
            },
            patch_norm: r.flag("patch_norm", true),
            drop_rate: r.float("drop_rate", 0.0)?,
            drop_path_rate: r.float("drop_path_rate", 0.1)?,
            use_abs_pos_embed: r.flag("use_abs_pos_embed", false),
            norm: LayerNormCfg::from_cfg(&mut r, "norm_cfg", LayerNormCfg::DEFAULT)?,
            frozen_stages: r.int("frozen_stages", -1)?,
            with_cp: r.flag("with_cp", false),
        };
        // The attention-weight dropout (nn.Dropout after the softmax) is not reproduced.
        r.unimplemented("attn_drop_rate", &Value::Float(0.0))?;
        r.default_activation("act_cfg", "GELU")?;
        r.inert(&["pretrained", "init_cfg"]);
        r.finish()?;
        let stages = c.depths.len();
        if c.num_heads.len() != stages || c.strides.len() != stages {
            return Err(ModelError::config(
                "SwinTransformer",
                format!(
                    "depths, num_heads and strides must have the same number of stages ({stages})"
                ),
            ));
        }
        if c.strides.first() != Some(&c.patch_size) {
            return Err(ModelError::config(
                "SwinTransformer", "strides[0] must equal patch_size (non-overlapping patch embedding, as swin.py asserts)",
            ));
        }
        if c.window_size < 1 || c.patch_size < 1 || c.strides.iter().any(|s| *s < 1) {
            return Err(ModelError::config(
                "SwinTransformer",
                "window_size, patch_size and strides must be >= 1",
            ));
        }
        let mut dims = c.embed_dims;
        for (i, heads) in c.num_heads.iter().enumerate() {
            if *heads < 1 || dims < 1 || dims % heads != 0 {
                return Err(ModelError::config(
                    "SwinTransformer",
                    format!("stage {i} has {dims} channels, not divisible into num_heads={heads}"),
                ));
            }
            dims *= 2;
        }
        if c.out_indices.iter().any(|i| *i < 0 || *i >= stages as i64) {
            return Err(ModelError::config(
                "SwinTransformer",
                format!("out_indices must be stage numbers below {stages}"),
            ));
        }
        Ok(c)
    }
}

/// `PatchMerging`: a 2x2 `nn.Unfold` (im2col), LayerNorm, linear without bias.
struct PatchMerging {
    norm: Option<LayerNorm>,
    reduction: Linear,
    stride: i64,
}

const MERGE_KERNEL: i64 = 2;

impl PatchMerging {
    /// `x`: `[B, H * W, C]`; returns `[B, h * w, 2C]` and `(h, w)`.
    fn forward(&self, x: &Tensor, hw: (i64, i64)) -> (Tensor, (i64, i64)) {
        let (b, _, c) = x.size3().expect("PatchMerging input is [B, L, C]");
        let (mut h, mut w) = hw;
        let mut x = x.view([b, h, w, c]).permute([0, 3, 1, 2]);
        if let Some((pad_h, pad_w)) = corner_padding(hw, MERGE_KERNEL, self.stride) {
            x = x.pad([0, pad_w, 0, pad_h], "constant", None);
            (h, w) = (x.size()[2], x.size()[3]);
        }
        x = x.im2col(
            [MERGE_KERNEL, MERGE_KERNEL],
            [1, 1],
            [0, 0],
            [self.stride, self.stride],
        );
        let out_h = (h - (MERGE_KERNEL - 1) - 1) / self.stride + 1;
        let out_w = (w - (MERGE_KERNEL - 1) - 1) / self.stride + 1;
        x = x.transpose(1, 2);
        if let Some(norm) = &self.norm {
            x = norm.forward(&x);
        }
        x = self.reduction.forward(&x);
        (x, (out_h, out_w))
    }
}

/// `WindowMSA`: multi-head self-attention within each window, with the
/// relative position bias.
struct WindowMsa {
    relative_position_bias_table: Tensor,
    relative_position_index: Tensor,
    qkv: Linear,
    proj: Linear,
    num_heads: i64,
    window_size: i64,
    scale: f64,
    proj_drop: f64,
}

impl WindowMsa {
    /// `p`: `...attn.w_msa`.
    fn new(p: &mut ParamScope, c: &SwinConfig, dims: i64, num_heads: i64) -> WindowMsa {
        let ws = c.window_size;
        let relative_position_bias_table = p.param_zeros(
            "relative_position_bias_table",
            &[(2 * ws - 1) * (2 * ws - 1), num_heads],
        );
        // WindowMSA.double_step_seq(2 * Ww - 1, Wh, 1, Ww), plus its
        // transpose, flipped along the key axis.
        let n = ws * ws;
        let coord = |k: i64| (k / ws) * (2 * ws - 1) + k % ws;
        let index: Vec<i64> = (0..n)
            .flat_map(|i| (0..n).map(move |j| coord(i) + coord(n - 1 - j)))
            .collect();
        let relative_position_index = p.buffer(
            "relative_position_index",
            from_host(&index).view([n, n]).to_device(p.device()),
        );
        let qkv = Linear::new(&mut p.sub("qkv"), dims, 3 * dims, c.qkv_bias);
        let proj = Linear::new(&mut p.sub("proj"), dims, dims, true);
        let head_dims = dims / num_heads;
        WindowMsa {
            relative_position_bias_table,
            relative_position_index,
            qkv,
            proj,
            num_heads,
            window_size: ws,
            scale: c
                .qk_scale
                .filter(|s| *s != 0.0)
                .unwrap_or((head_dims as f64).powf(-0.5)),
            proj_drop: c.drop_rate,
        }
    }

    /// `x`: `[num_windows * B, N, C]`; `mask`: `[num_windows, N, N]`.
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, training: bool) -> Tensor {
        let (b, n, c) = x.size3().expect("WindowMSA input is [B, N, C]");
        let heads = self.num_heads;
        let qkv = self
            .qkv
            .forward(x)
            .reshape([b, n, 3, heads, c / heads])
            .permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.select(0, 0), qkv.select(0, 1), qkv.select(0, 2));
        let q = q * self.scale;
        count_flops(2.0 * 2.0 * (b * heads * n * n * (c / heads)) as f64);
        let mut attn = q.matmul(&k.transpose(-2, -1));
        let ws2 = self.window_size * self.window_size;
        let relative_position_bias = self
            .relative_position_bias_table
            .index(&[Some(self.relative_position_index.view([-1]))])
            .view([ws2, ws2, -1])
            .permute([2, 0, 1])
            .contiguous();
        attn = &attn + relative_position_bias.unsqueeze(0);
        if let Some(mask) = mask {
            let nw = mask.size()[0];
            attn = attn.view([b / nw, nw, heads, n, n]) + mask.unsqueeze(1).unsqueeze(0);
            attn = attn.view([-1, heads, n, n]);
        }
        let logits = attn;
        let attn = logits.softmax(-1, None::<Kind>);
        softmax_saved(&logits, &attn);
        drop(logits);
        let mut x = attn.matmul(&v).transpose(1, 2).reshape([b, n, c]);
        x = self.proj.forward(&x);
        x = x.dropout(self.proj_drop, training);
        // (Python's locals qkv, q, k, v, relative_position_bias and attn
        // are released here, on return.)
        drop((qkv, q, k, v, relative_position_bias, attn));
        x
    }
}

/// `ShiftWindowMSA`: pads the map to whole windows, rolls it by
/// `shift_size` when shifted, partitions it into windows, attends, and
/// undoes all three.
struct ShiftWindowMsa {
    w_msa: WindowMsa,
    window_size: i64,
    shift_size: i64,
    drop: DropPath,
}

impl ShiftWindowMsa {
    /// `[B, H, W, C]` -> `[B * H/ws * W/ws, ws, ws, C]` (a copy).
    fn window_partition(&self, x: &Tensor) -> Tensor {
        let s = x.size();
        let ws = self.window_size;
        x.view([s[0], s[1] / ws, ws, s[2] / ws, ws, s[3]])
            .permute([0, 1, 3, 2, 4, 5])
            .contiguous()
            .view([-1, ws, ws, s[3]])
    }

    /// The inverse of [`Self::window_partition`] (a copy).
    fn window_reverse(&self, windows: &Tensor, h: i64, w: i64) -> Tensor {
        let ws = self.window_size;
        let b = windows.size()[0] / (h * w / ws / ws);
        windows
            .view([b, h / ws, w / ws, ws, ws, -1])
            .permute([0, 1, 3, 2, 4, 5])
            .contiguous()
            .view([b, h, w, -1])
    }

    /// The `[num_windows, N, N]` mask (0 within a region, -100 across)
    /// of a shifted block, built on the device as swin.py builds it.
    fn attention_mask(&self, h_pad: i64, w_pad: i64, like: &Tensor) -> Tensor {
        let (ws, shift) = (self.window_size, self.shift_size);
        let img_mask = Tensor::zeros([1, h_pad, w_pad, 1], (Kind::Float, like.device()));
        let h_slices = [
            (0, h_pad - ws),
            (h_pad - ws, h_pad - shift),
            (h_pad - shift, h_pad),
        ];
        let w_slices = [
            (0, w_pad - ws),
            (w_pad - ws, w_pad - shift),
            (w_pad - shift, w_pad),
        ];
        let mut cnt = 0i64;
        for (h0, h1) in h_slices {
            for (w0, w1) in w_slices {
                let _ = img_mask.slice(1, h0, h1, 1).slice(2, w0, w1, 1).fill_(cnt);
                cnt += 1;
            }
        }
        let mask_windows = self.window_partition(&img_mask).view([-1, ws * ws]);
        let attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2);
        attn_mask
            .masked_fill(&attn_mask.ne(0), -100.0)
            .masked_fill(&attn_mask.eq(0), 0.0)
    }

    /// `query`: `[B, H * W, C]`; returns `[B, H * W, C]`.
    fn forward(&self, query: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        let (b, l, c) = query.size3().expect("ShiftWindowMSA input is [B, L, C]");
        let (h, w) = hw;
        assert_eq!(l, h * w, "input feature has wrong size");
        let ws = self.window_size;
        let query = query.view([b, h, w, c]);
        let pad_r = (ws - w % ws) % ws;
        let pad_b = (ws - h % ws) % ws;
        // F.pad copies even when nothing is padded.
        let query = query.pad([0, 0, 0, pad_r, 0, pad_b], "constant", None);
        let (h_pad, w_pad) = (query.size()[1], query.size()[2]);
        let (shifted_query, attn_mask) = if self.shift_size > 0 {
            let shifted = query.roll([-self.shift_size, -self.shift_size], [1, 2]);
            (shifted, Some(self.attention_mask(h_pad, w_pad, &query)))
        } else {
            (query.shallow_clone(), None)
        };
        let query_windows = self.window_partition(&shifted_query).view([-1, ws * ws, c]);
        let attn_windows = self
            .w_msa
            .forward(&query_windows, attn_mask.as_ref(), training)
            .view([-1, ws, ws, c]);
        let shifted_x = self.window_reverse(&attn_windows, h_pad, w_pad);
        let mut x = if self.shift_size > 0 {
            shifted_x.roll([self.shift_size, self.shift_size], [1, 2])
        } else {
            shifted_x.shallow_clone()
        };
        if pad_r > 0 || pad_b > 0 {
            x = x.slice(1, 0, h, 1).slice(2, 0, w, 1).contiguous();
        }
        x = x.view([b, h * w, c]);
        x = self.drop.forward(&x, training);
        drop((
            query,
            shifted_query,
            attn_mask,
            query_windows,
            attn_windows,
            shifted_x,
        ));
        x
    }
}

/// `SwinBlock`: `x + attn(norm1(x))`, then `x + ffn(norm2(x))`.
struct SwinBlock {
    norm1: LayerNorm,
    attn: ShiftWindowMsa,
    norm2: LayerNorm,
    ffn: Ffn,
    with_cp: bool,
}

impl SwinBlock {
    /// `p`: `stages.<i>.blocks.<j>`.
    fn new(
        p: &mut ParamScope,
        c: &SwinConfig,
        dims: i64,
        num_heads: i64,
        shift: bool,
        drop_path: f64,
    ) -> SwinBlock {
        let norm1 = c.norm.build(&mut p.sub("norm1"), dims);
        let w_msa = WindowMsa::new(&mut p.sub("attn").sub("w_msa"), c, dims, num_heads);
        let attn = ShiftWindowMsa {
            w_msa,
            window_size: c.window_size,
            shift_size: if shift { c.window_size / 2 } else { 0 },
            drop: DropPath { prob: drop_path },
        };
        let norm2 = c.norm.build(&mut p.sub("norm2"), dims);
        let hidden = (c.mlp_ratio * dims as f64) as i64;
        let ffn = Ffn::new(
            &mut p.sub("ffn"),
            dims,
            hidden,
            FfnActivation::Gelu,
            c.drop_rate,
            drop_path,
        );
        SwinBlock {
            norm1,
            attn,
            norm2,
            ffn,
            with_cp: c.with_cp,
        }
    }

    /// Through [`checkpoint`] under `with_cp` when the input requires grad.
    fn forward(&self, input: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        // SAFETY: the block borrows this module, which outlives the step's graph
        // (a trial keeps its model for all its steps).
        unsafe {
            checkpoint_if(self.with_cp, input, move |x: &Tensor| {
                self.inner_forward(x, hw, training)
            })
        }
    }

    fn inner_forward(&self, input: &Tensor, hw: (i64, i64), training: bool) -> Tensor {
        // Python's `x` holds norm1's output until the attention returns,
        // and the attention's output until the add returns.
        let x = {
            let normed = self.norm1.forward(input);
            self.attn.forward(&normed, hw, training)
        };
        let identity = x.g_add(input);
        drop(x);
        let x = self.norm2.forward(&identity);
        self.ffn.forward(&x, &identity, training)
    }
}

/// `SwinBlockSequence`: one stage's blocks, then its `PatchMerging`.
struct Stage {
    blocks: Vec<SwinBlock>,
    downsample: Option<PatchMerging>,
    /// Frozen stages run in eval mode (no drop path).
    frozen: bool,
}

/// The Swin encoder.
pub struct SwinTransformer {
    absolute_pos_embed: Option<Tensor>,
    patch_embed: PatchEmbed,
    stages: Vec<Stage>,
    /// `norm{i}` of each output stage, with its channel count.
    out_norms: Vec<(usize, LayerNorm, i64)>,
    drop_rate: f64,
    patch_embed_frozen: bool,
}

impl SwinTransformer {
    pub fn new(p: &mut ParamScope, c: &SwinConfig) -> SwinTransformer {
        let start = p.registered();
        // nn.Module lists its own parameters before its children's.
        let absolute_pos_embed = c.use_abs_pos_embed.then(|| {
            let patches =
                (c.pretrain_img_size.0 / c.patch_size) * (c.pretrain_img_size.1 / c.patch_size);
            p.param_zeros("absolute_pos_embed", &[1, patches, c.embed_dims])
        });
        let patch_embed = PatchEmbed::new(
            &mut p.sub("patch_embed"),
            c.in_channels,
            c.embed_dims,
            c.patch_size,
            c.strides[0],
            PatchPadding::Corner,
            true,
            c.patch_norm.then_some(c.norm),
        );
        if c.frozen_stages >= 0 {
            p.freeze_since(start);
        }
        let total: i64 = c.depths.iter().sum();
        let dpr = linspace_drop_path_rates(c.drop_path_rate, total as usize);
        let mut stages = Vec::new();
        let mut dims = c.embed_dims;
        let mut first_block = 0usize;
        for (i, depth) in c.depths.iter().enumerate() {
            let mark = p.registered();
            let mut sp = p.sub(format!("stages.{i}"));
            let blocks = (0..*depth as usize)
                .map(|j| {
                    SwinBlock::new(
                        &mut sp.sub("blocks").sub(j),
                        c,
                        dims,
                        c.num_heads[i],
                        j % 2 == 1,
                        dpr[first_block + j],
                    )
                })
                .collect();
            first_block += *depth as usize;
            let downsample = (i + 1 < c.depths.len()).then(|| {
                let mut dp = sp.sub("downsample");
                let sample_dims = MERGE_KERNEL * MERGE_KERNEL * dims;
                let norm = c
                    .patch_norm
                    .then(|| c.norm.build(&mut dp.sub("norm"), sample_dims));
                let reduction = Linear::new(&mut dp.sub("reduction"), sample_dims, 2 * dims, false);
                PatchMerging {
                    norm,
                    reduction,
                    stride: c.strides[i + 1],
                }
            });
            let frozen = (i as i64) < c.frozen_stages;
            if frozen {
                p.freeze_since(mark);
            }
            stages.push(Stage {
                blocks,
                downsample,
                frozen,
            });
            if stages.last().is_some_and(|s| s.downsample.is_some()) {
                dims *= 2;
            }
        }
        let mut out_norms = Vec::new();
        for i in 0..c.depths.len() {
            if c.out_indices.contains(&(i as i64)) {
                let channels = c.embed_dims << i;
                let norm = c.norm.build(&mut p.sub(format!("norm{i}")), channels);
                if (i as i64) < c.frozen_stages {
                    p.freeze_last(2);
                }
                out_norms.push((i, norm, channels));
            }
        }
        SwinTransformer {
            absolute_pos_embed,
            patch_embed,
            stages,
            out_norms,
            drop_rate: c.drop_rate,
            patch_embed_frozen: c.frozen_stages >= 0,
        }
    }
}

impl Backbone for SwinTransformer {
    /// One `[B, embed_dims * 2^i, H / 4 / 2^i, W / 4 / 2^i]` map per output
    /// stage (with the default strides).
    fn forward(&self, x: &Tensor, training: bool) -> Vec<Tensor> {
        let (mut x, mut hw) = self.patch_embed.forward(x);
        if let Some(pos) = &self.absolute_pos_embed {
            x = x.g_add(pos);
        }
        x = x.dropout(self.drop_rate, training && !self.patch_embed_frozen);
        let mut outs = Vec::new();
        for (i, stage) in self.stages.iter().enumerate() {
            let _part = crate::models::scope::enter(&format!("stage{}", i + 1));
            let training = training && !stage.frozen;
            for block in &stage.blocks {
                x = block.forward(&x, hw, training);
            }
            let (out, out_hw) = (x.shallow_clone(), hw);
            if let Some(down) = &stage.downsample {
                (x, hw) = down.forward(&out, hw);
            }
            if let Some((_, norm, channels)) = self.out_norms.iter().find(|(s, _, _)| *s == i) {
                let out = norm.forward(&out);
                outs.push(
                    out.view([-1, out_hw.0, out_hw.1, *channels])
                        .permute([0, 3, 1, 2])
                        .contiguous(),
                );
            }
        }
        outs
    }
}

#[cfg(test)]
#[path = "swin_tests.rs"]
mod tests;
