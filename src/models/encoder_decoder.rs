//! `EncoderDecoder` (mmseg/models/segmentors/encoder_decoder.py) with its
//! `SegDataPreProcessor` (mmseg/models/data_preprocessor.py): the segmentor
//! that owns the backbone and the decode head, and the training forward
//! `data_preprocessor(data) -> backbone -> decode_head.loss`.

use super::mit::{MitConfig, MixVisionTransformer};
use super::params::{ParamScope, ParamStore};
use super::segformer_head::SegformerHead;
use super::{cfg_f64, check_supported, type_of, ModelError};
use crate::config::{Dict, Value};
use tch::{Device, Kind, Tensor};

/// `SegDataPreProcessor` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessorCfg {
    pub mean: Option<Vec<f64>>,
    pub std: Option<Vec<f64>>,
    pub bgr_to_rgb: bool,
    pub size: Option<(i64, i64)>,
    pub pad_val: f64,
    pub seg_pad_val: f64,
}

impl PreprocessorCfg {
    pub fn from_cfg(d: Option<&Dict>) -> Result<PreprocessorCfg, ModelError> {
        let empty = Dict::new();
        let d = d.unwrap_or(&empty);
        let floats = |k: &str| -> Option<Vec<f64>> {
            d.get(k)
                .and_then(Value::as_seq)
                .map(|s| s.iter().filter_map(Value::as_f64).collect())
        };
        let size = match d.get("size") {
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
        if d.get("batch_augments")
            .is_some_and(|v| !matches!(v, Value::None))
        {
            return Err(ModelError::Unsupported(
                "data_preprocessor.batch_augments".into(),
            ));
        }
        Ok(PreprocessorCfg {
            mean: floats("mean"),
            std: floats("std"),
            bgr_to_rgb: d
                .get("bgr_to_rgb")
                .or(d.get("rgb_to_bgr"))
                .is_some_and(Value::truthy),
            size,
            pad_val: cfg_f64(d, "pad_val", 0.0)?,
            seg_pad_val: cfg_f64(d, "seg_pad_val", 255.0)?,
        })
    }
}

struct Preprocessor {
    cfg: PreprocessorCfg,
    mean: Option<Tensor>,
    std: Option<Tensor>,
}

impl Preprocessor {
    fn new(p: &mut ParamScope, cfg: PreprocessorCfg) -> Preprocessor {
        let buffer = |p: &mut ParamScope, name: &str, v: &Option<Vec<f64>>| {
            v.as_ref().map(|v| {
                let t = Tensor::from_slice(&v.iter().map(|x| *x as f32).collect::<Vec<f32>>())
                    .view([-1, 1, 1])
                    .to_device(p.device());
                p.buffer(name, t)
            })
        };
        let mean = buffer(p, "mean", &cfg.mean);
        let std = buffer(p, "std", &cfg.std);
        Preprocessor { cfg, mean, std }
    }

