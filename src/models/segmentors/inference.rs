//! Inference as MMSeg 1.2.2's `EncoderDecoder.predict` runs it
//! (`mmseg/models/segmentors/encoder_decoder.py` and
//! `cascade_encoder_decoder.py`): the data preprocessor's test path, then
//! `test_cfg.mode` `whole` (one forward over the image) or `slide` (crops of
//! `crop_size` every `stride`, their logits summed into a full-size map and
//! divided by the overlap count), each head's logits resized to the image
//! (`predict_by_feat`), and `postprocess_result`: per image, the logits
//! resized to the original shape and their argmax, both kept in the data
//! sample until the test step returns.

use super::encoder_decoder::EncoderDecoder;
use crate::config::{Dict, Value};
use crate::models::decode_heads::DECODE_HEAD_FACTS;
use crate::models::layers::shape::resize_bilinear;
use crate::models::registry::facts_of;
use crate::models::{scope, ModelError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tch::Tensor;

/// `model.test_cfg.mode`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TestMode {
    Whole,
    /// Crops of `crop` (h, w) every `stride` (h, w).
    Slide {
        crop: (i64, i64),
        stride: (i64, i64),
    },
}

impl TestMode {
    /// `model.test_cfg` of a resolved `model` dict (absent: whole).
    pub fn from_model(model: &Dict) -> Result<TestMode, ModelError> {
        let Some(test_cfg) = model.get("test_cfg").and_then(Value::as_dict) else {
            return Ok(TestMode::Whole);
        };
        let pair = |key: &str| -> Result<(i64, i64), ModelError> {
            match test_cfg.get(key).and_then(Value::as_seq) {
                Some([h, w]) => h.as_i64().zip(w.as_i64()).filter(|(h, w)| *h > 0 && *w > 0),
                _ => None,
            }
            .ok_or_else(|| {
                ModelError::config(
                    "model.test_cfg",
                    format!("{key} must be (h, w) of positive integers for mode='slide'"),
                )
            })
        };
        match test_cfg
            .get("mode")
            .and_then(Value::as_str)
            .unwrap_or("whole")
        {
            "whole" => Ok(TestMode::Whole),
            "slide" => Ok(TestMode::Slide {
                crop: pair("crop_size")?,
                stride: pair("stride")?,
            }),
            other => Err(ModelError::config(
                "model.test_cfg",
                format!("mode='{other}': MMSeg has 'whole' and 'slide'"),
            )),
        }
    }

    /// The `--cfg-options` that set this mode.
    pub fn cfg_options(&self) -> Vec<String> {
        match self {
            TestMode::Whole => vec!["model.test_cfg.mode=whole".into()],
            TestMode::Slide { crop, stride } => vec![
                "model.test_cfg.mode=slide".into(),
                format!("model.test_cfg.crop_size=({},{})", crop.0, crop.1),
                format!("model.test_cfg.stride=({},{})", stride.0, stride.1),
            ],
        }
    }

    /// A short name: `whole`, or `slide 1024x1024/768x768` (crop/stride).
    pub fn label(&self) -> String {
        match self {
            TestMode::Whole => "whole".into(),
            TestMode::Slide { crop, stride } => {
                format!("slide {}x{}/{}x{}", crop.0, crop.1, stride.0, stride.1)
            }
        }
    }

    /// The encode-decode passes over a `h x w` image: 1, or the slide grid.
    pub fn passes(&self, (h, w): (i64, i64)) -> i64 {
        match self {
            TestMode::Whole => 1,
            TestMode::Slide { crop, stride } => {
                let grids = |img: i64, c: i64, s: i64| (img - c + s - 1).max(0) / s + 1;
                grids(h, crop.0, stride.0) * grids(w, crop.1, stride.1)
            }
        }
    }
}

