//! Reading one component's resolved config dict (`model.backbone`,
//! `model.decode_head`, a loss, ...) the way its MMSeg constructor takes its
//! keyword arguments: every key segtune implements is read with MMSeg's
//! default, keys that cannot change memory are accepted by name, a key that
//! segtune does not implement is accepted only at MMSeg's default value, and
//! [`ComponentConfig::finish`] refuses any other key that is set, naming it
//! and the MMSeg file of the component. So a config is never trialled with a
//! setting silently dropped.

use super::ModelError;
use crate::config::{Dict, Value};
use std::fmt::Display;

/// Keys that are counts or sizes wherever a component reads them (classes,
/// channels, heads, kernels, strides, patches, windows, queries): zero or a
/// negative value cannot build a layer, so it is refused by name before
/// libtorch would fail on it. Keys where 0 or -1 mean something
/// (`num_convs`, `frozen_stages`, `in_index`, `end_level`, `padding`) are
/// not here.
pub const SIZE_KEYS: &[&str] = &[
    "num_classes",
    "channels",
    "in_channels",
    "out_channels",
    "embed_dims",
    "num_heads",
    "num_layers",
    "num_stages",
    "kernel_size",
    "base_channels",
    "stem_channels",
    "feedforward_channels",
    "feat_channels",
    "num_queries",
    "patch_size",
    "window_size",
    "c1_in_channels",
    "c1_channels",
    "ocr_channels",
    "pam_channels",
    "psp_out_channels",
    "project_channels",
    "num_channels",
    "num_codes",
    "num_bases",
    "num_outs",
    "num_feats",
    "num_levels",
    "pool_size",
    "pool_scales",
    "radix",
    "reduction",
    "reduction_factor",
    "depths",
    "strides",
    "dilations",
];

/// A component's config dict being read; see the module doc.
pub struct ComponentConfig<'a> {
    dict: &'a Dict,
    /// MMSeg's class name (`MixVisionTransformer`).
    component: &'static str,
    /// The MMSeg source file of the class (`mmseg/models/backbones/mit.py`).
    source: &'static str,
    read: Vec<&'a str>,
}

impl<'a> ComponentConfig<'a> {
    /// Starts reading `dict`; its `type` was used to pick the component.
    pub fn new(dict: &'a Dict, component: &'static str, source: &'static str) -> Self {
        let mut config = ComponentConfig {
            dict,
            component,
            source,
            read: Vec::new(),
        };
        config.value("type");
        config
    }

