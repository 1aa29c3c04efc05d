//! Why a model cannot be built, as data: an MMSeg `type` segtune has no
//! implementation of, a setting it does not implement, or a config that is
//! malformed. Each kind keeps its parts (the component, the setting, the
//! MMSeg file) as fields, so that the worker can hand it to the parent as
//! JSON and nobody has to read the kind back from the message.

use serde::{Deserialize, Serialize};
use std::fmt::{self, Display};

/// Why a model cannot be built.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelError {
    /// A `type` segtune has no implementation of; `supported` comes from the
    /// role's registry table.
    UnknownType {
        /// `backbone`, `neck`, `decode head`, `auxiliary head`, `segmentor`.
        role: String,
        name: String,
        supported: Vec<String>,
    },
    /// Several components of unknown type (each an `UnknownType`), in
    /// MMSeg's build order.
    UnknownTypes { components: Vec<ModelError> },
    /// A setting segtune does not implement.
    Unsupported {
        /// The MMSeg class (`MixVisionTransformer`) or the config path
        /// (`model.data_preprocessor`) the setting belongs to.
        component: String,
        /// The key or setting refused (`with_cp`, `extra.stage1.block`);
        /// empty when the refusal is about the component as a whole.
        setting: String,
        /// The MMSeg source file of the component, where it is known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
        /// What is set and what segtune implements instead.
        why: String,
    },
    /// A setting that is missing, of the wrong type, or inconsistent with
    /// another.
    Config {
        /// The MMSeg class or the config path the setting belongs to.
        component: String,
        /// What is wrong with it.
        what: String,
    },
}

impl ModelError {
    /// `backbone \`MyResNet\``, once per unknown component: the types
    /// segtune does not build (empty for any other error).
    pub fn unknown_type_names(&self) -> Vec<String> {
        match self {
            ModelError::UnknownType { role, name, .. } => vec![format!("{role} `{name}`")],
            ModelError::UnknownTypes { components } => {
                let mut names: Vec<String> = Vec::new();
                for name in components.iter().flat_map(ModelError::unknown_type_names) {
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
                names
            }
            _ => Vec::new(),
        }
    }

    /// What to do about types segtune does not build, for a config whose
    /// `custom_imports` are `modules`: the module that would define them,
    /// and how to let segtune run that code (`--python-worker`), which it
    /// never does unasked. `None` for any other error.
    pub fn unknown_type_help(
        &self,
        modules: &[String],
        config: &std::path::Path,
    ) -> Option<String> {
        let names = self.unknown_type_names();
        if names.is_empty() {
            return None;
        }
        let from = match modules {
            [] => "a module of yours (the config has no custom_imports naming one)".to_string(),
            [one] => format!("the config's custom_imports, `{one}`"),
            many => format!(
                "one of the config's custom_imports ({})",
                many.iter()
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        Some(format!(
            "{} {} not one of MMSeg's own types; it would come from {from}. segtune reads \
             configs as text and never runs your Python unless asked: add --python-worker to \
             run the step with MMSeg itself in your Python (which imports your modules), e.g. \
             `segtune search {} --python-worker ...`",
            names.join(", "),
            if names.len() == 1 { "is" } else { "are" },
            config.display()
        ))
    }

    /// `Unsupported` without a source file.
    pub fn unsupported(
        component: impl Into<String>,
        setting: impl Into<String>,
        why: impl Display,
    ) -> Self {
        ModelError::Unsupported {
            component: component.into(),
            setting: setting.into(),
            source: None,
            why: why.to_string(),
        }
    }

    /// `Unsupported` naming the component's MMSeg source file.
    pub fn unsupported_in(
        component: impl Into<String>,
        source: impl Into<String>,
        setting: impl Into<String>,
        why: impl Display,
    ) -> Self {
        match ModelError::unsupported(component, setting, why) {
            ModelError::Unsupported {
                component,
                setting,
                why,
                ..
            } => ModelError::Unsupported {
                component,
                setting,
                source: Some(source.into()),
                why,
            },
            other => other,
        }
    }

    /// `Config` naming the first of `values` (`(key, value)`) below 1.
    pub fn require_positive(component: &str, values: &[(&str, i64)]) -> Result<(), Self> {
        match values.iter().find(|(_, v)| *v < 1) {
            Some((key, value)) => Err(ModelError::config(
                component,
                format!("{key} must be >= 1, not {value}"),
            )),
            None => Ok(()),
        }
    }

    /// `Config` of `component`.
    pub fn config(component: impl Into<String>, what: impl Display) -> Self {
        ModelError::Config {
            component: component.into(),
            what: what.to_string(),
        }
    }
}

impl Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::UnknownType {
                role,
                name,
                supported,
            } if supported.is_empty() => write!(
                f,
                "unknown {role} type `{name}`; segtune supports no {role} yet"
            ),
            ModelError::UnknownType {
                role,
                name,
                supported,
            } => write!(
                f,
                "unknown {role} type `{name}`; segtune supports: {}",
                supported.join(", ")
            ),
            ModelError::UnknownTypes { components } => write_unknown_types(f, components),
            ModelError::Unsupported {
                component,
                setting,
                source,
                why,
            } => {
                write!(f, "not supported yet: {component}")?;
                if !setting.is_empty() {
                    write!(f, " `{setting}`")?;
                }
                if let Some(source) = source {
                    write!(f, " ({source})")?;
                }
                write!(f, ": {why}")
            }
            ModelError::Config { component, what } => {
                write!(f, "bad model config: {component}: {what}")
            }
        }
    }
}

