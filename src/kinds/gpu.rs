//! The GPU a prediction or search is for, as the user names it: a shipped
//! preset, or a memory size and a compute capability ([`GpuChoice`]), its
//! memory parsed once where it is read ([`Vram`]: `--vram`, a config's
//! `segtune.vram`, an atlas's columns). Turning a choice into a card's
//! figures is `predict::budget::Gpu::choose`'s.

/// GPU memory as it was written (`4G`, `3.5GiB`, `4096M`, bytes) and its
/// bytes, parsed once. It is written back as it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vram {
    text: String,
    bytes: u64,
}

impl Vram {
    /// Its bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A size of `bytes` (written as bytes).
    pub fn of_bytes(bytes: u64) -> Vram {
        Vram {
            text: bytes.to_string(),
            bytes,
        }
    }
}

impl std::fmt::Display for Vram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for Vram {
    type Err = VramError;
    fn from_str(text: &str) -> Result<Vram, VramError> {
        Ok(Vram {
            text: text.to_string(),
            bytes: parse_vram(text)?,
        })
    }
}

impl serde::Serialize for Vram {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for Vram {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Vram, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Vram {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Vram".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        String::json_schema(generator)
    }
}

/// The GPU named by the user: a preset, or a memory size (and the card's
/// compute capability); neither, the card nvidia-smi finds. The one
/// declaration of the triple that `--preset`/`--vram`/`--compute-capability`,
/// a config's `segtune` section and an atlas's columns all fill.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct GpuChoice {
    /// GPU memory (`4G`, `4096MiB`, ...; binary units) — or use `preset`.
    pub vram: Option<Vram>,
    /// A shipped GPU preset (`rtx3050ti`, `rtx2070`, `rtx3060`, `rtx3090`, `rtx4090`, `h200`).
    pub preset: Option<String>,
    /// Compute capability of a `vram` budget (e.g. "8.6").
    pub compute_capability: Option<String>,
}

impl GpuChoice {
    /// A shipped preset.
    pub fn preset(name: &str) -> GpuChoice {
        GpuChoice {
            preset: Some(name.to_string()),
            ..GpuChoice::default()
        }
    }

    /// A card known by its memory and compute capability.
    pub fn custom(vram: Vram, compute_capability: Option<String>) -> GpuChoice {
        GpuChoice {
            vram: Some(vram),
            compute_capability,
            ..GpuChoice::default()
        }
    }

    /// Whether it names a GPU (a preset or a memory size).
    pub fn names_a_gpu(&self) -> bool {
        self.vram.is_some() || self.preset.is_some()
    }

    /// The column's name: the preset's, or `vram-<size>` as it was written.
    pub fn label(&self) -> String {
        match (&self.preset, &self.vram) {
            (Some(p), _) => p.clone(),
            (None, Some(v)) => format!("vram-{v}"),
            (None, None) => "gpu".into(),
        }
    }
}

/// Parses a VRAM size. All units are binary (1G = 1 GiB = 1024 MiB, as
/// nvidia-smi's MiB are): `4G`, `4GB`, `4GiB`, `3.5G`, `4096M`, `4096MiB`,
/// `512K`, or plain bytes.
pub fn parse_vram(text: &str) -> std::result::Result<u64, VramError> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let text = || text.to_string();
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| VramError::NotASize { text: text() })?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(VramError::UnknownUnit {
                text: text(),
                unit: other.into(),
            })
        }
    };
    if !(value.is_finite() && value > 0.0) {
        return Err(VramError::NotPositive { text: text() });
    }
    let bytes = (value * scale as f64).round();
    // `as u64` would saturate: 99999999999G is not a GPU, it is a typo.
    if bytes >= u64::MAX as f64 {
        return Err(VramError::TooLarge { text: text() });
    }
    if bytes < 1.0 {
        return Err(VramError::NotPositive { text: text() });
    }
    // No GPU has under a mebibyte: `--vram 8` means 8 GiB, not 8 bytes.
    if bytes < (1u64 << 20) as f64 {
        return Err(VramError::TooSmall {
            text: text(),
            guess: format!("{}G", number.trim()),
        });
    }
    Ok(bytes as u64)
}

/// Why a `--vram` value is not a memory size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VramError {
    #[error("`{text}` is not a memory size; write e.g. 4G, 4096MiB or 3.5GB")]
    NotASize { text: String },
    #[error("`{text}`: unknown unit `{unit}` (use K, M, G or T; all binary)")]
    UnknownUnit { text: String, unit: String },
    #[error("`{text}` must be a positive size")]
    NotPositive { text: String },
    #[error("`{text}` is under 1 MiB, smaller than any GPU's memory: did you mean {guess}? (a size without a unit is in bytes)")]
    TooSmall { text: String, guess: String },
    #[error("`{text}` is beyond any memory size (the largest is 16 EiB); write e.g. 24G")]
    TooLarge { text: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vram_sizes() {
        for (t, want) in [
            ("4G", 4u64 << 30),
            ("4GB", 4 << 30),
            ("4GiB", 4 << 30),
            ("3.5G", 7 << 29),
            ("4096M", 4 << 30),
            ("4096MiB", 4 << 30),
            ("1073741824", 1 << 30),
        ] {
            assert_eq!(parse_vram(t).unwrap(), want, "{t}");
        }
        for bad in [
            "",
            "G",
            "-1G",
            "4X",
            "four",
            "NaN",
            "infG",
            "99999999999G",
            "0.1",
        ] {
            assert!(parse_vram(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_size_is_written_back_as_it_was_given() {
        let v: Vram = "3.5G".parse().unwrap();
        assert_eq!((v.to_string(), v.bytes()), ("3.5G".to_string(), 7 << 29));
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(json, "\"3.5G\"");
        assert_eq!(serde_json::from_str::<Vram>(&json).unwrap(), v);
        assert!(serde_json::from_str::<Vram>("\"abc\"").is_err());
    }
}
