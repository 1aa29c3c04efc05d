//! `segtune presets`: the shipped GPU presets as a table.

use super::table;
use crate::predict::Gpu;

/// The presets as a table.
pub fn presets(gpus: &[Gpu]) -> String {
    let rows = gpus.iter().map(|g| {
        [
            g.name.clone(),
            g.description.clone().unwrap_or_default(),
            format!("{} MiB", g.vram_bytes >> 20),
            g.compute_capability.clone(),
            if g.bf16 { "yes" } else { "no" }.to_string(),
        ]
    });
    let mut out = table(
        ["preset", "GPU", "VRAM", "compute capability", "bf16"],
        rows,
    );
    out.push('\n');
    out
}
