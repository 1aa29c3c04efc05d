//! `SegDataPreProcessor` (`mmseg/models/data_preprocessor.py`): in training,
//! BGR->RGB, normalisation, padding of every image and label map to `size`,
//! and stacking the images into the batch the backbone takes.

use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::params::ParamScope;
use crate::models::ModelError;
use tch::{Device, Kind, Tensor};

const SOURCE: &str = "mmseg/models/data_preprocessor.py";

/// `SegDataPreProcessor` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessorCfg {
    pub mean: Option<Vec<f64>>,
    pub std: Option<Vec<f64>>,
    pub bgr_to_rgb: bool,
    pub size: Option<(i64, i64)>,
    pub pad_val: f64,
    pub seg_pad_val: f64,
    /// `test_cfg`'s padding of the test path (`size` or `size_divisor`).
    pub test_pad: Option<TestPad>,
    /// `type='PixelValues'`: the batch arrives as transformers' Trainer
    /// hands it to the model, one normalised float `pixel_values` tensor
    /// `[B, 3, H, W]` and one `labels` tensor `[B, H, W]`, moved to the
    /// device as they are (`Trainer._prepare_inputs`); nothing else is done.
    pub pixel_values: bool,
}

impl PreprocessorCfg {
    /// `model.data_preprocessor`; unset reads as all defaults.
    pub fn from_cfg(d: Option<&Dict>) -> Result<PreprocessorCfg, ModelError> {
        let empty = Dict::new();
        let d = d.unwrap_or(&empty);
        match d.get("type").and_then(Value::as_str) {
            None | Some("SegDataPreProcessor") => {}
            Some("PixelValues") if d.len() == 1 => {
                return Ok(PreprocessorCfg {
                    mean: None,
                    std: None,
                    bgr_to_rgb: false,
                    size: None,
                    pad_val: 0.0,
                    seg_pad_val: 255.0,
                    test_pad: None,
                    pixel_values: true,
                })
            }
            Some(ty) => {
                return Err(ModelError::unsupported(
                    "model.data_preprocessor",
                    "type",
                    format!("`{ty}` (supported: SegDataPreProcessor)"),
                ));
            }
        }
        let mut c = ComponentConfig::new(d, "SegDataPreProcessor", SOURCE);
        let mut floats = |k: &str| -> Option<Vec<f64>> {
            c.value(k)
                .and_then(Value::as_seq)
                .map(|s| s.iter().filter_map(Value::as_f64).collect())
        };
        let (mean, std) = (floats("mean"), floats("std"));
        let size = match c.value("size") {
            None | Some(Value::None) => None,
            Some(v) => match v.as_seq() {
                Some([h, w]) => Some((h.as_i64().unwrap_or(0), w.as_i64().unwrap_or(0))),
                _ => {
                    return Err(ModelError::config(
                        "model.data_preprocessor",
                        "size must be (h, w)",
                    ))
                }
            },
        };
        let (bgr_to_rgb, rgb_to_bgr) = (c.value("bgr_to_rgb"), c.value("rgb_to_bgr"));
        c.unimplemented("batch_augments", &Value::None)?;
        // Training pads to `size` (segtune always sets it: the crop).
        c.unimplemented("size_divisor", &Value::None)?;
        // `test_cfg` is read at inference only.
        let test_pad = match c.value("test_cfg") {
            Some(Value::Dict(t)) if !t.is_empty() => TestPad::from_test_cfg(t)?,
            _ => None,
        };
        let cfg = PreprocessorCfg {
            mean,
            std,
            bgr_to_rgb: bgr_to_rgb.or(rgb_to_bgr).is_some_and(Value::truthy),
            size,
            pad_val: c.float("pad_val", 0.0)?,
            seg_pad_val: c.float("seg_pad_val", 255.0)?,
            test_pad,
            pixel_values: false,
        };
        c.finish()?;
        Ok(cfg)
    }
}

/// How `stack_batch` pads the test path's images (`data_preprocessor.test_cfg`):
/// on the right and bottom, with `pad_val`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TestPad {
    /// `size=(h, w)`: each image to at least that size.
    Size(i64, i64),
    /// `size_divisor=d`: the batch's largest image rounded up to a multiple.
    Divisor(i64),
}

/// The config path of `TestPad`'s settings, which its errors name.
const TEST_CFG: &str = "model.data_preprocessor.test_cfg";

