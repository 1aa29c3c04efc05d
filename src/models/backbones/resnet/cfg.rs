//! `ResNet`'s settings read from `model.backbone` with MMSeg's defaults and
//! assertions (`mmseg/models/backbones/resnet.py`, `ResNet.__init__`):
//! depth and blocks, stages, style and stem, multi-grid.

use super::{BlockKind, SplitSettings, Style, Variant};
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::{ModelError, NormCfg};

/// The backbone's settings (`model.backbone` of the config).
#[derive(Debug, Clone, PartialEq)]
pub struct ResNetCfg {
    pub depth: i64,
    pub block: BlockKind,
    /// Blocks per stage, cut to `num_stages`.
    pub stage_blocks: Vec<i64>,
    pub in_channels: i64,
    pub stem_channels: i64,
    pub base_channels: i64,
    pub strides: Vec<i64>,
    pub dilations: Vec<i64>,
    pub out_indices: Vec<i64>,
    pub style: Style,
    pub deep_stem: bool,
    pub avg_down: bool,
    pub frozen_stages: i64,
    pub norm: NormCfg,
    pub norm_eval: bool,
    pub multi_grid: Option<Vec<i64>>,
    pub contract_dilation: bool,
    /// Gradient checkpointing of each block (`with_cp`).
    pub with_cp: bool,
}

impl ResNetCfg {
    pub fn from_cfg(d: &Dict, variant: Variant) -> Result<ResNetCfg, ModelError> {
        let mut c = ComponentConfig::new(d, variant.class_name(), variant.source());
        let (depth, block, blocks) = depth_and_blocks(&mut c, variant)?;
        let Stages {
            num_stages,
            strides,
            dilations,
            out_indices,
        } = stages(&mut c)?;
        let (style, deep_stem, avg_down) = style_and_stem(&mut c, variant)?;
        let multi_grid = multi_grid(&mut c, blocks[num_stages as usize - 1])?;
        let norm = c.batch_norm("norm_cfg")?.unwrap_or(NormCfg::BN_DEFAULT);
        c.unimplemented("conv_cfg", &Value::None)?;
        c.unimplemented("dcn", &Value::None)?;
        c.unimplemented("plugins", &Value::None)?;
        // Only read when `dcn` is set; weight initialisation and checkpoints.
        c.inert(&[
            "stage_with_dcn",
            "zero_init_residual",
            "pretrained",
            "init_cfg",
        ]);
        let cfg = ResNetCfg {
            depth,
            block,
            stage_blocks: blocks[..num_stages as usize].to_vec(),
            in_channels: c.int("in_channels", 3)?,
            stem_channels: c.int("stem_channels", 64)?,
            base_channels: c.int("base_channels", 64)?,
            strides,
            dilations,
            out_indices,
            style,
            deep_stem,
            avg_down,
            frozen_stages: c.int("frozen_stages", -1)?,
            norm,
            norm_eval: c.flag("norm_eval", false),
            multi_grid,
            contract_dilation: c.flag("contract_dilation", false),
            with_cp: c.flag("with_cp", false),
        };
        c.finish()?;
        Ok(cfg)
    }
}

/// `depth`: the block kind and the blocks per stage (`arch_settings`, or
/// ResNeSt's own with its split-attention settings).
fn depth_and_blocks(
    c: &mut ComponentConfig,
    variant: Variant,
) -> Result<(i64, BlockKind, &'static [i64]), ModelError> {
    let depth = match c.value("depth") {
        Some(Value::Int(depth)) => *depth,
        Some(_) => return Err(c.config_error("`depth` must be an int")),
        None => return Err(c.config_error("lacks `depth` (18, 34, 50, 101 or 152)")),
    };
    let (block, blocks): (BlockKind, &'static [i64]) = match (variant, depth) {
        (Variant::ResNeSt, _) => {
            let blocks: &'static [i64] = match depth {
                50 => &[3, 4, 6, 3],
                101 => &[3, 4, 23, 3],
                152 => &[3, 8, 36, 3],
                200 => &[3, 24, 36, 3],
                other => {
                    return Err(c.config_error(format!(
                        "invalid depth {other} for resnest (50, 101, 152 or 200)"
                    )))
                }
            };
            let settings = SplitSettings {
                groups: c.int("groups", 1)?,
                base_width: c.int("base_width", 4)?,
                base_channels: c.int("base_channels", 64)?,
                radix: c.int("radix", 2)?,
                reduction_factor: c.int("reduction_factor", 4)?,
                avg_down_stride: c.flag("avg_down_stride", true),
            };
            if settings.groups < 1 || settings.radix < 1 || settings.reduction_factor < 1 {
                return Err(c.config_error("groups, radix and reduction_factor must be >= 1"));
            }
            (BlockKind::Split(settings), blocks)
        }
        (_, 18) => (BlockKind::Basic, &[2, 2, 2, 2]),
        (_, 34) => (BlockKind::Basic, &[3, 4, 6, 3]),
        (_, 50) => (BlockKind::Bottleneck, &[3, 4, 6, 3]),
        (_, 101) => (BlockKind::Bottleneck, &[3, 4, 23, 3]),
        (_, 152) => (BlockKind::Bottleneck, &[3, 8, 36, 3]),
        (_, other) => {
            return Err(c.config_error(format!(
                "invalid depth {other} for resnet (18, 34, 50, 101 or 152)"
            )))
        }
    };
    Ok((depth, block, blocks))
}