/// Whether inference is built for a resolved `model` dict: every decode
/// head (one, or a cascade's stages) predicts per-pixel logits.
pub fn check_inference(model: &Dict) -> Result<(), ModelError> {
    if model.get("type").and_then(Value::as_str) == Some(super::hf_segformer::TYPE) {
        return Err(ModelError::unsupported(
            super::hf_segformer::TYPE,
            "",
            "inference of a Hugging Face model is not built yet; training is",
        ));
    }
    let heads: Vec<&Value> = match model.get("decode_head") {
        Some(Value::List(stages)) => stages.iter().collect(),
        Some(head) => vec![head],
        None => Vec::new(),
    };
    let empty = Dict::new();
    let test_cfg = model
        .get("test_cfg")
        .and_then(Value::as_dict)
        .unwrap_or(&empty);
    let slide = test_cfg.get("mode").and_then(Value::as_str) == Some("slide");
    let test_pads = model
        .get("data_preprocessor")
        .and_then(Value::as_dict)
        .and_then(|d| d.get("test_cfg"))
        .and_then(Value::as_dict)
        .is_some_and(|t| !t.is_empty());
    for head in heads {
        if let Some(ty) = head.get_path("type").and_then(Value::as_str) {
            let facts = facts_of(DECODE_HEAD_FACTS, ty);
            if facts.mask_classification && slide && test_pads {
                // Its predict upsamples each crop's masks to the padded
                // image (`pad_shape`), which slide inference cannot add up.
                return Err(ModelError::unsupported(
                    "Mask2FormerHead",
                    "",
                    "slide inference with a padding data_preprocessor.test_cfg \
                     (MMSeg upsamples each crop to the whole padded image and fails); use \
                     model.test_cfg.mode=whole",
                ));
            }
            if facts.subdivision_inference {
                // MMSeg reads these as attributes of test_cfg in `predict`.
                if crate::models::decode_heads::point_head::Subdivision::from_test_cfg(test_cfg)?
                    .is_none()
                {
                    return Err(ModelError::config(
                        "PointHead",
                        "its inference reads model.test_cfg.subdivision_steps, \
                         subdivision_num_points and scale_factor; set them (PointRend's configs: \
                         2, 8196, 2)",
                    ));
                }
            }
        }
    }
    Ok(())
}

/// One image's prediction, as the data sample keeps it.
pub struct Prediction {
    /// `seg_logits`: `[K, H, W]` at the original shape.
    pub logits: Tensor,
    /// `pred_sem_seg`: `[1, H, W]` class indices.
    pub classes: Tensor,
}

impl EncoderDecoder {
    /// `encode_decode(inputs, batch_img_metas)`: the last decode head's
    /// logits (after the earlier cascade stages) resized to the input's size.
    fn encode_decode(&self, inputs: &Tensor) -> Tensor {
        let features = self.extract_feat(inputs, false);
        let heads = self.decode_heads();
        let _part = scope::enter("decode_head");
        let mut prev: Option<Tensor> = None;
        for (_, head) in &heads[..heads.len() - 1] {
            prev = Some(head.forward(&features, prev.as_ref(), false));
        }
        // `out` and `x` are locals of encode_decode: alive through predict.
        let last = &heads[heads.len() - 1].1;
        let size = (inputs.size()[2], inputs.size()[3]);
        last.predict(&features, prev.as_ref(), size) // [B, K, H, W]
    }

