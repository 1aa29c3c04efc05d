//! Mixed precision: off, fp16 (autocast with dynamic loss scaling) or bf16,
//! as MMEngine's `AmpOptimWrapper` runs them.

use tch::Kind;

/// Mixed precision (of a trial, a prediction, a search candidate).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Amp {
    Off,
    Fp16,
    Bf16,
}

impl Amp {
    /// Every precision, in the order the search tries them.
    pub const ALL: [Amp; 3] = [Amp::Off, Amp::Fp16, Amp::Bf16];

    /// The name on the command line and in reports (`off`, `fp16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Amp::Off => "off",
            Amp::Fp16 => "fp16",
            Amp::Bf16 => "bf16",
        }
    }

    pub fn kind(self) -> Option<Kind> {
        match self {
            Amp::Off => None,
            Amp::Fp16 => Some(Kind::Half),
            Amp::Bf16 => Some(Kind::BFloat16),
        }
    }
}

impl std::fmt::Display for Amp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Amp {
    type Err = String;
    fn from_str(s: &str) -> Result<Amp, String> {
        Amp::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("`{s}` is not a precision; use off, fp16 or bf16"))
    }
}
