//! `CascadeEncoderDecoder` (`mmseg/models/segmentors/cascade_encoder_decoder.py`):
//! an `EncoderDecoder` whose `decode_head` is a list of `num_stages` heads,
//! each after the first refining the previous one's logits (OCRNet: an
//! FCNHead, then an OCRHead). Built by [`EncoderDecoder`](super::encoder_decoder::EncoderDecoder);
//! this file reads its config and runs its training forward.

use super::encoder_decoder::{with_prefix, DecodeHeads, EncoderDecoderCfg};
use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::decode_heads::DecodeHead;
use crate::models::scope;
use crate::models::ModelError;
use tch::Tensor;

const SOURCE: &str = "mmseg/models/segmentors/cascade_encoder_decoder.py";

/// Reads `cfg.model` of a `CascadeEncoderDecoder`: `num_stages` and a list
/// of that many decode heads (`_init_decode_head`'s assertions). The
/// `SEGMENTORS` row's reader.
pub fn read_cfg(model: &Dict) -> Result<EncoderDecoderCfg<'_>, ModelError> {
    let mut c = ComponentConfig::new(model, "CascadeEncoderDecoder", SOURCE);
    let num_stages = match c.value("num_stages") {
        Some(Value::Int(n)) if *n >= 1 => *n as usize,
        Some(other) => {
            return Err(c.config_error(format!("num_stages must be a positive int, not {other:?}")))
        }
        None => return Err(c.config_error("lacks `num_stages` (a required argument)")),
    };
    let stages: Vec<&Dict> = match c.value("decode_head") {
        Some(Value::List(items)) | Some(Value::Tuple(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_dict().ok_or_else(|| {
                    ModelError::config(format!("model.decode_head[{i}]"), "must be a dict")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(c.config_error("decode_head must be a list of num_stages dicts")),
        None => return Err(ModelError::config("model", "lacks `decode_head`")),
    };
    if stages.len() != num_stages {
        return Err(c.config_error(format!(
            "decode_head has {} heads but num_stages is {num_stages}",
            stages.len()
        )));
    }
    EncoderDecoderCfg::read_components(c, DecodeHeads::Cascade(stages))
}

/// `CascadeEncoderDecoder._decode_head_forward_train`: the first stage's
/// loss (`decode_0.*`); then for each later stage, the previous stage's
/// logits computed again by a fresh forward (MMSeg's "forward test again",
/// in training mode, so the first stage's activations exist twice) and that
/// stage's loss on them (`decode_<i>.*`).
pub fn decode_head_forward_train(
    stages: &[(String, Box<dyn DecodeHead>)],
    features: &[Tensor],
    labels: &[Tensor],
) -> Vec<(String, Tensor)> {
    let (first_prefix, first) = &stages[0];
    let mut items = {
        let _part = scope::enter("decode_head.0");
        with_prefix(first_prefix, first.loss(features, None, labels))
    };
    let mut prev_outputs: Option<Tensor> = None;
    for i in 1..stages.len() {
        let (_, previous) = &stages[i - 1];
        prev_outputs = {
            let _part = scope::enter(&format!("decode_head.{}", i - 1));
            Some(previous.forward(features, prev_outputs.as_ref(), true))
        };
        let _part = scope::enter(&format!("decode_head.{i}"));
        let (prefix, head) = &stages[i];
        items.extend(with_prefix(
            prefix,
            head.loss(features, prev_outputs.as_ref(), labels),
        ));
    }
    items
}

#[cfg(test)]
#[path = "cascade_encoder_decoder_tests.rs"]
mod tests;
