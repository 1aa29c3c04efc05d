//! Enums that have a name on the command line, in configs and in reports
//! (`fp16`, `zoo-2021`, `keep-crop`, `py`): one list of names per enum,
//! from which its `Display`, its `FromStr` and the command line's choices
//! are all derived.

/// An enum with one name per value.
pub trait Named: Copy + Sized + 'static {
    /// Every value, in the order they are listed.
    const ALL: &'static [Self];
    fn name(self) -> &'static str;
}

/// The names of `T`'s values, as a message lists them: `a, b or c`.
pub fn choices<T: Named>() -> String {
    let names: Vec<&str> = T::ALL.iter().map(|v| v.name()).collect();
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The value of `T` named `name`, or a message saying which names exist.
pub fn parse<T: Named>(name: &str, what: &str) -> Result<T, String> {
    T::ALL
        .iter()
        .copied()
        .find(|v| v.name() == name)
        .ok_or_else(|| format!("`{name}` is not {what}; use {}", choices::<T>()))
}

/// Implements [`Named`] (and an inherent `name`), `Display` and `FromStr`
/// for an enum from its variants' names: `named_enum!(Amp, "a precision",
/// { Off => "off", Fp16 => "fp16" })`.
macro_rules! named_enum {
    ($ty:ident, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// The name on the command line and in reports.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl $crate::named::Named for $ty {
            const ALL: &'static [$ty] = &[$($ty::$variant),+];
            fn name(self) -> &'static str {
                $ty::name(self)
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str($ty::name(*self))
            }
        }

        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<$ty, String> {
                $crate::named::parse(s, $what)
            }
        }
    };
}
pub(crate) use named_enum;

#[cfg(test)]
mod tests {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Precision {
        Off,
        Fp16,
        Bf16,
    }

    named_enum!(Precision, "a precision", {
        Off => "off",
        Fp16 => "fp16",
        Bf16 => "bf16",
    });

    #[test]
    fn names_parse_back_and_unknown_ones_list_the_choices() {
        for p in [Precision::Off, Precision::Fp16, Precision::Bf16] {
            assert_eq!(p.to_string().parse::<Precision>(), Ok(p));
        }
        assert_eq!(
            "fp8".parse::<Precision>(),
            Err("`fp8` is not a precision; use off, fp16 or bf16".to_string())
        );
    }
}