    /// The value of `key` if the dict sets it; marks it as handled.
    pub fn value(&mut self, key: &str) -> Option<&'a Value> {
        let (name, value) = self.dict.get_key_value(key)?;
        if !self.read.contains(&name.as_str()) {
            self.read.push(name.as_str());
        }
        Some(value)
    }

    /// An error naming `key` unless the dict sets it (a required argument
    /// of the MMSeg constructor; the value is read afterwards).
    pub fn require(&self, key: &str) -> Result<(), ModelError> {
        if self.has(key) {
            Ok(())
        } else {
            Err(self.config_error(format!("lacks `{key}`")))
        }
    }

    /// Whether the dict sets `key` (without marking it as handled).
    pub fn has(&self, key: &str) -> bool {
        self.dict.contains_key(key)
    }

    /// An int setting (a bool counts, as in Python).
    pub fn int(&mut self, key: &str, default: i64) -> Result<i64, ModelError> {
        match self.value(key) {
            None => Ok(default),
            Some(v @ (Value::Int(_) | Value::Bool(_))) => {
                let i = v.as_i64().unwrap_or(default);
                self.check_size(key, i)?;
                Ok(i)
            }
            Some(other) => {
                Err(self.config_error(format!("`{key}` must be an int, not {}", other.type_name())))
            }
        }
    }

    /// Refuses a count or a size that is not positive ([`SIZE_KEYS`]): MMSeg
    /// would fail inside PyTorch on it, segtune says which key.
    fn check_size(&self, key: &str, value: i64) -> Result<(), ModelError> {
        if value < 1 && SIZE_KEYS.contains(&key) {
            return Err(self.config_error(format!(
                "`{key}` = {value}: a count or size must be at least 1"
            )));
        }
        Ok(())
    }

    /// A number setting.
    pub fn float(&mut self, key: &str, default: f64) -> Result<f64, ModelError> {
        match self.value(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| {
                self.config_error(format!("`{key}` must be a number, not {}", v.type_name()))
            }),
        }
    }

    /// A bool setting, by Python truthiness.
    pub fn flag(&mut self, key: &str, default: bool) -> bool {
        self.value(key).map(Value::truthy).unwrap_or(default)
    }

    /// A list of ints; a single int is a one-item list.
    pub fn ints(&mut self, key: &str, default: &[i64]) -> Result<Vec<i64>, ModelError> {
        match self.value(key) {
            None => Ok(default.to_vec()),
            Some(Value::Int(i)) => {
                self.check_size(key, *i)?;
                Ok(vec![*i])
            }
            Some(v) => {
                let ints = v
                    .as_seq()
                    .and_then(|s| s.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                    .ok_or_else(|| self.config_error(format!("`{key}` must be a list of ints")))?;
                for &i in &ints {
                    self.check_size(key, i)?;
                }
                Ok(ints)
            }
        }
    }

    /// A list of numbers, or `None` when unset or Python's `None`.
    pub fn floats(&mut self, key: &str) -> Result<Option<Vec<f64>>, ModelError> {
        match self.value(key) {
            None | Some(Value::None) => Ok(None),
            Some(v) => v
                .as_seq()
                .and_then(|s| s.iter().map(Value::as_f64).collect::<Option<Vec<_>>>())
                .map(Some)
                .ok_or_else(|| self.config_error(format!("`{key}` must be a list of numbers"))),
        }
    }

    /// A nested config dict (`encoder`, `loss_cls`), or `None` when unset or
    /// Python's `None`.
    pub fn dict(&mut self, key: &str) -> Result<Option<&'a Dict>, ModelError> {
        match self.value(key) {
            None | Some(Value::None) => Ok(None),
            Some(Value::Dict(d)) => Ok(Some(d)),
            Some(other) => {
                Err(self.config_error(format!("`{key}` must be a dict, not {}", other.type_name())))
            }
        }
    }

    /// A string setting; `None` (Python's) reads as absent.
    pub fn string(&mut self, key: &str) -> Result<Option<&'a str>, ModelError> {
        match self.value(key) {
            None | Some(Value::None) => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s)),
            Some(other) => Err(self.config_error(format!(
                "`{key}` must be a string, not {}",
                other.type_name()
            ))),
        }
    }

    /// A list or tuple of strings.
    pub fn strings(&mut self, key: &str, default: &[&str]) -> Result<Vec<String>, ModelError> {
        match self.value(key) {
            None => Ok(default.iter().map(|s| s.to_string()).collect()),
            Some(v) => v
                .as_seq()
                .and_then(|s| {
                    s.iter()
                        .map(|x| x.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| self.config_error(format!("`{key}` must be a list of strings"))),
        }
    }

    /// A BN `norm_cfg` (see [`NormCfg`]); `None` when unset or `None`.
    pub fn batch_norm(&mut self, key: &str) -> Result<Option<NormCfg>, ModelError> {
        NormCfg::from_cfg(self.value(key)).map_err(|e| self.setting_error(key, e))
    }

    /// A BN `norm_cfg` whose constructor default is `dict(type='BN')`: that
    /// when unset, no norm when `None`.
    pub fn batch_norm_or_bn(&mut self, key: &str) -> Result<Option<NormCfg>, ModelError> {
        match self.value(key) {
            None => Ok(Some(NormCfg::BN_DEFAULT)),
            v => NormCfg::from_cfg(v),
        }
        .map_err(|e| self.setting_error(key, e))
    }

    /// An activation `act_cfg` that must be MMSeg's default `dict(type=expected)`
    /// (mmcv's `inplace` flag aside): other activations are not implemented.
    pub fn default_activation(&mut self, key: &str, expected: &str) -> Result<(), ModelError> {
        let Some(value) = self.value(key) else {
            return Ok(());
        };
        let ok = value.as_dict().is_some_and(|d| {
            d.get("type").and_then(Value::as_str) == Some(expected)
                && d.keys().all(|k| k == "type" || k == "inplace")
        });
        if ok {
            Ok(())
        } else {
            Err(self.unsupported(key, format!("only dict(type='{expected}') is implemented")))
        }
    }

    /// An `act_cfg` that is either a ReLU (`true`) or `None` (`false`, no
    /// activation), `default` when unset; other activations are not
    /// implemented.
    pub fn relu_or_none(&mut self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.value(key) {
            None => Ok(default),
            Some(Value::None) => Ok(false),
            Some(Value::Dict(d))
                if d.get("type").and_then(Value::as_str) == Some("ReLU")
                    && d.keys().all(|k| k == "type" || k == "inplace") =>
            {
                Ok(true)
            }
            Some(_) => Err(self.unsupported(key, "only dict(type='ReLU') or None is implemented")),
        }
    }

    /// Keys that are accepted and cannot change memory or speed (weight
    /// initialisation, checkpoints, inference-only settings).
    pub fn inert(&mut self, keys: &[&str]) {
        for key in keys {
            self.value(key);
        }
    }

    /// A key segtune does not implement: accepted only when unset or equal to
    /// MMSeg's `default` (numbers compare as Python's `==`).
    pub fn unimplemented(&mut self, key: &str, default: &Value) -> Result<(), ModelError> {
        match self.value(key) {
            None => Ok(()),
            Some(v) if equals_default(v, default) => Ok(()),
            Some(v) => Err(self.unsupported(
                key,
                format!(
                    "{} (only the default {} is implemented)",
                    describe(v),
                    describe(default)
                ),
            )),
        }
    }

    /// Ends reading: any key set but not handled is refused.
    pub fn finish(self) -> Result<(), ModelError> {
        match self.dict.keys().find(|k| !self.read.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => Err(self.unsupported(key, "segtune does not implement this key")),
        }
    }

    /// `Unsupported`, naming the component, the key and the MMSeg file.
    pub fn unsupported(&self, key: &str, why: impl Display) -> ModelError {
        ModelError::unsupported_in(self.component, self.source, key, why)
    }

    /// `Config`, naming the component.
    pub fn config_error(&self, what: impl Display) -> ModelError {
        ModelError::config(self.component, what)
    }

    /// An error of the reader of one setting (`NormCfg`,
    /// `loss_decode_from_cfg`), which knows the setting only by its key
    /// (`norm_cfg`), told as this component's, with its MMSeg file. Errors
    /// of a component nested in the setting (a `CrossEntropyLoss`) keep
    /// their own name.
    pub fn setting_error(&self, key: &str, error: ModelError) -> ModelError {
        match error {
            ModelError::Unsupported {
                component,
                setting,
                source: None,
                why,
            } if component == key => self.unsupported(&format!("{key}.{setting}"), why),
            ModelError::Config { component, what } if component == key => {
                self.config_error(format!("{key} {what}"))
            }
            other => other,
        }
    }
}

/// A value as Python writes a scalar (containers by their type only).
fn describe(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => format!("{f:?}"),
        Value::Str(s) => format!("'{s}'"),
        other => format!("a {}", other.type_name()),
    }
}

