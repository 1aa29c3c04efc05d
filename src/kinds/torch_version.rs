//! The PyTorch release a trial or prediction stands for, and the
//! memory-relevant behaviours that moved between releases 1.8 and 2.11:
//! each one a named switch with the PyTorch change it comes from
//! ([`SWITCHES`], the table `docs/prediction.md` prints). segtune runs
//! libtorch 2.11; an older release is reproduced by these switches only,
//! on the CPU (traces and CPU trials), never on a GPU.

use std::fmt;
use std::str::FromStr;

/// A PyTorch release, `major.minor` (patch releases do not move memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TorchVersion {
    pub major: u32,
    pub minor: u32,
}

impl TorchVersion {
    pub const fn new(major: u32, minor: u32) -> TorchVersion {
        TorchVersion { major, minor }
    }

    /// The oldest release segtune predicts for (MMSeg 0.x's floor).
    pub const OLDEST: TorchVersion = TorchVersion::new(1, 8);
    /// The libtorch segtune links: real trials always run it.
    pub const NEWEST: TorchVersion = TorchVersion::new(2, 11);
    /// The release MMSeg's model-zoo memory was measured with
    /// (`--stack zoo-2021`).
    pub const ZOO_2021: TorchVersion = TorchVersion::new(1, 10);

    /// Whether `switch` is on in this release.
    pub fn has(self, switch: Switch) -> bool {
        let s = switch.spec();
        self >= s.from && s.until.is_none_or(|u| self <= u)
    }

    /// Which release a version string from Python's `torch.__version__`
    /// (`2.1.2+cu121`, `1.13.1`, `2.5.0a0+git1234`) stands for.
    pub fn from_python(version: &str) -> Option<TorchVersion> {
        let mut parts = version.trim().split(['.', '+']);
        let major = parts.next()?.parse().ok()?;
        let minor: String = parts
            .next()?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Some(TorchVersion::new(major, minor.parse().ok()?))
    }
}

impl Default for TorchVersion {
    fn default() -> TorchVersion {
        TorchVersion::NEWEST
    }
}

impl fmt::Display for TorchVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A `--torch` (or `segtune.torch`) value that is not a release segtune
/// reproduces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{given}` is not a PyTorch release segtune knows; write MAJOR.MINOR from {} to {} (e.g. 1.13, 2.1)",
    TorchVersion::OLDEST,
    TorchVersion::NEWEST
)]
pub struct UnknownTorchVersion {
    /// What was given.
    pub given: String,
}

impl FromStr for TorchVersion {
    type Err = UnknownTorchVersion;
    fn from_str(s: &str) -> Result<TorchVersion, UnknownTorchVersion> {
        let bad = || UnknownTorchVersion {
            given: s.to_string(),
        };
        let (major, minor) = s.trim().split_once('.').ok_or_else(bad)?;
        let v = TorchVersion::new(
            major.parse().map_err(|_| bad())?,
            minor.parse().map_err(|_| bad())?,
        );
        let known = (1..=2).contains(&v.major)
            && (v.major != 1 || v.minor <= 13)
            && (TorchVersion::OLDEST..=TorchVersion::NEWEST).contains(&v);
        if known {
            Ok(v)
        } else {
            Err(bad())
        }
    }
}

impl serde::Serialize for TorchVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TorchVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<TorchVersion, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for TorchVersion {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TorchVersion".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[12]\\.[0-9]+$",
            "description": "A PyTorch release, MAJOR.MINOR, from 1.8 to 2.11"
        })
    }
}

