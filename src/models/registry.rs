//! Looking MMSeg `type` names up in the per-role tables
//! ([`SEGMENTORS`](super::SEGMENTORS), [`BACKBONES`](super::BACKBONES),
//! [`NECKS`](super::NECKS), [`DECODE_HEADS`](super::DECODE_HEADS)), and
//! [`check_supported`], which says whether a config's model can be built.
//! The lists of supported types in errors come from the same tables, and so
//! do the [`Facts`] callers look up about a type by its name ([`facts_of`]).

use super::component_config::type_of;
use super::segmentors::encoder_decoder::check_parts;
use super::segmentors::SEGMENTORS;
use super::ModelError;
use crate::config::{Dict, Value};

/// The constructor (or reader, or facts) registered for `name` in `table`,
/// or `UnknownType` listing the table's names.
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

/// What callers look up about a registered type by its name, without
/// building it: each row of a [`registry_table`] carries its facts (none
/// unless the row says so). One struct serves every role; a fact that does
/// not concern a role stays at its [`Facts::NONE`] value there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// A backbone that honours `with_cp` (gradient checkpointing through
    /// `layers::checkpoint`), so the search may try turning it on.
    pub takes_with_cp: bool,
    /// A head whose MMSeg `loss` and `predict` take the segmentor's
    /// `train_cfg` and `test_cfg`: it is built with them as its own keys.
    pub takes_run_cfgs: bool,
    /// A head that predicts by PointRend's subdivision, so its inference
    /// needs `model.test_cfg.subdivision_steps` and its companions.
    pub subdivision_inference: bool,
    /// A mask-classification head (Mask2Former): its targets are one mask
    /// per class present in an image, its loss samples
    /// `train_cfg.num_points` points of each mask, and its `predict`
    /// upsamples the masks to the padded image.
    pub mask_classification: bool,
    /// A head whose loss reads the edge maps (`gt_edge_map`) the training
    /// pipeline's `GenerateEdge` makes from the labels (PIDHead): the
    /// segmentor requires that step and the trial's batch carries them.
    pub takes_edge_maps: bool,
    /// A segmentor whose backbone's parameters are named under this
    /// attribute rather than `backbone` (transformers' `segformer`).
    pub backbone_prefix: Option<&'static str>,
}

impl Facts {
    /// A row without facts.
    pub const NONE: Facts = Facts {
        takes_with_cp: false,
        takes_run_cfgs: false,
        subdivision_inference: false,
        mask_classification: false,
        takes_edge_maps: false,
        backbone_prefix: None,
    };
}

/// The facts registered for `name` in a facts table (a [`registry_table`]'s
/// second list); [`Facts::NONE`] for a type the table lacks, which nothing
/// treats apart (it fails the check).
pub fn facts_of(table: &[(&'static str, Facts)], name: &str) -> Facts {
    table
        .iter()
        .find(|(registered, _)| *registered == name)
        .map_or(Facts::NONE, |(_, facts)| *facts)
}

/// Declares a registry table of constructors and, next to it, the list of
/// its type names with their [`Facts`]. A row is `(name, constructor)` or
/// `(name, constructor, facts)`. Checks ([`check_supported`],
/// [`check_type`]) and fact look-ups read only the second list: code that
/// checks but never builds (the `segtune` binary) then does not link the
/// constructors, and with them libtorch.
macro_rules! registry_table {
    ($(#[$doc:meta])* $table:ident, $facts:ident: $ctor:ty = [$(($name:expr, $build:expr $(, $row_facts:expr)?)),+ $(,)?]) => {
        $(#[$doc])*
        pub const $table: &[(&str, $ctor)] = &[$(($name, $build)),+];
        /// The type names of the table of the same role, in its order, with
        /// their facts.
        pub const $facts: &[(&str, $crate::models::registry::Facts)] =
            &[$(($name, $crate::models::registry::facts_or_none!($($row_facts)?))),+];
    };
}
pub(crate) use registry_table;

/// A row's facts, [`Facts::NONE`] where the row gives none.
macro_rules! facts_or_none {
    () => {
        $crate::models::registry::Facts::NONE
    };
    ($facts:expr) => {
        $facts
    };
}
pub(crate) use facts_or_none;

/// `Ok` if `name` is registered in `table` (a [`registry_table`]'s facts),
/// else `UnknownType` listing its names.
pub fn check_type(
    table: &[(&'static str, Facts)],
    role: &'static str,
    name: &str,
) -> Result<(), ModelError> {
    lookup(table, role, name).map(|_| ())
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
    let read_parts = lookup(SEGMENTORS, "segmentor", type_of(model, "model")?)?;
    check_parts(&read_parts(model)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::backbones::{BACKBONES, BACKBONE_FACTS};
    use crate::models::decode_heads::{DECODE_HEADS, DECODE_HEAD_FACTS};
    use crate::models::necks::{NECKS, NECK_FACTS};
    use crate::models::segmentors::SEGMENTOR_FACTS;

    #[test]
    fn the_facts_lists_name_the_constructor_tables_in_order() {
        assert_eq!(names(BACKBONE_FACTS), names(BACKBONES));
        assert_eq!(names(NECK_FACTS), names(NECKS));
        assert_eq!(names(DECODE_HEAD_FACTS), names(DECODE_HEADS));
        assert_eq!(names(SEGMENTOR_FACTS), names(SEGMENTORS));
    }

    #[test]
    fn a_row_without_facts_and_an_unknown_type_have_none() {
        assert_eq!(facts_of(NECK_FACTS, "FPN"), Facts::NONE);
        assert_eq!(facts_of(NECK_FACTS, "NotARegisteredNeck"), Facts::NONE);
        assert!(facts_of(BACKBONE_FACTS, "ResNetV1c").takes_with_cp);
        let point_head = facts_of(DECODE_HEAD_FACTS, "PointHead");
        assert!(point_head.takes_run_cfgs && point_head.subdivision_inference);
    }

    #[test]
    fn each_fact_sits_only_in_the_role_it_concerns() {
        let all = |table: &[(&'static str, Facts)]| {
            table.iter().map(|(_, facts)| *facts).collect::<Vec<_>>()
        };
        for facts in all(BACKBONE_FACTS) {
            assert_eq!(
                Facts {
                    takes_with_cp: false,
                    ..facts
                },
                Facts::NONE
            );
        }
        assert!(all(NECK_FACTS).iter().all(|facts| *facts == Facts::NONE));
        for facts in all(DECODE_HEAD_FACTS) {
            let head_only = Facts {
                takes_run_cfgs: false,
                subdivision_inference: false,
                mask_classification: false,
                takes_edge_maps: false,
                ..facts
            };
            assert_eq!(head_only, Facts::NONE);
        }
        for facts in all(SEGMENTOR_FACTS) {
            assert_eq!(
                Facts {
                    backbone_prefix: None,
                    ..facts
                },
                Facts::NONE
            );
        }
    }
}
