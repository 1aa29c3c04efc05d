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
    /// Whether `test_cfg` asks the test path to pad (`size`, `size_divisor`).
    pub test_pads: bool,
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
                    test_pads: false,
                    pixel_values: true,
                })
            }
            Some(ty) => {
                return Err(ModelError::Unsupported(format!(
                    "data_preprocessor type `{ty}` (supported: SegDataPreProcessor)"
                )));
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
                    return Err(ModelError::Config(
                        "data_preprocessor.size must be (h, w)".into(),
                    ))
                }
            },
        };
        let (bgr_to_rgb, rgb_to_bgr) = (c.value("bgr_to_rgb"), c.value("rgb_to_bgr"));
        c.unimplemented("batch_augments", &Value::None)?;
        // Training pads to `size` (segtune always sets it: the crop).
        c.unimplemented("size_divisor", &Value::None)?;
        // `test_cfg` is read at inference only.
        let test_pads = c
            .value("test_cfg")
            .and_then(Value::as_dict)
            .is_some_and(|t| !t.is_empty());
        c.inert(&["test_cfg"]);
        let cfg = PreprocessorCfg {
            mean,
            std,
            bgr_to_rgb: bgr_to_rgb.or(rgb_to_bgr).is_some_and(Value::truthy),
            size,
            pad_val: c.float("pad_val", 0.0)?,
            seg_pad_val: c.float("seg_pad_val", 255.0)?,
            test_pads,
            pixel_values: false,
        };
        c.finish()?;
        Ok(cfg)
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
    pub fn forward(
        &self,
        images: &[Tensor],
        labels: &[Tensor],
        device: Device,
    ) -> (Tensor, Vec<Tensor>) {
        if self.cfg.pixel_values {
            return (
                images[0].to_device(device),
                vec![labels[0].to_device(device)],
            );
        }
        let inputs = self.normalised(images, device);
        let mut padded_inputs = Vec::with_capacity(inputs.len());
        let mut padded_labels = Vec::with_capacity(labels.len());
        for (x, label) in inputs.iter().zip(labels) {
            let (h, w) = (x.size()[1], x.size()[2]);
            let pad = match self.cfg.size {
                Some((sh, sw)) => [0, (sw - w).max(0), 0, (sh - h).max(0)],
                None => [0, 0, 0, 0],
            };
            padded_inputs.push(x.pad(pad, "constant", self.cfg.pad_val));
            let label = label.to_device(device);
            let label = &label;
            padded_labels.push(label.pad(pad, "constant", self.cfg.seg_pad_val));
        }
        drop(inputs);
        (Tensor::stack(&padded_inputs, 0), padded_labels)
    }

    /// `forward(data, training=False)` without a `test_cfg`: BGR->RGB,
    /// normalise, stack (every image the same size, as MMSeg asserts).
    pub fn forward_test(&self, images: &[Tensor], device: Device) -> Result<Tensor, ModelError> {
        if self.cfg.pixel_values {
            return Err(ModelError::Unsupported(
                "inference of a Hugging Face model is not built yet".into(),
            ));
        }
        if self.cfg.test_pads {
            return Err(ModelError::Unsupported(
                "data_preprocessor.test_cfg (padding at inference) is not built yet".into(),
            ));
        }
        let inputs = self.normalised(images, device);
        Ok(Tensor::stack(&inputs, 0))
    }
}