    /// `forward(data, training=True)`: BGR->RGB, normalise, pad to `size`,
    /// stack. The labels are padded copies; the originals stay with the
    /// caller (mmengine's `cast_data` gives the preprocessor new data samples,
    /// so the loader's batch keeps its label tensors for the whole step).
    fn forward(
        &self,
        images: &[Tensor],
        labels: &[Tensor],
        device: Device,
    ) -> (Tensor, Vec<Tensor>) {
        let mut inputs: Vec<Tensor> = images.iter().map(|x| x.to_device(device)).collect();
        if self.cfg.bgr_to_rgb && inputs[0].size()[0] == 3 {
            let order = Tensor::from_slice(&[2i64, 1, 0]).to_device(device);
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
}

enum Backbone {
    Mit(MixVisionTransformer),
}

enum DecodeHead {
    Segformer(SegformerHead),
}

/// The losses of one training forward, as `parse_losses` sums them.
pub struct StepLosses {
    /// The total loss (sum of every `loss*` item).
    pub loss: Tensor,
    /// `(name, value)` of every logged item (`decode.loss_ce`, `decode.acc_seg`).
    pub items: Vec<(String, Tensor)>,
}

/// The segmentor, its parameters and buffers.
pub struct EncoderDecoder {
    pub params: ParamStore,
    preprocessor: Preprocessor,
    backbone: Backbone,
    decode_head: DecodeHead,
    device: Device,
    pub num_classes: i64,
    pub ignore_index: i64,
}

impl EncoderDecoder {
    /// Builds `cfg.model` (a resolved config) on `device`.
    pub fn build(cfg: &Dict, device: Device) -> Result<EncoderDecoder, ModelError> {
        check_supported(cfg)?;
        let model = cfg.get("model").and_then(Value::as_dict).expect("checked");
        let backbone_cfg = model
            .get("backbone")
            .and_then(Value::as_dict)
            .expect("checked");
        let head_cfg = model
            .get("decode_head")
            .and_then(Value::as_dict)
            .expect("checked");
        let pre_cfg =
            PreprocessorCfg::from_cfg(model.get("data_preprocessor").and_then(Value::as_dict))?;
        let mut params = ParamStore::new(device);
        let preprocessor = Preprocessor::new(&mut params.scope("data_preprocessor"), pre_cfg);
        let backbone = match type_of(backbone_cfg, "backbone")? {
            "MixVisionTransformer" => {
                let c = MitConfig::from_cfg(backbone_cfg)?;
                Backbone::Mit(MixVisionTransformer::new(&mut params.scope("backbone"), &c))
            }
            other => unreachable!("check_supported accepted backbone {other}"),
        };
        let decode_head = match type_of(head_cfg, "decode_head")? {
            "SegformerHead" => DecodeHead::Segformer(SegformerHead::new(
                &mut params.scope("decode_head"),
                head_cfg,
            )?),
            other => unreachable!("check_supported accepted decode head {other}"),
        };
        let (num_classes, ignore_index) = match &decode_head {
            DecodeHead::Segformer(h) => (h.num_classes(), h.ignore_index()),
        };
        Ok(EncoderDecoder {
            params,
            preprocessor,
            backbone,
            decode_head,
            device,
            num_classes,
            ignore_index,
        })
    }

    /// The crop the data preprocessor pads to, if set.
    pub fn preprocessor_size(&self) -> Option<(i64, i64)> {
        self.preprocessor.cfg.size
    }

    /// Overrides the data preprocessor's `size` (what a crop change does).
    pub fn set_preprocessor_size(&mut self, size: (i64, i64)) {
        self.preprocessor.cfg.size = Some(size);
    }

    /// Data preprocessing: returns the batch tensor and the padded labels.
    pub fn preprocess(&self, images: &[Tensor], labels: &[Tensor]) -> (Tensor, Vec<Tensor>) {
        self.preprocessor.forward(images, labels, self.device)
    }

    /// `EncoderDecoder.loss`: the head's loss items (`decode.loss_ce`,
    /// `decode.acc_seg`), before `parse_losses`.
    pub fn loss(&self, inputs: &Tensor, labels: &[Tensor]) -> Vec<(String, Tensor)> {
        let features = match &self.backbone {
            Backbone::Mit(b) => b.forward(inputs, true),
        };
        let head = match &self.decode_head {
            DecodeHead::Segformer(h) => h.loss(&features, labels, true),
        };
        drop(features);
        let mut items: Vec<(String, Tensor)> = head
            .losses
            .into_iter()
            .map(|(n, v)| (format!("decode.{n}"), v))
            .collect();
        items.push(("decode.acc_seg".into(), head.accuracy));
        items
    }
}

/// mmengine's `BaseModel.parse_losses`: the mean of every item, and their
/// sum over the items whose name contains `loss`.
pub fn parse_losses(items: Vec<(String, Tensor)>) -> StepLosses {
    let items: Vec<(String, Tensor)> = items
        .into_iter()
        .map(|(n, v)| (n, v.mean(None::<Kind>)))
        .collect();
    let mut loss: Option<Tensor> = None;
    for (name, v) in &items {
        if name.contains("loss") {
            loss = Some(match loss {
                None => v + 0.0,
                Some(acc) => acc + v,
            });
        }
    }
    let loss = loss.unwrap_or_else(|| Tensor::zeros([], (Kind::Float, Device::Cpu)));
    StepLosses { loss, items }
}