fn equals_default(value: &Value, default: &Value) -> bool {
    match (value.as_f64(), default.as_f64()) {
        (Some(a), Some(b)) => a == b,
        _ => value.same_as(default),
    }
}

/// Normalisation layer settings (`norm_cfg`): BN (SyncBN on one device is
/// BN), or GN where a component accepts it ([`NormCfg::from_cfg_bn_or_gn`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormCfg {
    pub eps: f64,
    pub momentum: f64,
    pub requires_grad: bool,
    /// `Some(num_groups)` for `dict(type='GN', num_groups=..)`.
    pub num_groups: Option<i64>,
    /// `SyncBN`/`MMSyncBN`: batch statistics over every GPU's batch when
    /// training data-parallel (see `layers::norm::set_sync_bn_world_size`).
    pub synced: bool,
}

impl NormCfg {
    /// `dict(type='BN')` with PyTorch's defaults.
    pub const BN_DEFAULT: NormCfg = NormCfg {
        eps: 1e-5,
        momentum: 0.1,
        requires_grad: true,
        num_groups: None,
        synced: false,
    };

    /// A BN `norm_cfg`; any other type is unsupported.
    pub fn from_cfg(v: Option<&Value>) -> Result<Option<NormCfg>, ModelError> {
        Self::parse(v, false)
    }

    /// A BN or GN (`nn.GroupNorm`, `num_groups` required) `norm_cfg`.
    pub fn from_cfg_bn_or_gn(v: Option<&Value>) -> Result<Option<NormCfg>, ModelError> {
        Self::parse(v, true)
    }

