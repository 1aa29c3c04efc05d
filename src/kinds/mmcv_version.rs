//! The mmcv releases segtune reproduces (`--mmcv X.Y.Z`): which mmcv
//! building blocks hold other tensors than the mmcv 2.x that MMSeg 1.x runs
//! on, and since when. MMSeg 1.x always runs mmcv 2.x; an older release
//! matters for reproducing MMSeg 0.x logs (the model zoo's 2020-2022 runs).

use std::fmt;
use std::str::FromStr;

/// An mmcv release, MAJOR.MINOR.PATCH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MmcvVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl MmcvVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> MmcvVersion {
        MmcvVersion {
            major,
            minor,
            patch,
        }
    }

    /// The oldest release MMSeg ran on (MMSeg 0.5, 2020-07).
    pub const OLDEST: MmcvVersion = MmcvVersion::new(1, 0, 0);
    /// What MMSeg 1.2.2 runs on (`mmcv>=2.0.0rc4,<2.2.0`): segtune's rebuild.
    pub const NEWEST: MmcvVersion = MmcvVersion::new(2, 1, 0);

    /// Whether `switch` is on in this release.
    pub fn has(self, switch: MmcvSwitch) -> bool {
        let s = switch.spec();
        self >= s.from && s.until.is_none_or(|u| self <= u)
    }
}

impl Default for MmcvVersion {
    fn default() -> MmcvVersion {
        MmcvVersion::NEWEST
    }
}

impl fmt::Display for MmcvVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A `--mmcv` value that is not a release segtune reproduces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{given}` is not an mmcv release segtune knows; write MAJOR.MINOR or MAJOR.MINOR.PATCH from {} to {} (e.g. 1.2.4, 1.4, 2.1)",
    MmcvVersion::OLDEST,
    MmcvVersion::NEWEST
)]
pub struct UnknownMmcvVersion {
    /// What was given.
    pub given: String,
}

impl FromStr for MmcvVersion {
    type Err = UnknownMmcvVersion;
    /// `1.2.4`, or `1.4` for its first release (`1.4.0`).
    fn from_str(s: &str) -> Result<MmcvVersion, UnknownMmcvVersion> {
        let bad = || UnknownMmcvVersion {
            given: s.to_string(),
        };
        let parts: Vec<u32> = s
            .trim()
            .split('.')
            .map(|p| p.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        let v = match parts[..] {
            [major, minor] => MmcvVersion::new(major, minor, 0),
            [major, minor, patch] => MmcvVersion::new(major, minor, patch),
            _ => return Err(bad()),
        };
        if (MmcvVersion::OLDEST..=MmcvVersion::NEWEST).contains(&v) || (v.major, v.minor) == (2, 1)
        {
            Ok(v)
        } else {
            Err(bad())
        }
    }
}

impl serde::Serialize for MmcvVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MmcvVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<MmcvVersion, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A memory-relevant behaviour of mmcv's building blocks that differs
/// between releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmcvSwitch {
    /// `HSwish` is mmcv's own module, `x * ReLU6(x + 3) / 6` (ReLU6 in
    /// place), instead of `nn.Hardswish`: it keeps `x`, `ReLU6(x + 3)` (and,
    /// from PyTorch 1.10, a copy of `x + 3`) for backward, where
    /// `nn.Hardswish(inplace=True)` keeps one copy of `x`.
    HSwishComposite,
}

/// One switch's table row: where it is on and where that comes from.
#[derive(Debug, Clone, Copy)]
pub struct MmcvSwitchSpec {
    pub switch: MmcvSwitch,
    pub name: &'static str,
    /// The first release with the behaviour.
    pub from: MmcvVersion,
    /// The last release with it (None: still so in the newest).
    pub until: Option<MmcvVersion>,
    pub what: &'static str,
    pub source: &'static str,
}

/// Every mmcv switch segtune models, in the order `docs/prediction.md`
/// lists them.
pub const MMCV_SWITCHES: &[MmcvSwitchSpec] = &[MmcvSwitchSpec {
    switch: MmcvSwitch::HSwishComposite,
    name: "hswish-composite",
    from: MmcvVersion::OLDEST,
    until: Some(MmcvVersion::new(1, 4, 4)),
    what: "HSwish is mmcv's x * ReLU6(x + 3) / 6, which keeps x and ReLU6(x + 3) for backward (nn.Hardswish keeps one copy of x)",
    source: "mmcv/cnn/bricks/hswish.py: open-mmlab/mmcv#358 (v1.0.0) to #1709 (commit 62c1b7f, first in v1.4.5: nn.Hardswish for torch >= 1.7)",
}];

impl MmcvSwitch {
    pub fn spec(self) -> &'static MmcvSwitchSpec {
        MMCV_SWITCHES
            .iter()
            .find(|s| s.switch == self)
            .expect("every mmcv switch has a row in MMCV_SWITCHES")
    }
}

/// The words an output adds where a prediction is for an older mmcv than
/// MMSeg 1.x's: "; mmcv 1.2.4: HSwish is ...". Empty for the newest.
pub fn mmcv_note(mmcv: MmcvVersion) -> String {
    let on: Vec<&str> = MMCV_SWITCHES
        .iter()
        .filter(|s| mmcv.has(s.switch) && !MmcvVersion::NEWEST.has(s.switch))
        .map(|s| s.what)
        .collect();
    if mmcv == MmcvVersion::NEWEST {
        String::new()
    } else if on.is_empty() {
        format!("; mmcv {mmcv} (holds what {} holds)", MmcvVersion::NEWEST)
    } else {
        format!("; mmcv {mmcv}: {}", on.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_with_or_without_their_patch_and_outside_ones_are_refused() {
        assert_eq!("1.2.4".parse(), Ok(MmcvVersion::new(1, 2, 4)));
        assert_eq!("1.4".parse(), Ok(MmcvVersion::new(1, 4, 0)));
        assert_eq!("2.1.0".parse(), Ok(MmcvVersion::NEWEST));
        assert_eq!("2.1".parse(), Ok(MmcvVersion::NEWEST));
        for bad in ["0.9", "2.2.0", "3.0", "1", "1.x", "1.2.3.4", ""] {
            let e = bad.parse::<MmcvVersion>().unwrap_err();
            assert!(e.to_string().contains("from 1.0.0 to 2.1.0"), "{e}");
        }
    }

    #[test]
    fn the_composite_hswish_ends_with_1_4_4() {
        let composite = |v: &str| {
            v.parse::<MmcvVersion>()
                .unwrap()
                .has(MmcvSwitch::HSwishComposite)
        };
        assert!(composite("1.0.0") && composite("1.2.4") && composite("1.4.4"));
        assert!(!composite("1.4.5") && !composite("1.7.0") && !composite("2.1.0"));
        assert_eq!(mmcv_note(MmcvVersion::NEWEST), "");
        assert!(mmcv_note(MmcvVersion::new(1, 2, 4)).starts_with("; mmcv 1.2.4: HSwish is mmcv's"));
        assert_eq!(
            mmcv_note(MmcvVersion::new(1, 7, 0)),
            "; mmcv 1.7.0 (holds what 2.1.0 holds)"
        );
    }
}
