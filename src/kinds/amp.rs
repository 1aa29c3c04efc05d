//! Mixed precision: off, fp16 (autocast with dynamic loss scaling) or bf16,
//! as MMEngine's `AmpOptimWrapper` runs them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tch::Kind;

/// Mixed precision (of a trial, a prediction, a search candidate).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Amp {
    Off,
    Fp16,
    Bf16,
}

impl Amp {
    /// The precision as a recipe says it: fp32, fp16 or bf16.
    pub fn precision_name(self) -> &'static str {
        match self {
            Amp::Off => "fp32",
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

crate::named::named_enum!(Amp, "a precision", {
    Off => "off",
    Fp16 => "fp16",
    Bf16 => "bf16",
});