    /// `slide_inference`: crops every `stride`, their logits summed into a
    /// full-size map, divided by how many crops covered each pixel.
    fn slide_inference(&self, inputs: &Tensor, crop: (i64, i64), stride: (i64, i64)) -> Tensor {
        let (b, h_img, w_img) = (inputs.size()[0], inputs.size()[2], inputs.size()[3]);
        let grids = |img: i64, c: i64, s: i64| (img - c + s - 1).max(0) / s + 1;
        let (h_grids, w_grids) = (
            grids(h_img, crop.0, stride.0),
            grids(w_img, crop.1, stride.1),
        );
        let options = (inputs.kind(), inputs.device());
        let mut preds = Tensor::zeros([b, self.num_classes, h_img, w_img], options);
        let count = Tensor::zeros([b, 1, h_img, w_img], options);
        // Python's `crop_seg_logit` lives until the next crop's replaces it
        // (and the last one until the function returns).
        let mut crop_logits: Option<Tensor> = None;
        for h_idx in 0..h_grids {
            for w_idx in 0..w_grids {
                let (y2, x2) = (
                    (h_idx * stride.0 + crop.0).min(h_img),
                    (w_idx * stride.1 + crop.1).min(w_img),
                );
                let (y1, x1) = ((y2 - crop.0).max(0), (x2 - crop.1).max(0));
                let crop_img = inputs.narrow(2, y1, y2 - y1).narrow(3, x1, x2 - x1);
                let logits = crop_logits.insert(self.encode_decode(&crop_img));
                let padded = logits.pad([x1, w_img - x2, y1, h_img - y2], "constant", None);
                preds += padded;
                let mut window = count.narrow(2, y1, y2 - y1).narrow(3, x1, x2 - x1);
                window += 1;
            }
        }
        // `assert (count_mat == 0).sum() == 0`: its temporaries, not its value.
        let uncovered = count.eq(0.0).sum(None);
        drop(uncovered);
        let logits = &preds / &count;
        drop((preds, count, crop_logits));
        logits
    }

    /// `inference`: the logits `[B, K, H, W]` at the input's size.
    pub fn inference(&self, inputs: &Tensor) -> Tensor {
        match self.test_mode {
            TestMode::Whole => self.encode_decode(inputs),
            TestMode::Slide { crop, stride } => self.slide_inference(inputs, crop, stride),
        }
    }

    /// `predict(inputs, data_samples)` (under `torch.no_grad()`, as
    /// MMEngine's test loop runs it): inference, then `postprocess_result`
    /// for images whose original shape is `ori_shape`: each image's logits
    /// without its `(right, bottom)` padding, resized to `ori_shape`.
    pub fn predict(
        &self,
        inputs: &Tensor,
        paddings: &[(i64, i64)],
        ori_shape: (i64, i64),
    ) -> Vec<Prediction> {
        let seg_logits = self.inference(inputs);
        let (b, k) = (seg_logits.size()[0], seg_logits.size()[1]);
        let align_corners = self
            .decode_heads()
            .last()
            .expect("a head")
            .1
            .align_corners();
        let _part = scope::enter("postprocess");
        (0..b)
            .map(|i| {
                let (right, bottom) = paddings[i as usize];
                let (h, w) = (seg_logits.size()[2], seg_logits.size()[3]);
                let one =
                    seg_logits
                        .narrow(0, i, 1)
                        .narrow(2, 0, h - bottom)
                        .narrow(3, 0, w - right);
                let logits = resize_bilinear(&one, ori_shape, align_corners).squeeze_dim(0);
                let classes = if k > 1 {
                    logits.argmax(0, true)
                } else {
                    logits.sigmoid().gt(0.5).to_kind(tch::Kind::Int64)
                };
                Prediction { logits, classes }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use serde_json::json;

    #[test]
    fn inference_refuses_the_heads_without_a_built_predict_path_or_their_settings() {
        let point_rend = dict(json!({
            "type": "CascadeEncoderDecoder",
            "decode_head": [{"type": "FPNHead"}, {"type": "PointHead"}],
        }));
        let err = check_inference(&point_rend).unwrap_err().to_string();
        assert!(
            err.contains("PointHead") && err.contains("subdivision_steps"),
            "{err}"
        );
        let point_rend = dict(json!({
            "type": "CascadeEncoderDecoder",
            "decode_head": [{"type": "FPNHead"}, {"type": "PointHead"}],
            "test_cfg": {"mode": "whole", "subdivision_steps": 2,
                         "subdivision_num_points": 8196, "scale_factor": 2},
        }));
        assert!(check_inference(&point_rend).is_ok());
        let mask2former =
            dict(json!({"type": "EncoderDecoder", "decode_head": {"type": "Mask2FormerHead"}}));
        assert!(check_inference(&mask2former).is_ok());
        let fpn = dict(json!({"type": "EncoderDecoder", "decode_head": {"type": "FPNHead"}}));
        assert!(check_inference(&fpn).is_ok());
    }
}
