//! The search space of a recipe: batch sizes, crops, mixed precision and
//! the gradient accumulation that keeps the recipe's effective batch.

use crate::config::{Dict, Value};
use crate::models::backbones::BACKBONE_FACTS;
use crate::models::decode_heads::DECODE_HEAD_FACTS;
use crate::models::registry::facts_of;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use super::recipe::Recipe;
pub use crate::kinds::Amp;
pub use crate::models::segmentors::inference::TestMode;

/// One configuration to try.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub struct Candidate {
    pub batch_size: i64,
    pub crop: (i64, i64),
    pub amp: Amp,
    pub accumulation: i64,
    /// Gradient checkpointing of the backbone (`model.backbone.with_cp`),
    /// tried only when nothing else keeps the recipe's crop and effective
    /// batch (journals written before it read as `false`).
    #[serde(default)]
    pub checkpoint: bool,
    /// Mask2Former's `train_cfg.num_points` when lowered from the config's
    /// (`None`: the config's), tried after gradient checkpointing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_points: Option<i64>,
    /// Inference searches: `model.test_cfg`'s mode (whole, or slide with
    /// its crop and stride); `batch_size` is then the test batch and
    /// `crop` the image size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_mode: Option<TestMode>,
}

/// The model-side knobs of a candidate, which change what a trial builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ModelKnobs {
    pub checkpoint: bool,
    pub num_points: Option<i64>,
    pub test_mode: Option<TestMode>,
}

impl Candidate {
    pub fn key(&self) -> String {
        format!(
            "b{}-{}x{}-{}-acc{}{}{}",
            self.batch_size,
            self.crop.0,
            self.crop.1,
            self.amp.name(),
            self.accumulation,
            if self.checkpoint { "-cp" } else { "" },
            self.num_points
                .map(|k| format!("-k{k}"))
                .unwrap_or_default()
        ) + self
            .test_mode
            .map(|m| format!("-infer-{}", m.label().replace(' ', "-")))
            .unwrap_or_default()
            .as_str()
    }
    pub fn knobs(&self) -> ModelKnobs {
        ModelKnobs {
            checkpoint: self.checkpoint,
            num_points: self.num_points,
            test_mode: self.test_mode,
        }
    }
    pub fn effective_batch(&self, gpus: i64) -> i64 {
        self.batch_size * self.accumulation * gpus
    }
}

/// Crops to try: the recipe's, then smaller multiples of 32 with the same
/// aspect ratio, down to half the recipe's side.
pub fn crops(recipe: (i64, i64)) -> Vec<(i64, i64)> {
    let (h, w) = recipe;
    let mut out = vec![(h, w)];
    let short = h.min(w);
    // Step the shorter side down by 32; the longer side follows the ratio.
    let mut side = (short / 32) * 32;
    if side == short {
        side -= 32;
    }
    while side * 2 >= short && side > 0 {
        let other =
            (((side as f64 * h.max(w) as f64 / short as f64) / 32.0).round() as i64 * 32).max(32);
        let c = if h <= w { (side, other) } else { (other, side) };
        if !out.contains(&c) {
            out.push(c);
        }
        side -= 32;
    }
    out
}

/// The precisions a search tries: those `asked` (`--amp`; `None`: all)
/// among those `offered` (the GPU's, for the kind of step), in the offered
/// order. Err: none of them is offered (the message names the offered).
pub fn precisions(asked: Option<&[Amp]>, offered: &[Amp]) -> Result<Vec<Amp>, String> {
    let Some(asked) = asked else {
        return Ok(offered.to_vec());
    };
    let kept: Vec<Amp> = offered
        .iter()
        .copied()
        .filter(|a| asked.contains(a))
        .collect();
    if kept.is_empty() {
        let names = |list: &[Amp]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        return Err(format!(
            "--amp {}: none of it can run here, where the precisions are {}",
            names(asked).join(","),
            names(offered).join(", ")
        ));
    }
    Ok(kept)
}

/// Batch sizes to try: powers of two and the recipe's own, up to the
/// effective batch (a larger per-GPU batch would change the recipe).
pub fn batch_sizes(recipe: &Recipe, gpus: i64) -> Vec<i64> {
    let limit = (recipe.effective_batch / gpus).max(1);
    let mut out: Vec<i64> = std::iter::successors(Some(1i64), |b| Some(b * 2))
        .take_while(|b| *b <= limit)
        .collect();
    if recipe.batch_size <= limit && !out.contains(&recipe.batch_size) {
        out.push(recipe.batch_size);
    }
    out.sort();
    out
}

/// The accumulation that keeps the effective batch, or `None` when the
/// batch does not divide it (then `auto_scale_lr` must compensate).
pub fn accumulation_for(batch: i64, gpus: i64, effective: i64) -> Option<i64> {
    let per_step = batch * gpus;
    (effective % per_step == 0).then(|| effective / per_step)
}

/// `options`, plus the model knobs' items (`knobs::cfg_option_items`) and
/// an inference search's test mode: what a trial or trace of a candidate
/// runs with.
pub fn options_with_knobs(options: &[String], knobs: ModelKnobs) -> Vec<String> {
    let mut out = options.to_vec();
    out.extend(super::knobs::cfg_option_items(knobs));
    if let Some(mode) = knobs.test_mode {
        out.extend(mode.cfg_options());
    }
    out
}

