//! The search's knobs as data: every setting `segtune search` turns or
//! holds (batch, crop, accumulation, mixed precision, gradient
//! checkpointing, Mask2Former's point count, the caching allocator's
//! settings, cuDNN's benchmark), where each applies, the config keys that
//! set it, what it costs, when the search tries it and its column in the
//! tables. The strategy takes the order of its fallback passes from here
//! and knows no model; the emitted config, the `--cfg-options` line, the
//! progress line and the tables write a candidate's model knobs from here.
//!
//! Adding a knob: a [`Knob`] variant and its [`KNOBS`] row (in the enum's
//! order); a model knob also gets its field in `space::ModelKnobs`, its
//! [`Setting`] and, where it applies only to some models, a fact in the
//! model registry (see `docs/architecture.md`, "How to add a knob").

use super::space::ModelKnobs;
use crate::config::Value;

/// A knob of the search, in [`KNOBS`]'s order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    BatchSize,
    Crop,
    Accumulation,
    Amp,
    Checkpoint,
    NumPoints,
    AllocatorSettings,
    CudnnBenchmark,
}

/// When the search turns a knob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Part of every candidate: each (crop, precision) group's binary
    /// search over the batch.
    Grid,
    /// After the grid, only while no candidate keeps the recipe's crop and
    /// effective batch, at the recipe's crop. Rank 1 is tried first; a
    /// knob of a higher rank is tried alone, then with each lower one.
    Fallback(u8),
    /// On a candidate that does not fit as it is, the same candidate again
    /// with it (predictions).
    Rescue,
    /// Fixed for the whole search (the config, or a flag).
    Setting,
}

/// Which runs a knob applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applies {
    /// Every training run.
    Always,
    /// fp16 everywhere; bf16 on cards that have it (the preset's `bf16`).
    CardPrecisions,
    /// Backbones whose registry row takes `with_cp` (the fact
    /// `takes_with_cp`), where the config does not set it already.
    BackboneTakesWithCp,
    /// Decode heads whose mask loss samples points (Mask2Former's
    /// `train_cfg.num_points`; the registry fact `mask_classification`),
    /// down to the rule of thumb's floor.
    PointSampledHead,
    /// PyTorch >= 2.1 (`expandable_segments`).
    ExpandableSegments,
    /// CUDA runs (cuDNN's convolutions).
    Cudnn,
}

/// A knob's row: what it is, where it applies, how a config sets it, what
/// it costs, when the search turns it and where the tables show it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KnobSpec {
    pub knob: Knob,
    pub applies: Applies,
    /// The config keys (`--cfg-options` paths) it sets; empty for an
    /// environment variable.
    pub cfg_keys: &'static [&'static str],
    /// What turning it costs, for the docs and `--why`.
    pub cost: &'static str,
    pub stage: Stage,
    /// Its column in the search tables ("" where it has none: the notes say it).
    pub column: &'static str,
    /// How the progress line and the report page name a non-default
    /// setting of a model knob.
    pub label: &'static str,
}