/// A memory-relevant behaviour that differs between PyTorch releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// `softmax` and `log_softmax` keep their input for backward as well
    /// as their output (one more activation per softmax).
    SoftmaxKeepsInput,
    /// In-place `hardtanh_` (`ReLU6(inplace=True)`) saves its result for
    /// backward instead of a copy of its input (one activation less per
    /// ReLU6).
    InplaceHardtanhSavesResult,
    /// `binary_cross_entropy_with_logits` computes through four input-sized
    /// temporaries (`max_val`, `-max_val`, `-input`, `-input - max_val`)
    /// instead of one (`log_sigmoid(input)`).
    BceWithLogitsFourTemporaries,
    /// `optimizer.zero_grad()` zeroes the gradients in place
    /// (`set_to_none=False`): they stay allocated between steps.
    ZeroGradKeepsGradients,
    /// On CUDA, optimizers run their `foreach` (multi-tensor)
    /// implementation unless told otherwise: whole-list temporaries in the
    /// optimizer step instead of per-parameter ones.
    ForeachOptimizersOnCuda,
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` exists.
    ExpandableSegments,
    /// cuBLAS's workspace comes from the caching allocator (counted in
    /// `max_memory_allocated`), one per (handle, stream).
    CublasWorkspaceInAllocator,
    /// Convolutions go through cuDNN's v8 (frontend) API: heuristics mode
    /// INSTANT, benchmark searches that halve their workspace on an
    /// out-of-memory and free it before `emptyCache`.
    CudnnV8Api,
}

/// One switch's table row: where it is on and where that comes from.
#[derive(Debug, Clone, Copy)]
pub struct SwitchSpec {
    pub switch: Switch,
    pub name: &'static str,
    /// The first release with the behaviour.
    pub from: TorchVersion,
    /// The last release with it (None: still so in the newest).
    pub until: Option<TorchVersion>,
    pub what: &'static str,
    pub source: &'static str,
}

/// Every switch segtune models, in the order `docs/prediction.md` lists them.
pub const SWITCHES: &[SwitchSpec] = &[
    SwitchSpec {
        switch: Switch::SoftmaxKeepsInput,
        name: "softmax-keeps-input",
        from: TorchVersion::OLDEST,
        until: Some(TorchVersion::new(1, 10)),
        what: "softmax/log_softmax save their input for backward besides their output",
        source: "pytorch/pytorch#64000, fixed by #65242 (first in 1.11)",
    },
    SwitchSpec {
        switch: Switch::InplaceHardtanhSavesResult,
        name: "inplace-hardtanh-saves-result",
        from: TorchVersion::OLDEST,
        until: Some(TorchVersion::new(1, 9)),
        what: "in-place hardtanh_ (ReLU6(inplace=True)) saves its result for backward, not a copy of its input",
        source: "autograd's HardtanhBackward1 (a saved result_) in the 1.6, 1.8 and 1.9 wheels' torch/csrc/autograd/generated/Functions.h, absent from 1.10's and 1.13's",
    },
    SwitchSpec {
        switch: Switch::BceWithLogitsFourTemporaries,
        name: "bce-with-logits-four-temporaries",
        from: TorchVersion::OLDEST,
        until: Some(TorchVersion::new(2, 2)),
        what: "binary_cross_entropy_with_logits computes through four input-sized temporaries, not one",
        source: "aten/src/ATen/native/Loss.cpp binary_cross_entropy_with_logits: neg, clamp_min_, exp_ calls in the 1.13, 2.0, 2.1 and 2.2 wheels' libtorch_cpu.so; log_sigmoid in 2.3's and 2.11's",
    },
    SwitchSpec {
        switch: Switch::ZeroGradKeepsGradients,
        name: "zero-grad-keeps-gradients",
        from: TorchVersion::OLDEST,
        until: Some(TorchVersion::new(1, 13)),
        what: "optimizer.zero_grad() defaults to set_to_none=False: gradients stay allocated (zeroed) between steps",
        source: "pytorch/pytorch#92731 (set_to_none=True default, 2.0; issue #92656)",
    },
    SwitchSpec {
        switch: Switch::ForeachOptimizersOnCuda,
        name: "foreach-optimizers-on-cuda",
        from: TorchVersion::new(2, 0),
        until: None,
        what: "SGD/Adam/AdamW/... default to the foreach implementation when the parameters are on CUDA",
        source: "pytorch/pytorch#92306 and #95820 (cherry-picked to 2.0 as #95862)",
    },
    SwitchSpec {
        switch: Switch::ExpandableSegments,
        name: "expandable-segments",
        from: TorchVersion::new(2, 1),
        until: None,
        what: "the caching allocator's expandable_segments:True setting exists",
        source: "pytorch/pytorch#96995 (\"Expandable blocks in allocator\", merged 2023-04, first in 2.1)",
    },
    SwitchSpec {
        switch: Switch::CublasWorkspaceInAllocator,
        name: "cublas-workspace-in-allocator",
        from: TorchVersion::new(1, 13),
        until: None,
        what: "cuBLAS's workspace is taken from the caching allocator and kept, one per (handle, stream)",
        source: "pytorch/pytorch#83461 (CublasHandlePool.cpp getNewWorkspace; 1.10's headers have no workspace API)",
    },
    SwitchSpec {
        switch: Switch::CudnnV8Api,
        name: "cudnn-v8-api",
        from: TorchVersion::new(2, 0),
        until: None,
        what: "convolutions use cuDNN's v8 API (Conv_v8.cpp) instead of the v7 one (Conv_v7.cpp)",
        source: "pytorch/pytorch#91117 (\"cuDNN V8 API on by default\", merged 2022-12-20)",
    },
];

impl Switch {
    pub fn spec(self) -> &'static SwitchSpec {
        SWITCHES
            .iter()
            .find(|s| s.switch == self)
            .expect("every switch has a row in SWITCHES")
    }
}

/// Where the release segtune predicts for came from, for the output's line
/// "predicted for PyTorch X (...)".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionSource {
    /// `--torch`, `--stack` or the config's `segtune.torch`.
    Given,
    /// The `torch` installed for this Python (path) .
    Python(String),
    /// No Python with torch found: the newest release segtune knows.
    Newest,
}

impl fmt::Display for VersionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionSource::Given => f.write_str("as given"),
            VersionSource::Python(p) => write!(f, "the torch installed for {p}"),
            // segtune's own libtorch is this release: nothing is missing,
            // and --torch predicts for another.
            VersionSource::Newest => {
                f.write_str("the release segtune links; --torch X.Y for another")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_from_the_command_line_and_from_python() {
        assert_eq!("1.13".parse::<TorchVersion>(), Ok(TorchVersion::new(1, 13)));
        assert_eq!("2.0".parse::<TorchVersion>(), Ok(TorchVersion::new(2, 0)));
        for bad in ["1.7", "1.14", "2.12", "3.0", "2", "two.one", "2.1.0"] {
            let e = bad.parse::<TorchVersion>().unwrap_err().to_string();
            assert!(e.contains("from 1.8 to 2.11"), "{bad}: {e}");
        }
        let py = |s| TorchVersion::from_python(s);
        assert_eq!(py("2.1.2+cu121\n"), Some(TorchVersion::new(2, 1)));
        assert_eq!(py("1.13.1"), Some(TorchVersion::new(1, 13)));
        assert_eq!(py("2.5.0a0+git1234"), Some(TorchVersion::new(2, 5)));
        assert_eq!(py("nonsense"), None);
        assert!(TorchVersion::new(1, 10) < TorchVersion::new(1, 13));
        assert!(TorchVersion::new(1, 13) < TorchVersion::new(2, 0));
    }

    #[test]
    fn each_switch_is_on_exactly_in_its_releases() {
        let v = |a, b| TorchVersion::new(a, b);
        use Switch::*;
        assert!(v(1, 10).has(SoftmaxKeepsInput));
        assert!(!v(1, 11).has(SoftmaxKeepsInput));
        assert!(v(1, 13).has(ZeroGradKeepsGradients));
        assert!(!v(2, 0).has(ZeroGradKeepsGradients));
        assert!(!v(1, 13).has(ForeachOptimizersOnCuda));
        assert!(v(2, 0).has(ForeachOptimizersOnCuda));
        assert!(!v(2, 0).has(ExpandableSegments));
        assert!(v(2, 1).has(ExpandableSegments));
        for s in SWITCHES {
            assert!(!s.source.is_empty() && !s.what.is_empty(), "{}", s.name);
        }
    }
}
