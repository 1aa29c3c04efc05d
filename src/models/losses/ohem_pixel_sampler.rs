//! `OHEMPixelSampler` (`mmseg/structures/sampler/ohem_pixel_sampler.py`),
//! a decode head's `sampler`: online hard example mining, which keeps the
//! `min_kept` hardest pixels per image (highest loss, or below a confidence
//! `thresh`) by giving them weight 1 and the others 0 in the head's losses.
//!
//! Shrivastava, Gupta and Girshick, "Training Region-based Object Detectors
//! with Online Hard Example Mining", CVPR 2016, arXiv:1604.03540.
//!
//! It runs without gradients, but its temporaries (a per-pixel loss or a
//! softmax over the full-resolution logits, the sorted values and indices)
//! are allocated in the training step, as in MMSeg.

use super::DecodeLoss;
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/structures/sampler/ohem_pixel_sampler.py";

/// `OHEMPixelSampler(context, thresh=None, min_kept=100000)`.
#[derive(Debug, Clone, PartialEq)]
pub struct OhemPixelSampler {
    pub thresh: Option<f64>,
    pub min_kept: i64,
}

impl OhemPixelSampler {
    /// A head's `sampler` setting: `None` or an `OHEMPixelSampler` dict.
    pub fn from_cfg(v: Option<&Value>) -> Result<Option<OhemPixelSampler>, ModelError> {
        let d: &Dict = match v {
            None | Some(Value::None) => return Ok(None),
            Some(Value::Dict(d)) => d,
            Some(other) => {
                return Err(ModelError::config(
                    "sampler",
                    format!("must be a dict, not {}", other.type_name()),
                ))
            }
        };
        let ty = d.get("type").and_then(Value::as_str).unwrap_or("");
        if ty != "OHEMPixelSampler" {
            return Err(ModelError::unsupported(
                "sampler",
                "type",
                format!("`{ty}` (supported: OHEMPixelSampler)"),
            ));
        }
        let mut c = ComponentConfig::new(d, "OHEMPixelSampler", SOURCE);
        let thresh = match c.value("thresh") {
            None | Some(Value::None) => None,
            Some(v) => Some(
                v.as_f64()
                    .ok_or_else(|| c.config_error("`thresh` must be a number or None"))?,
            ),
        };
        let min_kept = c.int("min_kept", 100_000)?;
        if min_kept <= 1 {
            return Err(c.config_error("min_kept must be > 1"));
        }
        c.finish()?;
        Ok(Some(OhemPixelSampler { thresh, min_kept }))
    }

    /// `sample(seg_logit, seg_label)`: the `[B, H, W]` pixel weights.
    /// `seg_logits`: `[B, K, H, W]`; `seg_label`: `[B, 1, H, W]`.
    pub fn sample(
        &self,
        seg_logits: &Tensor,
        seg_label: &Tensor,
        losses: &[DecodeLoss],
        ignore_index: i64,
    ) -> Tensor {
        tch::no_grad(|| {
            let seg_label = seg_label.squeeze_dim(1).to_kind(Kind::Int64); // [B, H, W]
            let batch_kept = self.min_kept * seg_label.size()[0];
            let valid_mask = seg_label.ne(ignore_index);
            let mut seg_weight =
                Tensor::zeros(seg_label.size(), (seg_logits.kind(), seg_logits.device()));
            let mut valid_seg_weight = seg_weight.index(&[Some(&valid_mask)]);
            match self.thresh {
                Some(thresh) => {
                    let seg_prob = seg_logits.softmax(1, None::<Kind>); // [B, K, H, W]
                    let mut tmp_label = seg_label.copy().unsqueeze(1);
                    let ignored = tmp_label.eq(ignore_index);
                    let _ = tmp_label.index_put_(
                        &[Some(&ignored)],
                        &crate::models::layers::host::scalar_from_host(0i64),
                        false,
                    );
                    let seg_prob = seg_prob.gather(1, &tmp_label, false).squeeze_dim(1);
                    let valid_prob = seg_prob.index(&[Some(&valid_mask)]);
                    let (sort_prob, _sort_indices) = valid_prob.sort(0, false);
                    let n = sort_prob.numel() as i64;
                    let min_threshold = if n > 0 {
                        sort_prob.double_value(&[batch_kept.min(n - 1)])
                    } else {
                        0.0
                    };
                    let threshold = min_threshold.max(thresh);
                    let hard = valid_prob.lt(threshold);
                    let _ = valid_seg_weight.index_put_(
                        &[Some(&hard)],
                        &crate::models::layers::host::scalar_from_host(1.0f32),
                        false,
                    );
                }
                None => {
                    let mut summed: Option<Tensor> = None;
                    for loss in losses {
                        let DecodeLoss::CrossEntropy(loss) = loss else {
                            unreachable!("DecodeHeadCfg refuses a sampler with other losses")
                        };
                        let per_pixel = loss.per_pixel(seg_logits, &seg_label, ignore_index);
                        // `losses = 0.0; losses += loss_module(...)`
                        summed = Some(match summed {
                            None => per_pixel + 0.0,
                            Some(acc) => acc + per_pixel,
                        });
                    }
                    let summed = summed.expect("a head has at least one loss");
                    let (_, sort_indices) = summed.index(&[Some(&valid_mask)]).sort(0, true);
                    let kept = sort_indices.slice(0, 0, batch_kept, 1);
                    let _ = valid_seg_weight.index_put_(
                        &[Some(&kept)],
                        &crate::models::layers::host::scalar_from_host(1.0f32),
                        false,
                    );
                }
            }
            let _ = seg_weight.index_put_(&[Some(&valid_mask)], &valid_seg_weight, false);
            seg_weight
        })
    }
}

#[cfg(test)]
#[path = "ohem_pixel_sampler_tests.rs"]
mod tests;