/// The stages' count, strides, dilations and output indices.
struct Stages {
    num_stages: i64,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    out_indices: Vec<i64>,
}

fn stages(c: &mut ComponentConfig) -> Result<Stages, ModelError> {
    let num_stages = c.int("num_stages", 4)?;
    if !(1..=4).contains(&num_stages) {
        return Err(c.config_error(format!("num_stages must be 1 to 4, not {num_stages}")));
    }
    let strides = c.ints("strides", &[1, 2, 2, 2])?;
    let dilations = c.ints("dilations", &[1, 1, 1, 1])?;
    if strides.len() != num_stages as usize || dilations.len() != num_stages as usize {
        return Err(c.config_error(format!(
            "strides ({}) and dilations ({}) must have num_stages ({num_stages}) entries",
            strides.len(),
            dilations.len()
        )));
    }
    let out_indices = c.ints("out_indices", &[0, 1, 2, 3])?;
    if out_indices.iter().any(|&i| i < 0 || i >= num_stages) {
        return Err(c.config_error(format!(
            "out_indices {out_indices:?} must be below num_stages ({num_stages})"
        )));
    }
    Ok(Stages {
        num_stages,
        strides,
        dilations,
        out_indices,
    })
}

/// `style`, and the stem's `deep_stem` and `avg_down` (set by ResNetV1c,
/// ResNetV1d and ResNeSt themselves).
fn style_and_stem(
    c: &mut ComponentConfig,
    variant: Variant,
) -> Result<(Style, bool, bool), ModelError> {
    let style = match c.string("style")? {
        None | Some("pytorch") => Style::Pytorch,
        Some("caffe") => Style::Caffe,
        Some(other) => {
            return Err(c.config_error(format!("style must be 'pytorch' or 'caffe', not '{other}'")))
        }
    };
    // ResNetV1c/V1d pass deep_stem (and avg_down) to ResNet themselves.
    let fixed = |c: &mut ComponentConfig, key: &str, value: bool| {
        if c.has(key) {
            return Err(c.config_error(format!(
                "sets `{key}` itself (to {}); remove it from the config",
                if value { "True" } else { "False" }
            )));
        }
        Ok(value)
    };
    let (deep_stem, avg_down) = match variant {
        Variant::ResNet => (c.flag("deep_stem", false), c.flag("avg_down", false)),
        Variant::V1c => (fixed(c, "deep_stem", true)?, fixed(c, "avg_down", false)?),
        Variant::V1d | Variant::ResNeSt => {
            (fixed(c, "deep_stem", true)?, fixed(c, "avg_down", true)?)
        }
    };
    Ok((style, deep_stem, avg_down))
}

/// `multi_grid`: one dilation per block of the last stage (`last_blocks`).
fn multi_grid(c: &mut ComponentConfig, last_blocks: i64) -> Result<Option<Vec<i64>>, ModelError> {
    let multi_grid = match c.value("multi_grid") {
        None | Some(Value::None) => None,
        Some(v) => Some(
            v.as_seq()
                .and_then(|s| s.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| c.config_error("`multi_grid` must be a tuple of ints"))?,
        ),
    };
    if let Some(grid) = &multi_grid {
        // ResLayer indexes multi_grid by block in the last stage.
        if (grid.len() as i64) < last_blocks {
            return Err(c.config_error(format!(
                "multi_grid {grid:?} needs one dilation per block of the last stage ({last_blocks})"
            )));
        }
    }
    Ok(multi_grid)
}