/// Every knob, in [`Knob`]'s order.
pub const KNOBS: [KnobSpec; 8] = [
    KnobSpec {
        knob: Knob::BatchSize,
        applies: Applies::Always,
        cfg_keys: &["train_dataloader.batch_size"],
        cost: "memory grows with it; a smaller batch needs accumulation to keep the effective batch",
        stage: Stage::Grid,
        column: "batch",
        label: "batch",
    },
    KnobSpec {
        knob: Knob::Crop,
        applies: Applies::Always,
        cfg_keys: &[
            "train_dataloader.dataset.pipeline.<RandomCrop>.crop_size",
            "model.data_preprocessor.size",
        ],
        cost: "changes what the model learns from: tried only below the recipe's crop, with keep-crop only where nothing fits at it",
        stage: Stage::Grid,
        column: "crop",
        label: "crop",
    },
    KnobSpec {
        knob: Knob::Accumulation,
        applies: Applies::Always,
        cfg_keys: &["optim_wrapper.accumulative_counts"],
        cost: "none in memory; steps per effective batch grow",
        stage: Stage::Grid,
        column: "accum",
        label: "accum",
    },
    KnobSpec {
        knob: Knob::Amp,
        applies: Applies::CardPrecisions,
        cfg_keys: &["optim_wrapper.type", "optim_wrapper.dtype", "optim_wrapper.loss_scale"],
        cost: "half-precision activations; fp16 needs loss scaling",
        stage: Stage::Grid,
        column: "amp",
        label: "amp",
    },
    KnobSpec {
        knob: Knob::Checkpoint,
        applies: Applies::BackboneTakesWithCp,
        cfg_keys: &["model.backbone.with_cp"],
        cost: "the backbone's blocks run forward twice (about +20-35% step time), the same training",
        stage: Stage::Fallback(1),
        column: "with_cp",
        label: "with_cp",
    },
    KnobSpec {
        knob: Knob::NumPoints,
        applies: Applies::PointSampledHead,
        cfg_keys: &["model.decode_head.train_cfg.num_points"],
        cost: "the mask loss sees fewer points: a different training, so tried after checkpointing",
        stage: Stage::Fallback(2),
        column: "points",
        label: "points",
    },
    KnobSpec {
        knob: Knob::AllocatorSettings,
        applies: Applies::ExpandableSegments,
        cfg_keys: &[],
        cost: "none in the step; the environment PYTORCH_CUDA_ALLOC_CONF must be set for the run",
        stage: Stage::Rescue,
        column: "",
        label: "PYTORCH_CUDA_ALLOC_CONF",
    },
    KnobSpec {
        knob: Knob::CudnnBenchmark,
        applies: Applies::Cudnn,
        cfg_keys: &["env_cfg.cudnn_benchmark"],
        cost: "the first step times cuDNN's algorithms (more memory in MMEngine's first log line)",
        stage: Stage::Setting,
        column: "",
        label: "cudnn_benchmark",
    },
];

/// The row of `knob`.
pub const fn spec(knob: Knob) -> &'static KnobSpec {
    &KNOBS[knob as usize]
}

/// One non-default setting of a model knob (one that changes what a trial
/// builds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    Checkpoint(bool),
    NumPoints(Option<i64>),
}

impl Setting {
    pub fn knob(self) -> Knob {
        match self {
            Setting::Checkpoint(_) => Knob::Checkpoint,
            Setting::NumPoints(_) => Knob::NumPoints,
        }
    }

    fn apply(self, knobs: ModelKnobs) -> ModelKnobs {
        match self {
            Setting::Checkpoint(on) => ModelKnobs {
                checkpoint: on,
                ..knobs
            },
            Setting::NumPoints(k) => ModelKnobs {
                num_points: k,
                ..knobs
            },
        }
    }

    /// The config value it sets at its knob's key (`None`: the config's).
    fn value(self) -> Option<Value> {
        match self {
            Setting::Checkpoint(true) => Some(Value::Bool(true)),
            Setting::NumPoints(Some(k)) => Some(Value::Int(k)),
            Setting::Checkpoint(false) | Setting::NumPoints(None) => None,
        }
    }

    /// How the progress line and the report page name it (`with_cp`,
    /// `points 6272`).
    pub fn label(self) -> String {
        let label = spec(self.knob()).label;
        match self {
            Setting::NumPoints(Some(k)) => format!("{label} {k}"),
            _ => label.to_string(),
        }
    }

    /// How the emitted config's header says it.
    pub fn note(self) -> String {
        let (key, value) = self.config_item().expect("a non-default setting");
        let item = format!("{key}={}", python_literal(&value));
        match self {
            Setting::Checkpoint(_) => format!("gradient checkpointing ({item})"),
            Setting::NumPoints(k) => format!(
                "Mask2Former's point loss on {} points ({item})",
                k.unwrap_or_default()
            ),
        }
    }

    /// Its config key and value, `None` at the config's own.
    pub fn config_item(self) -> Option<(&'static str, Value)> {
        Some((spec(self.knob()).cfg_keys[0], self.value()?))
    }
}

/// The non-default model-knob settings of `knobs`, in [`KNOBS`]'s order
/// (the test mode of an inference search is its own: `TestMode`).
pub fn settings(knobs: ModelKnobs) -> Vec<Setting> {
    [
        Setting::Checkpoint(knobs.checkpoint),
        Setting::NumPoints(knobs.num_points),
    ]
    .into_iter()
    .filter(|s| s.value().is_some())
    .collect()
}