/// The lowered `num_points` to try for a config whose decode head is a
/// mask-classification head (Mask2Former's point-sampled mask loss) at
/// `crop`, largest first: the config's K (default 112*112 = 12544) minus
/// multiples of K/4, down to the rule of thumb's floor (long side / 10)^2
/// (its range is (long/10)^2 to (long/8)^2 points). Empty for other heads.
pub fn num_points_options(cfg: &Dict, crop: (i64, i64)) -> Vec<i64> {
    let Some(head) = cfg.get("model").and_then(|m| m.get_path("decode_head")) else {
        return Vec::new();
    };
    let samples_points = head
        .get_path("type")
        .and_then(Value::as_str)
        .is_some_and(|t| facts_of(DECODE_HEAD_FACTS, t).mask_classification);
    if !samples_points {
        return Vec::new();
    }
    let default = head
        .get_path("train_cfg")
        .and_then(|t| t.get_path("num_points"))
        .and_then(Value::as_i64)
        .unwrap_or(12544);
    let long = crop.0.max(crop.1) as f64;
    let floor = (long / 10.0).powi(2).ceil() as i64;
    let step = default / 4;
    if step < 1 {
        return Vec::new();
    }
    (1..4)
        .map(|i| default - i * step)
        .filter(|k| *k >= floor.max(1))
        .collect()
}

/// Whether the config's backbone takes `with_cp` (and does not set it
/// already): the search may then try gradient checkpointing.
pub fn checkpoint_available(cfg: &Dict) -> bool {
    let Some(backbone) = cfg.get("model").and_then(|m| m.get_path("backbone")) else {
        return false;
    };
    let accepts = backbone
        .get_path("type")
        .and_then(Value::as_str)
        .is_some_and(|t| facts_of(BACKBONE_FACTS, t).takes_with_cp);
    let already = backbone.get_path("with_cp").is_some_and(Value::truthy);
    accepts && !already
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amp_keeps_the_asked_precisions_the_gpu_runs() {
        let all = [Amp::Off, Amp::Fp16, Amp::Bf16];
        assert_eq!(precisions(None, &all).unwrap(), all);
        assert_eq!(
            precisions(Some(&[Amp::Bf16, Amp::Off]), &all).unwrap(),
            [Amp::Off, Amp::Bf16],
            "in the offered order"
        );
        let turing = [Amp::Off, Amp::Fp16];
        assert_eq!(
            precisions(Some(&[Amp::Fp16, Amp::Bf16]), &turing).unwrap(),
            [Amp::Fp16]
        );
        let err = precisions(Some(&[Amp::Bf16]), &turing).unwrap_err();
        assert_eq!(
            err,
            "--amp bf16: none of it can run here, where the precisions are off, fp16"
        );
    }

    fn cfg(json: serde_json::Value) -> Dict {
        match crate::config::dump::from_json(&json) {
            Value::Dict(d) => d,
            _ => unreachable!(),
        }
    }

    #[test]
    fn crops_keep_the_aspect_ratio_down_to_half() {
        assert_eq!(
            crops((512, 512)),
            vec![
                (512, 512),
                (480, 480),
                (448, 448),
                (416, 416),
                (384, 384),
                (352, 352),
                (320, 320),
                (288, 288),
                (256, 256)
            ]
        );
        let c = crops((512, 1024));
        assert_eq!(c[0], (512, 1024));
        assert_eq!(c[1], (480, 960));
        assert_eq!(*c.last().unwrap(), (256, 512));
    }

    #[test]
    fn batches_and_accumulation() {
        let r = Recipe {
            batch_size: 2,
            crop: (512, 512),
            effective_batch: 16,
            effective_batch_source: String::new(),
            accumulation: 1,
            amp: Amp::Off,
            name_note: None,
        };
        assert_eq!(batch_sizes(&r, 1), vec![1, 2, 4, 8, 16]);
        assert_eq!(accumulation_for(4, 1, 16), Some(4));
        assert_eq!(accumulation_for(3, 1, 16), None);
    }

    #[test]
    fn num_points_step_down_by_a_quarter_to_the_rule_of_thumb_floor() {
        let m2f = |k: Option<i64>| {
            let mut head = serde_json::json!({"type": "Mask2FormerHead"});
            if let Some(k) = k {
                head["train_cfg"] = serde_json::json!({"num_points": k});
            }
            cfg(serde_json::json!({"model": {"decode_head": head}}))
        };
        // 512x512: floor (51.2)^2 = 2622 points.
        assert_eq!(
            num_points_options(&m2f(None), (512, 512)),
            vec![9408, 6272, 3136]
        );
        // 512x1024: floor (102.4)^2 = 10486; 9408 is below it.
        assert!(num_points_options(&m2f(None), (512, 1024)).is_empty());
        assert_eq!(
            num_points_options(&m2f(Some(4000)), (256, 256)),
            vec![3000, 2000, 1000]
        );
        let fcn = cfg(serde_json::json!({"model": {"decode_head": {"type": "FCNHead"}}}));
        assert!(num_points_options(&fcn, (512, 512)).is_empty());
    }

    #[test]
    fn checkpointing_is_offered_for_backbones_that_take_with_cp() {
        let cfg =
            |backbone: serde_json::Value| cfg(serde_json::json!({"model": {"backbone": backbone}}));
        assert!(checkpoint_available(&cfg(
            serde_json::json!({"type": "SwinTransformer"})
        )));
        assert!(checkpoint_available(&cfg(
            serde_json::json!({"type": "ResNetV1c"})
        )));
        assert!(!checkpoint_available(&cfg(
            serde_json::json!({"type": "HRNet"})
        )));
        assert!(!checkpoint_available(&cfg(
            serde_json::json!({"type": "MixVisionTransformer", "with_cp": true})
        )));
    }
}
