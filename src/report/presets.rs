//! `segtune presets`: the shipped GPU presets as a table, or (`--json`)
//! every field of each.

use super::table;
use crate::config::{dump, presets, Dict, Value};
use crate::predict::Gpu;

/// The presets as a table.
pub fn presets(gpus: &[Gpu]) -> String {
    let rate = |t: f64| {
        if t == 0.0 {
            "-".to_string()
        } else if t < 1.0 {
            format!("{t:.2}")
        } else {
            format!("{t:.1}")
        }
    };
    let rows = gpus.iter().map(|g| {
        [
            g.name.clone(),
            g.description.clone().unwrap_or_default(),
            format!("{} MiB", g.vram_bytes >> 20),
            g.compute_capability.clone(),
            g.sms.to_string(),
            rate(g.fp32_tflops),
            rate(g.fp16_tflops) + if g.tensor_cores { "" } else { "*" },
            rate(g.bf16_tflops),
            rate(g.tf32_tflops),
            format!("{:.0}", g.bandwidth_gbs),
            format!(
                "{} MiB",
                (g.l2_bytes as f64 / (1u64 << 20) as f64 * 100.0).round() / 100.0
            ),
            g.link.clone(),
        ]
    });
    let mut out = table(
        [
            "preset", "GPU", "VRAM", "cc", "SMs", "FP32", "FP16", "BF16", "TF32", "GB/s", "L2",
            "link",
        ],
        rows,
    );
    out.push_str(
        "\nTFLOPS, dense; FP16/BF16/TF32 on tensor cores with FP32 accumulate (* no tensor \
         cores: the native FP16 rate; -: none). --preset takes the slug or the name \
         nvidia-smi prints; `segtune presets --json` has every field and docs/gpus.md \
         their sources.\n",
    );
    out
}

/// Every field of every preset, as a JSON array.
pub fn presets_json(presets: &[Dict]) -> String {
    let ordered = presets.iter().map(|p| {
        let mut d = Dict::new();
        for k in presets::CARD_FIELDS.iter().chain(presets::OVERHEAD_FIELDS) {
            if let Some(v) = p.get(*k) {
                d.insert((*k).to_string(), v.clone());
            }
        }
        for (k, v) in p {
            if !d.contains_key(k) {
                d.insert(k.clone(), v.clone());
            }
        }
        Value::Dict(d)
    });
    dump::to_json(&Value::List(ordered.collect()))
}
