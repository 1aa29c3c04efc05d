//! The losses decode heads train with (`mmseg/models/losses/`), and the
//! pixel accuracy every BaseDecodeHead logs. A head's `loss_decode` is one
//! loss dict or a list of them; segtune implements `CrossEntropyLoss`.

pub mod accuracy;
pub mod cross_entropy_loss;
pub mod ohem_pixel_sampler;

pub use accuracy::accuracy;
pub use cross_entropy_loss::CrossEntropyCfg;
pub use ohem_pixel_sampler::OhemPixelSampler;

use super::ModelError;
use crate::config::{Dict, Value};

/// A head's `loss_decode`: one dict or a list of dicts, each a loss segtune
/// implements; unset is MMSeg's default `CrossEntropyLoss`.
pub fn loss_decode_from_cfg(v: Option<&Value>) -> Result<Vec<CrossEntropyCfg>, ModelError> {
    let items: Vec<&Dict> = match v {
        None => return Ok(vec![CrossEntropyCfg::default()]),
        Some(Value::Dict(d)) => vec![d],
        Some(Value::List(l)) | Some(Value::Tuple(l)) => {
            l.iter().filter_map(Value::as_dict).collect()
        }
        Some(other) => {
            return Err(ModelError::Config(format!(
                "loss_decode must be a dict or a list of dicts, not {}",
                other.type_name()
            )))
        }
    };
    items
        .into_iter()
        .map(|d| {
            let ty = d.get("type").and_then(Value::as_str).unwrap_or("");
            if ty != "CrossEntropyLoss" {
                return Err(ModelError::Unsupported(format!(
                    "loss type `{ty}` (supported: CrossEntropyLoss)"
                )));
            }
            CrossEntropyCfg::from_cfg(d)
        })
        .collect()
}
