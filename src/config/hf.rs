//! Hugging Face SegFormer fine-tuning as a config: a directory as
//! `save_pretrained` writes it (`config.json`, optionally
//! `preprocessor_config.json`) and optionally the run's
//! `training_args.json` (the `TrainingArguments` fields segtune reads),
//! translated into the MMSeg-shaped config the rest of segtune works on.
//!
//! What the translation stands for, with transformers 5.x's defaults:
//! - `model`: `SegformerForSemanticSegmentation` (`backbone` is the
//!   `SegformerModel` encoder, `decode_head` the `SegformerDecodeHead` and
//!   its loss) whose batch arrives as `pixel_values` + `labels`;
//! - `crop_size`: the image processor's `size` (`SegformerImageProcessor`
//!   resizes every image to it; 512x512 unless `preprocessor_config.json`
//!   says otherwise);
//! - `train_dataloader.batch_size`: `per_device_train_batch_size` (8);
//! - `optim_wrapper`: what `Trainer` builds: `AdamW` (lr 5e-5, betas
//!   (0.9, 0.999), eps 1e-8, weight decay 0, `fused=True`, the
//!   `adamw_torch_fused` default), `max_grad_norm` 1.0 as `clip_grad`,
//!   `gradient_accumulation_steps` as `accumulative_counts`, and fp16/bf16
//!   as `AmpOptimWrapper` (accelerate's autocast and GradScaler);
//! - `gradient_checkpointing` as `model.backbone.with_cp`.
//!
//! Two defaults moved with transformers 5 and change memory; segtune takes
//! them from `config.json`'s `transformers_version` (the version that
//! saved the model; absent: 5): SegFormer's attention is
//! `scaled_dot_product_attention` (`sdpa`) from 5.0 and the explicit
//! `eager` attention before (4.x's `SegformerEfficientSelfAttention` keeps
//! the `[B, heads, N, N/sr^2]` probabilities for backward), and `Trainer`'s
//! optimizer is `adamw_torch_fused` in 5.x (measured with 5.24) and taken
//! as `adamw_torch` before. `_attn_implementation` in `config.json` and
//! `optim` in `training_args.json` override them.

use super::error::{ConfigError, ErrorKind};
use super::value::{Dict, Value};
use std::path::Path;

/// The keys of a `SegformerConfig` the encoder reads.
const ENCODER_KEYS: &[&str] = &[
    "num_encoder_blocks",
    "_attn_implementation",
    "num_channels",
    "depths",
    "sr_ratios",
    "hidden_sizes",
    "patch_sizes",
    "strides",
    "num_attention_heads",
    "mlp_ratios",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "drop_path_rate",
    "hidden_act",
    "reshape_last_stage",
    "layer_norm_eps",
    "initializer_range",
];

/// The keys of a `SegformerConfig` the decode head and the loss read.
const HEAD_KEYS: &[&str] = &[
    "hidden_sizes",
    "decoder_hidden_size",
    "classifier_dropout_prob",
    "semantic_loss_ignore_index",
];

/// The `model.type` of a translated Hugging Face SegFormer.
pub const HF_SEGFORMER: &str = "SegformerForSemanticSegmentation";

/// `SegformerImageProcessor`'s default `size`.
const DEFAULT_PROCESSOR_SIZE: (i64, i64) = (512, 512);

/// Whether `path` is a Hugging Face model directory (holds `config.json`).
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ConfigError::new(
                ErrorKind::Io,
                format!("cannot read {}: {e}", path.display()),
            ))
        }
    };
    if text.len() > 16 << 20 {
        return Err(ConfigError::new(
            ErrorKind::Limit,
            format!(
                "{} is larger than 16 MiB; not a model config",
                path.display()
            ),
        ));
    }
    serde_json::from_str(&text).map(Some).map_err(|e| {
        ConfigError::new(
            ErrorKind::Syntax,
            format!("{}:{}:{}: {e}", path.display(), e.line(), e.column()),
        )
        .with_help("the file must be JSON as `save_pretrained` writes it")
    })
}

fn to_value(j: &serde_json::Value) -> Value {
    match j {
        serde_json::Value::Null => Value::None,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::Str(s.clone()),
        serde_json::Value::Array(items) => Value::List(items.iter().map(to_value).collect()),
        serde_json::Value::Object(map) => {
            Value::Dict(map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect())
        }
    }
}

fn object(
    j: serde_json::Value,
    path: &Path,
) -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
    match j {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err(ConfigError::new(
            ErrorKind::Syntax,
            format!("{}: expected a JSON object", path.display()),
        )),
    }
}

fn wrong(path: &Path, key: &str, what: &str) -> ConfigError {
    ConfigError::new(
        ErrorKind::Evaluation,
        format!("{}: `{key}` {what}", path.display()),
    )
}

