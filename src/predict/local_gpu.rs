//! The local card: where a command that needs a GPU is given neither
//! `--preset` nor `--vram` (nor a config's `segtune` section with one),
//! `nvidia-smi` names the card it runs on. A card of the table is its
//! preset; another is a `custom` GPU of nvidia-smi's memory and compute
//! capability.

use super::budget::Gpu;
use crate::config::presets;
use crate::error::Result;
use std::sync::OnceLock;

/// The first card nvidia-smi lists.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalGpu {
    /// As nvidia-smi prints it ("NVIDIA GeForce RTX 3060 Laptop GPU").
    pub name: String,
    /// `memory.total`, MiB.
    pub memory_mib: u64,
    /// `compute_cap` ("8.6"); drivers before R510 do not report it.
    pub compute_capability: Option<String>,
    /// The preset of that name, if the table has the card.
    pub preset: Option<&'static str>,
}

impl LocalGpu {
    /// The card's [`Gpu`]: its preset, or a `custom` one of its memory and
    /// compute capability (the default's where nvidia-smi gives none).
    pub fn gpu(&self) -> Result<Gpu> {
        match self.preset {
            Some(p) => Gpu::preset(p),
            None => Gpu::custom(
                self.memory_mib << 20,
                self.compute_capability
                    .as_deref()
                    .unwrap_or(super::budget::DEFAULT_COMPUTE_CAPABILITY),
            ),
        }
    }

    /// The line said on stderr when the card is used.
    pub fn said(&self) -> String {
        match self.preset {
            Some(p) => format!("GPU: {} (preset {p}, found by nvidia-smi)", self.name),
            None => format!(
                "GPU: {} ({} MiB, compute capability {}, found by nvidia-smi; no preset names it: \
                 memory as --vram {}M, rates of the table's card of its compute capability)",
                self.name,
                self.memory_mib,
                self.compute_capability.as_deref().unwrap_or("unknown"),
                self.memory_mib
            ),
        }
    }
}

/// The local card (nvidia-smi asked once per process; its line said on
/// stderr the first time), or `None` where nvidia-smi is missing, fails,
/// takes over 5 s or lists no card.
pub fn detect() -> Option<LocalGpu> {
    static FOUND: OnceLock<Option<LocalGpu>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let found = query();
            if let Some(gpu) = &found {
                eprintln!("{}", gpu.said());
            }
            found
        })
        .clone()
}

/// Asks nvidia-smi, with `compute_cap` first and without it for drivers
/// that do not know the field.
fn query() -> Option<LocalGpu> {
    let with_cc = run(&["name", "memory.total", "compute_cap"]).and_then(|o| parse(&o, true));
    with_cc.or_else(|| run(&["name", "memory.total"]).and_then(|o| parse(&o, false)))
}

/// nvidia-smi's CSV of `fields` for each card, where it answers.
fn run(fields: &[&str]) -> Option<String> {
    let query = format!("--query-gpu={}", fields.join(","));
    crate::worker::machine::nvidia_smi(&[&query, "--format=csv,noheader,nounits"])
}

/// Every card nvidia-smi lists, in its order (empty where it is missing or
/// lists none).
pub fn list() -> Vec<LocalGpu> {
    let parse_all = |csv: String, with_cc: bool| -> Vec<LocalGpu> {
        csv.lines().filter_map(|l| parse(l, with_cc)).collect()
    };
    let with_cc = run(&["name", "memory.total", "compute_cap"])
        .map(|o| parse_all(o, true))
        .filter(|cards| !cards.is_empty());
    with_cc
        .or_else(|| run(&["name", "memory.total"]).map(|o| parse_all(o, false)))
        .unwrap_or_default()
}

/// The first line of nvidia-smi's CSV: `name, memory.total[, compute_cap]`.
pub fn parse(csv: &str, with_cc: bool) -> Option<LocalGpu> {
    let line = csv.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut fields: Vec<&str> = line.split(',').map(str::trim).collect();
    let compute_capability = if with_cc {
        let cc = fields.pop()?;
        cc.parse::<f64>().is_ok().then(|| cc.to_string())
    } else {
        None
    };
    let memory_mib: u64 = fields.pop()?.parse().ok()?;
    let name = fields.join(", ");
    if name.is_empty() || memory_mib == 0 {
        return None;
    }
    Some(LocalGpu {
        preset: presets::resolve(&name),
        name,
        memory_mib,
        compute_capability,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smis_lines_name_the_card() {
        let g = parse("NVIDIA GeForce RTX 3060 Laptop GPU, 6144, 8.6\n", true).unwrap();
        assert_eq!(g.preset, Some("rtx3060-laptop"));
        assert_eq!(g.memory_mib, 6144);
        assert_eq!(g.compute_capability.as_deref(), Some("8.6"));
        assert_eq!(
            g.said(),
            "GPU: NVIDIA GeForce RTX 3060 Laptop GPU (preset rtx3060-laptop, found by nvidia-smi)"
        );
        assert_eq!(g.gpu().unwrap().name, "rtx3060-laptop");
        // Two cards: the first; an old driver: no compute capability.
        let g = parse("Tesla T4, 15360\nTesla T4, 15360\n", false).unwrap();
        assert_eq!((g.preset, g.compute_capability), (Some("t4"), None));
        // A card the table lacks: custom, of its memory and capability.
        let g = parse("NVIDIA RTX A2000 12GB, 12282, 8.6", true).unwrap();
        assert_eq!(g.preset, None);
        let gpu = g.gpu().unwrap();
        assert_eq!((gpu.name.as_str(), gpu.vram_bytes), ("custom", 12282 << 20));
        assert!(g.said().contains("no preset names it"), "{}", g.said());
        for bad in [
            "",
            "\n",
            "NVIDIA A10",
            "NVIDIA A10, lots, 8.6",
            ", 100, 8.6",
        ] {
            assert_eq!(parse(bad, true), None, "{bad:?}");
        }
    }
}