    fn parse(v: Option<&Value>, allow_gn: bool) -> Result<Option<NormCfg>, ModelError> {
        let d = match v {
            None | Some(Value::None) => return Ok(None),
            Some(Value::Dict(d)) => d,
            Some(other) => {
                return Err(ModelError::config(
                    "norm_cfg",
                    format!("must be a dict, not {}", other.type_name()),
                ))
            }
        };
        let ty = d.get("type").and_then(Value::as_str).unwrap_or("");
        let group_norm = allow_gn && ty == "GN";
        if !group_norm && !matches!(ty, "BN" | "BN2d" | "SyncBN" | "MMSyncBN") {
            let supported = if allow_gn {
                "BN, SyncBN, GN"
            } else {
                "BN, SyncBN"
            };
            return Err(ModelError::unsupported(
                "norm_cfg",
                "type",
                format!("`{ty}` (supported: {supported})"),
            ));
        }
        let number = |key: &str, default: f64| match d.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| {
                ModelError::config(
                    "norm_cfg",
                    format!("`{key}` must be a number, not {}", v.type_name()),
                )
            }),
        };
        Ok(Some(NormCfg {
            eps: number("eps", 1e-5)?,
            momentum: number("momentum", 0.1)?,
            requires_grad: d.get("requires_grad").map(Value::truthy).unwrap_or(true),
            synced: matches!(ty, "SyncBN" | "MMSyncBN"),
            num_groups: match (group_norm, d.get("num_groups")) {
                (false, _) => None,
                (true, Some(Value::Int(g))) if *g > 0 => Some(*g),
                (true, other) => {
                    return Err(ModelError::config(
                        "norm_cfg",
                        format!(
                            "dict(type='GN') needs a positive int `num_groups`, not {}",
                            other.map_or("nothing".to_string(), |v| v.type_name().to_string())
                        ),
                    ))
                }
            },
        }))
    }

    /// mmcv's name for the norm module inside a ConvModule.
    pub fn module_name(&self) -> &'static str {
        if self.num_groups.is_some() {
            "gn"
        } else {
            "bn"
        }
    }
}

/// The `type` of a sub-config, or an error naming what is missing.
pub(crate) fn type_of<'a>(d: &'a Dict, role: &'static str) -> Result<&'a str, ModelError> {
    d.get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError::config(role, "has no `type`"))
}

#[cfg(test)]
pub(crate) mod test_support {
    //! What the model modules' unit tests share: config dicts written as
    //! JSON (lists stand for tuples: the models read both alike), a module
    //! built from such a snippet through its role's registry table (as
    //! `EncoderDecoder` builds it), its build error as text, and small
    //! CPU inputs and their outputs' shapes.

    use crate::config::{Dict, Value};
    use crate::models::backbones::{Backbone, BACKBONES};
    use crate::models::decode_heads::{DecodeHead, DECODE_HEADS};
    use crate::models::necks::{Neck, NECKS};
    use crate::models::params::{ParamScope, ParamStore};
    use crate::models::ModelError;
    use tch::{Device, Kind, Tensor};

    /// `dump`'s JSON reader: lists stay lists (the models read tuples alike).
    pub use crate::config::dump::from_json as to_value;

    pub fn dict(j: serde_json::Value) -> Dict {
        match to_value(&j) {
            Value::Dict(d) => d,
            other => panic!("not a dict: {other:?}"),
        }
    }

    /// `j` with `key` set to `value` (added, or replacing the config's).
    pub fn with_key(
        mut j: serde_json::Value,
        key: &str,
        value: serde_json::Value,
    ) -> serde_json::Value {
        j.as_object_mut()
            .expect("a component config is a JSON object")
            .insert(key.to_string(), value);
        j
    }

    type Ctor<T> = fn(&mut ParamScope, &Dict) -> Result<T, ModelError>;