/// The `--cfg-options` items that set `knobs`' model knobs
/// (`model.backbone.with_cp=True`).
pub fn cfg_option_items(knobs: ModelKnobs) -> Vec<String> {
    settings(knobs)
        .into_iter()
        .filter_map(Setting::config_item)
        .map(|(key, value)| format!("{key}={}", python_literal(&value)))
        .collect()
}

fn python_literal(value: &Value) -> String {
    match value {
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// What a config offers the fallback knobs: whether its backbone takes
/// `with_cp`, and its head's lowered point counts (largest first).
#[derive(Debug, Clone, Copy, Default)]
pub struct FallbackOptions<'a> {
    pub checkpoint: bool,
    pub num_points: &'a [i64],
}

impl FallbackOptions<'_> {
    /// The settings of `knob` to try, its default first.
    fn settings_of(&self, knob: Knob) -> Vec<Setting> {
        match knob {
            Knob::Checkpoint => {
                let mut out = vec![Setting::Checkpoint(false)];
                if self.checkpoint {
                    out.push(Setting::Checkpoint(true));
                }
                out
            }
            Knob::NumPoints => std::iter::once(None)
                .chain(self.num_points.iter().copied().map(Some))
                .map(Setting::NumPoints)
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// The passes after the grid, in order: each [`Stage::Fallback`] knob by
/// rank, a higher rank's every setting tried alone and then with each
/// lower rank's (checkpointing; then each point count without, then with
/// checkpointing).
pub fn fallback_passes(base: ModelKnobs, options: FallbackOptions) -> Vec<ModelKnobs> {
    let mut ranked: Vec<(u8, Knob)> = KNOBS
        .iter()
        .filter_map(|k| match k.stage {
            Stage::Fallback(rank) => Some((rank, k.knob)),
            _ => None,
        })
        .collect();
    ranked.sort_by_key(|(rank, _)| *rank);
    let mut passes = vec![base];
    for (_, knob) in ranked {
        passes = options
            .settings_of(knob)
            .into_iter()
            .flat_map(|setting| passes.iter().map(move |p| setting.apply(*p)))
            .collect();
    }
    passes.remove(0);
    passes
}

/// How much of the recipe's training a candidate's knobs keep, larger
/// first: knobs that change what the step computes (fewer points) rank
/// below the config's own; checkpointing changes only the cost.
pub fn recipe_fidelity(knobs: ModelKnobs) -> i64 {
    knobs.num_points.unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_the_enums_order() {
        for (i, row) in KNOBS.iter().enumerate() {
            assert_eq!(row.knob as usize, i, "{:?}", row.knob);
        }
    }

    #[test]
    fn fallbacks_try_checkpointing_then_each_point_count_without_and_with_it() {
        let cp = ModelKnobs {
            checkpoint: true,
            ..ModelKnobs::default()
        };
        let k = |n: i64, checkpoint: bool| ModelKnobs {
            checkpoint,
            num_points: Some(n),
            ..ModelKnobs::default()
        };
        let both = FallbackOptions {
            checkpoint: true,
            num_points: &[9408, 6272],
        };
        assert_eq!(
            fallback_passes(ModelKnobs::default(), both),
            vec![
                cp,
                k(9408, false),
                k(9408, true),
                k(6272, false),
                k(6272, true)
            ]
        );
        let points_only = FallbackOptions {
            checkpoint: false,
            num_points: &[9408],
        };
        assert_eq!(
            fallback_passes(ModelKnobs::default(), points_only),
            vec![k(9408, false)]
        );
        assert!(fallback_passes(ModelKnobs::default(), FallbackOptions::default()).is_empty());
    }

    #[test]
    fn model_knobs_are_written_from_the_table() {
        let knobs = ModelKnobs {
            checkpoint: true,
            num_points: Some(6272),
            ..ModelKnobs::default()
        };
        assert_eq!(
            cfg_option_items(knobs),
            vec![
                "model.backbone.with_cp=True".to_string(),
                "model.decode_head.train_cfg.num_points=6272".to_string()
            ]
        );
        let labels: Vec<String> = settings(knobs).into_iter().map(Setting::label).collect();
        assert_eq!(labels, vec!["with_cp", "points 6272"]);
        assert!(cfg_option_items(ModelKnobs::default()).is_empty());
    }
}