impl TestPad {
    /// `stack_batch(size=test_cfg.get('size'), size_divisor=test_cfg.get('size_divisor'))`;
    /// `None` when neither is set (MMSeg then only stacks). Other keys are
    /// not read by MMSeg either.
    fn from_test_cfg(t: &Dict) -> Result<Option<TestPad>, ModelError> {
        let get = |key: &str| t.get(key).filter(|v| !matches!(v, Value::None));
        match (get("size"), get("size_divisor")) {
            (Some(_), Some(_)) => Err(ModelError::config(
                TEST_CFG,
                "only one of size and size_divisor should be valid \
                 (MMSeg's stack_batch asserts it)",
            )),
            (Some(size), None) => match size.as_seq() {
                Some([h, w]) => match (h.as_i64(), w.as_i64()) {
                    (Some(h), Some(w)) if h > 0 && w > 0 => Ok(Some(TestPad::Size(h, w))),
                    _ => Err(ModelError::config(
                        TEST_CFG,
                        "size must be (h, w) of positive ints",
                    )),
                },
                _ => Err(ModelError::config(TEST_CFG, "size must be (h, w)")),
            },
            (None, Some(divisor)) => match divisor.as_i64() {
                Some(d) if d > 0 => Ok(Some(TestPad::Divisor(d))),
                _ => Err(ModelError::config(
                    TEST_CFG,
                    "size_divisor must be a positive int",
                )),
            },
            (None, None) => Ok(None),
        }
    }

    /// `(right, bottom)` padding of an `h x w` image in a batch whose
    /// largest image is `max`.
    fn padding(&self, (h, w): (i64, i64), max: (i64, i64)) -> (i64, i64) {
        let target = match *self {
            TestPad::Size(sh, sw) => (sh, sw),
            TestPad::Divisor(d) if d > 1 => ((max.0 + d - 1) / d * d, (max.1 + d - 1) / d * d),
            TestPad::Divisor(_) => max,
        };
        ((target.1 - w).max(0), (target.0 - h).max(0))
    }
}

/// The preprocessor with its `mean` and `std` buffers.
pub struct SegDataPreProcessor {
    pub cfg: PreprocessorCfg,
    mean: Option<Tensor>,
    std: Option<Tensor>,
}

impl SegDataPreProcessor {
    /// `p`: `data_preprocessor`.
    pub fn new(p: &mut ParamScope, cfg: PreprocessorCfg) -> SegDataPreProcessor {
        let buffer = |p: &mut ParamScope, name: &str, v: &Option<Vec<f64>>| {
            v.as_ref().map(|v| {
                let t = crate::models::layers::host::from_host(
                    &v.iter().map(|x| *x as f32).collect::<Vec<f32>>(),
                )
                .view([-1, 1, 1])
                .to_device(p.device());
                p.buffer(name, t)
            })
        };
        let mean = buffer(p, "mean", &cfg.mean);
        let std = buffer(p, "std", &cfg.std);
        SegDataPreProcessor { cfg, mean, std }
    }

    /// The images on `device`, BGR->RGB, as float, normalised (each step
    /// rebinds the list, so each step's images die as the next are made).
    fn normalised(&self, images: &[Tensor], device: Device) -> Vec<Tensor> {
        let mut inputs: Vec<Tensor> = images.iter().map(|x| x.to_device(device)).collect();
        if self.cfg.bgr_to_rgb && inputs[0].size()[0] == 3 {
            let order = crate::models::layers::host::from_host(&[2i64, 1, 0]).to_device(device);
            inputs = inputs.iter().map(|x| x.index(&[Some(&order)])).collect();
        }
        inputs = inputs.iter().map(|x| x.to_kind(Kind::Float)).collect();
        if let (Some(mean), Some(std)) = (&self.mean, &self.std) {
            inputs = inputs
                .iter()
                .map(|x| {
                    let centred = x - mean;
                    centred / std
                })
                .collect();
        }
        inputs
    }