    /// The module of `j`'s `type` from `table`, built on the CPU with its
    /// parameters under `scope`, and the store holding them.
    fn build_from<T>(
        table: &[(&'static str, Ctor<T>)],
        role: &'static str,
        scope: &str,
        j: serde_json::Value,
    ) -> Result<(ParamStore, T), ModelError> {
        let cfg = dict(j);
        let ctor = crate::models::registry::lookup(table, role, super::type_of(&cfg, role)?)?;
        let mut store = ParamStore::new(Device::Cpu);
        let module = ctor(&mut store.scope(scope), &cfg)?;
        Ok((store, module))
    }

    fn expect_built<T>(built: Result<(ParamStore, T), ModelError>) -> (ParamStore, T) {
        built.unwrap_or_else(|e| panic!("the module does not build: {e}"))
    }

    fn expect_refused<T>(built: Result<(ParamStore, T), ModelError>) -> String {
        match built {
            Ok(_) => panic!("the module builds, but its config should be refused"),
            Err(e) => e.to_string(),
        }
    }

    /// A backbone (`model.backbone`), parameters under `backbone`.
    pub fn backbone(j: serde_json::Value) -> (ParamStore, Box<dyn Backbone>) {
        expect_built(build_from(BACKBONES, "backbone", "backbone", j))
    }

    /// Why the backbone of `j` does not build.
    pub fn backbone_error(j: serde_json::Value) -> String {
        expect_refused(build_from(BACKBONES, "backbone", "backbone", j))
    }

    /// A neck (`model.neck`), parameters under `neck`.
    pub fn neck(j: serde_json::Value) -> (ParamStore, Box<dyn Neck>) {
        expect_built(build_from(NECKS, "neck", "neck", j))
    }

    /// Why the neck of `j` does not build.
    pub fn neck_error(j: serde_json::Value) -> String {
        expect_refused(build_from(NECKS, "neck", "neck", j))
    }

    /// A decode or auxiliary head, parameters under `scope` (`decode_head`,
    /// `auxiliary_head`).
    pub fn head(j: serde_json::Value, scope: &str) -> (ParamStore, Box<dyn DecodeHead>) {
        expect_built(build_from(&head_ctors(), "decode head", scope, j))
    }

    /// The decode heads' table with each row's head constructor.
    fn head_ctors() -> Vec<(&'static str, Ctor<Box<dyn DecodeHead>>)> {
        DECODE_HEADS.iter().map(|(n, b)| (*n, b.build)).collect()
    }

    /// Why the head of `j` does not build.
    pub fn head_error(j: serde_json::Value) -> String {
        expect_refused(build_from(&head_ctors(), "decode head", "decode_head", j))
    }

    /// A `[batch, 3, h, w]` image batch of standard normal values.
    pub fn image(batch: i64, h: i64, w: i64) -> Tensor {
        Tensor::randn([batch, 3, h, w], (Kind::Float, Device::Cpu))
    }

    /// Multi-level features `[batch, c, h, w]`, one per `(c, h, w)`, of
    /// standard normal values.
    pub fn features(batch: i64, levels: &[(i64, i64, i64)]) -> Vec<Tensor> {
        levels
            .iter()
            .map(|&(c, h, w)| Tensor::randn([batch, c, h, w], (Kind::Float, Device::Cpu)))
            .collect()
    }

    /// Per-image `[1, h, w]` label maps of class 0, as heads' `loss` takes them.
    pub fn labels(batch: i64, h: i64, w: i64) -> Vec<Tensor> {
        (0..batch)
            .map(|_| Tensor::zeros([1, h, w], (Kind::Int64, Device::Cpu)))
            .collect()
    }

    /// The shape of each tensor.
    pub fn shapes(tensors: &[Tensor]) -> Vec<Vec<i64>> {
        tensors.iter().map(Tensor::size).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::dict;
    use super::*;
    use serde_json::json;

    #[test]
    fn an_unhandled_key_is_refused_with_the_component_and_its_file() {
        let d = dict(json!({"type": "X", "depth": 3, "init_cfg": null}));
        let mut c = ComponentConfig::new(&d, "Thing", "mmseg/models/x.py");
        c.inert(&["init_cfg"]);
        let err = c.finish().unwrap_err().to_string();
        assert!(err.contains("Thing `depth` (mmseg/models/x.py)"), "{err}");
    }

    #[test]
    fn an_unimplemented_key_passes_at_its_default_only() {
        let d = dict(json!({"type": "X", "with_cp": false, "rate": 0}));
        let mut c = ComponentConfig::new(&d, "Thing", "x.py");
        c.unimplemented("with_cp", &Value::Bool(false)).unwrap();
        c.unimplemented("rate", &Value::Float(0.0)).unwrap();
        c.finish().unwrap();
        let d = dict(json!({"type": "X", "with_cp": true}));
        let mut c = ComponentConfig::new(&d, "Thing", "x.py");
        let err = c.unimplemented("with_cp", &Value::Bool(false)).unwrap_err();
        assert!(err.to_string().contains("`with_cp`"), "{err}");
    }

    #[test]
    fn a_norm_cfg_error_names_the_component_that_reads_it() {
        let d = dict(json!({"type": "X", "norm_cfg": {"type": "LN"}}));
        let mut c = ComponentConfig::new(&d, "Thing", "x.py");
        let err = c.batch_norm("norm_cfg").unwrap_err();
        assert_eq!(
            err.to_string(),
            "not supported yet: Thing `norm_cfg.type` (x.py): `LN` (supported: BN, SyncBN)"
        );
        let d = dict(json!({"type": "X", "norm_cfg": 3}));
        let mut c = ComponentConfig::new(&d, "Thing", "x.py");
        let err = c.batch_norm("norm_cfg").unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad model config: Thing: norm_cfg must be a dict, not int"
        );
    }
}
