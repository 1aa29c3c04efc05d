//! Looking MMSeg `type` names up in the per-role tables
//! ([`SEGMENTORS`](super::SEGMENTORS), [`BACKBONES`](super::BACKBONES),
//! [`NECKS`](super::NECKS), [`DECODE_HEADS`](super::DECODE_HEADS)), and
//! [`check_supported`], which says whether a config's model can be built.
//! The lists of supported types in errors come from the same tables.

use super::component_config::type_of;
use super::segmentors::SEGMENTORS;
use super::ModelError;
use crate::config::{Dict, Value};

/// The constructor (or check) registered for `name` in `table`, or
/// `UnknownType` listing the table's names.
pub fn lookup<T: Copy>(
    table: &[(&'static str, T)],
    role: &'static str,
    name: &str,
) -> Result<T, ModelError> {
    table
        .iter()
        .find(|(registered, _)| *registered == name)
        .map(|(_, entry)| *entry)
        .ok_or_else(|| ModelError::UnknownType {
            role,
            name: name.to_string(),
            supported: names(table),
        })
}

/// The type names of a table, in table order.
pub fn names<T>(table: &[(&'static str, T)]) -> Vec<&'static str> {
    table.iter().map(|(name, _)| *name).collect()
}

/// Whether segtune can build the model of a resolved config, and if not why:
/// the segmentor's type, then each component's, in the order MMSeg builds
/// them.
pub fn check_supported(cfg: &Dict) -> Result<(), ModelError> {
    let model = cfg
        .get("model")
        .and_then(Value::as_dict)
        .ok_or_else(|| ModelError::Config("the config has no `model` dict".into()))?;
    let check_components = lookup(SEGMENTORS, "segmentor", type_of(model, "model")?)?;
    check_components(model)
}