    /// `forward(data, training=True)`: BGR->RGB, normalise, pad to `size`,
    /// stack. The labels are padded copies; the originals stay with the
    /// caller (mmengine's `cast_data` gives the preprocessor new data samples,
    /// so the loader's batch keeps its label tensors for the whole step).
    /// Images `[3, h, w]` -> batch `[B, 3, H, W]`; labels `[1, h, w]` ->
    /// `[1, H, W]` each.
    /// `edges`: the per-image `gt_edge_map`s (`[1, h, w]`, padded after
    /// each label as `stack_batch` does), empty when the pipeline makes none.
    pub fn forward(
        &self,
        images: &[Tensor],
        labels: &[Tensor],
        edges: &[Tensor],
        device: Device,
    ) -> (Tensor, Vec<Tensor>, Vec<Tensor>) {
        if self.cfg.pixel_values {
            return (
                images[0].to_device(device),
                vec![labels[0].to_device(device)],
                Vec::new(),
            );
        }
        let inputs = self.normalised(images, device);
        let mut padded_inputs = Vec::with_capacity(inputs.len());
        let mut padded_labels = Vec::with_capacity(labels.len());
        let mut padded_edges = Vec::with_capacity(edges.len());
        for (i, (x, label)) in inputs.iter().zip(labels).enumerate() {
            let (h, w) = (x.size()[1], x.size()[2]);
            let pad = match self.cfg.size {
                Some((sh, sw)) => [0, (sw - w).max(0), 0, (sh - h).max(0)],
                None => [0, 0, 0, 0],
            };
            padded_inputs.push(x.pad(pad, "constant", self.cfg.pad_val));
            for (map, padded) in [
                (Some(label), &mut padded_labels),
                (edges.get(i), &mut padded_edges),
            ] {
                if let Some(map) = map {
                    let map = map.to_device(device);
                    padded.push(map.pad(pad, "constant", self.cfg.seg_pad_val));
                }
            }
        }
        drop(inputs);
        (
            Tensor::stack(&padded_inputs, 0),
            padded_labels,
            padded_edges,
        )
    }

    /// `forward(data, training=False)`: BGR->RGB, normalise, and either
    /// stack (every image the same size, as MMSeg asserts) or, with a
    /// padding `test_cfg`, `stack_batch`: each image padded on the right
    /// and bottom (`F.pad`, a copy even when nothing is added). Returns the
    /// batch and each image's `(right, bottom)` padding (`img_padding_size`).
    pub fn forward_test(
        &self,
        images: &[Tensor],
        device: Device,
    ) -> Result<(Tensor, Vec<(i64, i64)>), ModelError> {
        if self.cfg.pixel_values {
            return Err(ModelError::unsupported(
                super::hf_segformer::TYPE,
                "",
                "inference of a Hugging Face model is not built yet",
            ));
        }
        let inputs = self.normalised(images, device);
        let Some(test_pad) = self.cfg.test_pad else {
            let none = vec![(0, 0); inputs.len()];
            return Ok((Tensor::stack(&inputs, 0), none));
        };
        let sizes: Vec<(i64, i64)> = inputs.iter().map(|x| (x.size()[1], x.size()[2])).collect();
        let max = sizes
            .iter()
            .fold((0, 0), |(mh, mw), &(h, w)| (mh.max(h), mw.max(w)));
        let mut padded = Vec::with_capacity(inputs.len());
        let mut paddings = Vec::with_capacity(inputs.len());
        for (x, &size) in inputs.iter().zip(&sizes) {
            let (right, bottom) = test_pad.padding(size, max);
            padded.push(x.pad([0, right, 0, bottom], "constant", self.cfg.pad_val));
            paddings.push((right, bottom));
        }
        // stack_batch stacks while the caller still holds the unpadded list.
        let batch = Tensor::stack(&padded, 0);
        drop(padded);
        drop(inputs);
        Ok((batch, paddings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::component_config::test_support::dict;
    use serde_json::json;

    fn test_pad(test_cfg: serde_json::Value) -> Result<Option<TestPad>, ModelError> {
        TestPad::from_test_cfg(&dict(test_cfg))
    }

    #[test]
    fn test_padding_follows_stack_batch() {
        // size_divisor: the batch's largest image rounded up, per axis.
        let by_32 = test_pad(json!({"size_divisor": 32})).unwrap().unwrap();
        assert_eq!(by_32.padding((250, 250), (250, 250)), (6, 6));
        assert_eq!(by_32.padding((256, 200), (256, 300)), (120, 0));
        // size: each image to at least that size, never cropped.
        let to_512 = test_pad(json!({"size": [512, 1024]})).unwrap().unwrap();
        assert_eq!(to_512.padding((500, 1100), (500, 1100)), (0, 12));
        // A divisor of 1 pads to the batch's largest image only.
        let by_1 = test_pad(json!({"size_divisor": 1})).unwrap().unwrap();
        assert_eq!(by_1.padding((10, 20), (12, 20)), (0, 2));
        assert_eq!(test_pad(json!({"size": null})).unwrap(), None);
        let both = test_pad(json!({"size": [32, 32], "size_divisor": 32})).unwrap_err();
        assert!(both
            .to_string()
            .contains("only one of size and size_divisor"));
    }
}
