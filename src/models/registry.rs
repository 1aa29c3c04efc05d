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
        .ok_or_else(|| unknown_type(role, name, &names(table)))
}

/// Declares a registry table and, next to it, the list of its type names
/// alone. Checks ([`check_supported`], [`check_type`]) read only the names:
/// code that checks but never builds (the `segtune` binary) then does not
/// link the constructors, and with them libtorch.
macro_rules! registry_table {
    ($(#[$doc:meta])* $table:ident, $names:ident: $ctor:ty = [$(($name:literal, $build:path)),+ $(,)?]) => {
        $(#[$doc])*
        pub const $table: &[(&str, $ctor)] = &[$(($name, $build)),+];
        /// The type names of the table of the same role, in its order.
        pub const $names: &[&str] = &[$($name),+];
    };
}
pub(crate) use registry_table;

/// `Ok` if `name` is one of `names` (a [`registry_table`]'s names), else
/// `UnknownType` listing them.
pub fn check_type(
    names: &[&'static str],
    role: &'static str,
    name: &str,
) -> Result<(), ModelError> {
    if names.contains(&name) {
        Ok(())
    } else {
        Err(unknown_type(role, name, names))
    }
}

/// `UnknownType` of `name` in `role`, listing the `supported` names.
fn unknown_type(role: &str, name: &str, supported: &[&str]) -> ModelError {
    ModelError::UnknownType {
        role: role.to_string(),
        name: name.to_string(),
        supported: supported.iter().map(|s| s.to_string()).collect(),
    }
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
        .ok_or_else(|| ModelError::config("model", "the config has no `model` dict"))?;
    let check_components = lookup(SEGMENTORS, "segmentor", type_of(model, "model")?)?;
    check_components(model)
}