/// Each missing type once (a list of auxiliary heads repeats one), then each
/// table's supported names once.
fn write_unknown_types(f: &mut fmt::Formatter<'_>, components: &[ModelError]) -> fmt::Result {
    let mut missing: Vec<(String, usize)> = Vec::new();
    let mut tables: Vec<(&str, &[String])> = Vec::new();
    for e in components {
        let ModelError::UnknownType {
            role,
            name,
            supported,
        } = e
        else {
            continue;
        };
        let label = format!("{role} `{name}`");
        match missing.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => *n += 1,
            None => missing.push((label, 1)),
        }
        let kind = match role.as_str() {
            "decode head" | "auxiliary head" => "heads",
            "backbone" => "backbones",
            "neck" => "necks",
            other => other,
        };
        if !tables.iter().any(|(k, _)| *k == kind) {
            tables.push((kind, supported));
        }
    }
    let missing: Vec<String> = missing
        .into_iter()
        .map(|(l, n)| if n > 1 { format!("{l} (x{n})") } else { l })
        .collect();
    write!(f, "unknown component types: {}", missing.join(", "))?;
    for (kind, supported) in tables {
        write!(f, "\n  {kind} segtune supports: {}", supported.join(", "))?;
    }
    Ok(())
}

impl std::error::Error for ModelError {}

#[cfg(test)]
mod tests {
    #[test]
    fn unknown_components_are_named_once_each() {
        let unknown = |role: &str, name: &str| ModelError::UnknownType {
            role: role.into(),
            name: name.into(),
            supported: vec!["ResNet".into()],
        };
        let error = ModelError::UnknownTypes {
            components: vec![
                unknown("backbone", "MyResNet"),
                unknown("auxiliary head", "MyHead"),
                unknown("auxiliary head", "MyHead"),
            ],
        };
        assert_eq!(
            error.unknown_type_names(),
            ["backbone `MyResNet`", "auxiliary head `MyHead`"]
        );
        let help = error
            .unknown_type_help(&["my_mods".into()], std::path::Path::new("c.py"))
            .unwrap();
        assert!(
            help.contains("are not one of MMSeg's own types")
                && help.contains("custom_imports, `my_mods`")
                && help.contains("--python-worker"),
            "{help}"
        );
    }

    use super::*;

    #[test]
    fn unsupported_reads_component_setting_source_and_why() {
        let e = ModelError::unsupported_in("UNet", "mmseg/models/backbones/unet.py", "dcn", "set");
        assert_eq!(
            e.to_string(),
            "not supported yet: UNet `dcn` (mmseg/models/backbones/unet.py): set"
        );
        let e = ModelError::unsupported("FPN", "", "an act_cfg other than None or ReLU");
        assert_eq!(
            e.to_string(),
            "not supported yet: FPN: an act_cfg other than None or ReLU"
        );
    }

    #[test]
    fn config_names_its_component() {
        let e = ModelError::config("MLANeck", "in_channels is empty");
        assert_eq!(
            e.to_string(),
            "bad model config: MLANeck: in_channels is empty"
        );
    }

    #[test]
    fn every_kind_survives_json() {
        let unknown = |name: &str| ModelError::UnknownType {
            role: "backbone".into(),
            name: name.into(),
            supported: vec!["ResNet".into(), "UNet".into()],
        };
        for e in [
            unknown("X"),
            ModelError::UnknownTypes {
                components: vec![unknown("X"), unknown("Y")],
            },
            ModelError::unsupported_in("UNet", "unet.py", "dcn", "set"),
            ModelError::unsupported("FPN", "act_cfg", "GELU"),
            ModelError::config("model", "lacks `backbone`"),
        ] {
            let text = serde_json::to_string(&e).unwrap();
            let back: ModelError = serde_json::from_str(&text).unwrap();
            assert_eq!(back, e, "{text}");
            assert_eq!(back.to_string(), e.to_string());
        }
    }
}