/// The image size of a `preprocessor_config.json`: `size` as
/// `{"height", "width"}`, `{"shortest_edge"}` (square) or a number.
fn processor_size(
    p: &serde_json::Map<String, serde_json::Value>,
    path: &Path,
) -> Result<(i64, i64), ConfigError> {
    if p.get("do_resize").and_then(serde_json::Value::as_bool) == Some(false) {
        return Err(wrong(
            path,
            "do_resize",
            "is false: images keep their own size, so segtune cannot tell the training size",
        ));
    }
    let size = match p.get("size") {
        None => return Ok(DEFAULT_PROCESSOR_SIZE),
        Some(s) => s,
    };
    let int = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_i64);
    let hw = match size {
        serde_json::Value::Number(n) => n.as_i64().map(|s| (s, s)),
        serde_json::Value::Object(m) => match (int(m.get("height")), int(m.get("width"))) {
            (Some(h), Some(w)) => Some((h, w)),
            _ => int(m.get("shortest_edge")).map(|s| (s, s)),
        },
        _ => None,
    };
    match hw {
        Some((h, w)) if (32..=16384).contains(&h) && (32..=16384).contains(&w) => Ok((h, w)),
        _ => Err(wrong(
            path,
            "size",
            &format!(
                "is {size}; expected {{\"height\": H, \"width\": W}} with sides from 32 to 16384"
            ),
        )),
    }
}

/// The label count `PretrainedConfig` derives: `num_labels`, else the size
/// of `id2label`, else 2.
fn num_labels(c: &serde_json::Map<String, serde_json::Value>) -> i64 {
    c.get("num_labels")
        .and_then(serde_json::Value::as_i64)
        .or_else(|| {
            c.get("id2label")
                .and_then(serde_json::Value::as_object)
                .map(|m| m.len() as i64)
        })
        .unwrap_or(2)
}

/// The `TrainingArguments` fields of `training_args.json` that change
/// memory, with their defaults.
struct TrainingArgs {
    batch_size: i64,
    accumulation: i64,
    fp16: bool,
    bf16: bool,
    gradient_checkpointing: bool,
    max_grad_norm: f64,
    learning_rate: f64,
    weight_decay: f64,
    fused: bool,
}

fn training_args(
    t: Option<serde_json::Map<String, serde_json::Value>>,
    path: &Path,
    transformers_major: u32,
) -> Result<TrainingArgs, ConfigError> {
    let t = t.unwrap_or_default();
    let int = |k: &str, d: i64| -> Result<i64, ConfigError> {
        match t.get(k) {
            None => Ok(d),
            Some(v) => v
                .as_i64()
                .filter(|n| *n >= 1)
                .ok_or_else(|| wrong(path, k, "must be an integer >= 1")),
        }
    };
    let float = |k: &str, d: f64| -> Result<f64, ConfigError> {
        match t.get(k) {
            None => Ok(d),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .ok_or_else(|| wrong(path, k, "must be a number")),
        }
    };
    let flag = |k: &str| {
        t.get(k)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    };
    let fused = match t.get("optim").and_then(serde_json::Value::as_str) {
        None => transformers_major >= 5,
        Some("adamw_torch_fused") => true,
        Some("adamw_torch") => false,
        Some(other) => {
            return Err(wrong(
                path,
                "optim",
                &format!("is `{other}`; segtune builds adamw_torch_fused and adamw_torch"),
            ))
        }
    };
    let args = TrainingArgs {
        batch_size: int("per_device_train_batch_size", 8)?,
        accumulation: int("gradient_accumulation_steps", 1)?,
        fp16: flag("fp16"),
        bf16: flag("bf16"),
        gradient_checkpointing: flag("gradient_checkpointing"),
        max_grad_norm: float("max_grad_norm", 1.0)?,
        learning_rate: float("learning_rate", 5e-5)?,
        weight_decay: float("weight_decay", 0.0)?,
        fused,
    };
    if args.fp16 && args.bf16 {
        return Err(wrong(path, "fp16", "and `bf16` are both true; pick one"));
    }
    Ok(args)
}

fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(items.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn pick(config: &Dict, keys: &[&str], ty: &str) -> Dict {
    let mut d = Dict::new();
    d.insert("type".into(), Value::Str(ty.into()));
    for key in keys {
        if let Some(v) = config.get(*key) {
            d.insert((*key).to_string(), v.clone());
        }
    }
    d
}

/// Translates the model directory `dir` into a config (see the module doc).
pub fn load_dir(dir: &Path) -> Result<Dict, ConfigError> {
    let config_json = segformer_config(dir)?;
    let labels = num_labels(&config_json);
    let saved_by = config_json
        .get("transformers_version")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    let major = saved_by
        .as_deref()
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok())
        .unwrap_or(5);
    let mut config_json = config_json;
    if !config_json.contains_key("_attn_implementation") {
        let attention = if major >= 5 { "sdpa" } else { "eager" };
        config_json.insert("_attn_implementation".into(), attention.into());
    }
    let config = match to_value(&serde_json::Value::Object(config_json)) {
        Value::Dict(d) => d,
        _ => unreachable!("an object converts to a dict"),
    };
    let processor_path = dir.join("preprocessor_config.json");
    let crop = match read_json(&processor_path)? {
        Some(p) => processor_size(&object(p, &processor_path)?, &processor_path)?,
        None => DEFAULT_PROCESSOR_SIZE,
    };
    let args_path = dir.join("training_args.json");
    let args = training_args(
        read_json(&args_path)?
            .map(|j| object(j, &args_path))
            .transpose()?,
        &args_path,
        major,
    )?;
    let mut backbone = pick(&config, ENCODER_KEYS, "SegformerModel");
    backbone.insert("with_cp".into(), Value::Bool(args.gradient_checkpointing));
    let mut decode_head = pick(&config, HEAD_KEYS, "SegformerDecodeHead");
    decode_head.insert("num_labels".into(), Value::Int(labels));
    let model = dict(vec![
        ("type", Value::Str(HF_SEGFORMER.into())),
        (
            "data_preprocessor",
            dict(vec![("type", Value::Str("PixelValues".into()))]),
        ),
        ("backbone", Value::Dict(backbone)),
        ("decode_head", Value::Dict(decode_head)),
    ]);
    let mut cfg = Dict::new();
    cfg.insert("model".into(), model);
    cfg.insert(
        "crop_size".into(),
        Value::Tuple(vec![Value::Int(crop.0), Value::Int(crop.1)]),
    );
    cfg.insert(
        "train_dataloader".into(),
        dict(vec![("batch_size", Value::Int(args.batch_size))]),
    );
    cfg.insert("optim_wrapper".into(), optim_wrapper_of(&args));
    cfg.insert(
        "hf".into(),
        dict(vec![
            ("dir", Value::Str(dir.display().to_string())),
            (
                "transformers_version",
                saved_by.map_or(Value::None, Value::Str),
            ),
            ("config", Value::Dict(config)),
        ]),
    );
    Ok(cfg)
}

/// `dir/config.json` as an object, refused unless it is a SegFormer's.
fn segformer_config(dir: &Path) -> Result<serde_json::Map<String, serde_json::Value>, ConfigError> {
    let config_path = dir.join("config.json");
    let config_json = read_json(&config_path)?.ok_or_else(|| {
        ConfigError::new(
            ErrorKind::Io,
            format!("{} has no config.json", dir.display()),
        )
    })?;
    let config_json = object(config_json, &config_path)?;
    match config_json
        .get("model_type")
        .and_then(serde_json::Value::as_str)
    {
        Some("segformer") => {}
        other => {
            return Err(ConfigError::new(
                ErrorKind::Unsupported,
                format!(
                    "{}: model_type is {}; segtune builds Hugging Face `segformer` models",
                    config_path.display(),
                    other.map_or("missing".to_string(), |t| format!("`{t}`"))
                ),
            ))
        }
    }
    Ok(config_json)
}

/// Trainer's optimizer as MMEngine's `optim_wrapper`: AdamW (fused if the
/// arguments say so), the accumulation, `max_grad_norm`'s clipping, AMP.
fn optim_wrapper_of(args: &TrainingArgs) -> Value {
    let amp = args.fp16 || args.bf16;
    let mut optim_wrapper = vec![
        (
            "type",
            Value::Str(
                if amp {
                    "AmpOptimWrapper"
                } else {
                    "OptimWrapper"
                }
                .into(),
            ),
        ),
        (
            "optimizer",
            dict(vec![
                ("type", Value::Str("AdamW".into())),
                ("lr", Value::Float(args.learning_rate)),
                (
                    "betas",
                    Value::Tuple(vec![Value::Float(0.9), Value::Float(0.999)]),
                ),
                ("eps", Value::Float(1e-8)),
                ("weight_decay", Value::Float(args.weight_decay)),
                ("fused", Value::Bool(args.fused)),
            ]),
        ),
        ("accumulative_counts", Value::Int(args.accumulation)),
    ];
    if args.max_grad_norm > 0.0 {
        optim_wrapper.push((
            "clip_grad",
            dict(vec![
                ("max_norm", Value::Float(args.max_grad_norm)),
                ("norm_type", Value::Float(2.0)),
            ]),
        ));
    }
    if amp {
        let dtype = if args.bf16 { "bfloat16" } else { "float16" };
        optim_wrapper.push(("dtype", Value::Str(dtype.into())));
    }
    dict(optim_wrapper)
}
