//! The GPU a prediction or a search is for: its figures (a shipped preset or
//! a bare `--vram`) and the budget a training step may use on it (VRAM less
//! the margin, of which the CUDA context takes its share first).

use super::kernels::cudnn_speed::GpuMath;
use crate::config::{presets, Dict, Value};
use crate::error::{Error, Result};
use crate::kinds::GpuChoice;

/// The compute capability of a `--vram` budget that names none (Ampere's
/// consumer cards: the RTX 30 series and the A10 are 8.6).
pub const DEFAULT_COMPUTE_CAPABILITY: &str = "8.6";

/// A GPU's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// The preset's canonical name (`rtx3050ti-laptop`), or `custom`.
    pub name: String,
    /// The card's full name, for presets.
    pub description: Option<String>,
    /// Total device memory (nvidia-smi's total).
    pub vram_bytes: u64,
    /// Compute capability, e.g. "8.6" (decides the CUDA context, the cuBLAS workspace and bf16).
    pub compute_capability: String,
    pub bf16: bool,
    pub fp32_tflops: f64,
    pub fp16_tflops: f64,
    pub bf16_tflops: f64,
    /// TF32 tensor cores (0: none); fp32 convolutions use them where
    /// `torch.backends.cudnn.allow_tf32` (True by default).
    pub tf32_tflops: f64,
    /// Streaming multiprocessors.
    pub sms: i64,
    pub bandwidth_gbs: f64,
    /// What the device holds besides the tensors: the preset's, or the
    /// compute capability's typical figures for a card known by `--vram`.
    pub overheads: DeviceOverheads,
    /// The architecture: "Pascal", "Volta", "Turing", "Ampere", "Ada",
    /// "Hopper" or "Blackwell" (a `custom` card: its representative's).
    pub architecture: String,
    /// "desktop", "laptop" or "datacenter" for a preset; "custom" for a
    /// card known only by `--vram`.
    pub form: String,
    /// The boost clock in MHz the TFLOPS figures are at (a laptop's: the
    /// reference one; its maker's power limit sets the real one).
    pub boost_clock_mhz: f64,
    /// The L2 cache, bytes.
    pub l2_bytes: u64,
    /// The link the GPUs all-reduce over: "PCIe 4.0 x16", "NVLink 3 (600 GB/s)", ...
    pub link: String,
    /// That link's bandwidth in one direction, GB/s (PCIe 4.0 x16: 31.5;
    /// NVLink: the per-direction aggregate, A100 SXM 300).
    pub link_gbs: f64,
    /// Whether the card has tensor cores (compute capability 7.0 and newer,
    /// but not the GTX 16 series); without them `fp16_tflops` is the native
    /// half-precision rate (Pascal: 1/64 of FP32, or twice it on GP100).
    pub tensor_cores: bool,
}

/// The card whose rates a `custom` GPU (known only by `--vram` and its
/// compute capability) takes: the commonest card of that compute
/// capability in the table, or of the nearest one below.
const REPRESENTATIVES: &[((u32, u32), &str)] = &[
    ((6, 0), "p100-pcie-16gb"),
    ((6, 1), "gtx1080ti"),
    ((7, 0), "v100-sxm2-16gb"),
    ((7, 5), "rtx2070"),
    ((8, 0), "a100-sxm4-40gb"),
    ((8, 6), "rtx3060"),
    ((8, 9), "rtx4070"),
    ((9, 0), "h100-sxm"),
    ((10, 0), "b200"),
    ((12, 0), "rtx5080"),
];

/// The major version of a compute capability ("8.6": 8; unreadable: 0).
fn major_of(compute_capability: &str) -> u32 {
    compute_capability
        .split('.')
        .next()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(0)
}

/// The preset whose rates a card of `compute_capability` takes (see
/// [`REPRESENTATIVES`]; an unreadable capability: the default's).
pub fn representative_preset(compute_capability: &str) -> &'static str {
    let mut parts = compute_capability.trim().split('.');
    let number = |p: Option<&str>| p.and_then(|m| m.trim().parse::<u32>().ok());
    let Some(major) = number(parts.next()) else {
        return "rtx3060";
    };
    let cc = (major, number(parts.next()).unwrap_or(0));
    REPRESENTATIVES
        .iter()
        .rev()
        .find(|(c, _)| *c <= cc)
        .map_or(REPRESENTATIVES[0].1, |(_, p)| p)
}

/// Device memory a training process holds besides its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceOverheads {
    /// The CUDA context (driver, lazily loaded kernels): nvidia-smi shows
    /// it, the caching allocator never reports it.
    pub cuda_context_bytes: u64,
    /// cuBLAS's workspace per handle, taken from the caching allocator
    /// (PyTorch >= 1.13).
    pub cublas_workspace_bytes: u64,
}

impl DeviceOverheads {
    /// The fallback for a card known only by its compute capability (a
    /// preset states its own): cuBLAS's workspace is
    /// `CUBLAS_WORKSPACE_CONFIG`'s default, `:4096:2:16:8` (8 MiB + 128
    /// KiB), and `:4096:8` (32 MiB) on Hopper (sm_90); the CUDA context is
    /// an assumption per architecture, to be calibrated by
    /// `scripts/gpu-validate.sh` on real cards.
    pub fn of_compute_capability(compute_capability: &str) -> DeviceOverheads {
        let hopper = compute_capability.starts_with('9');
        let context_mib: u64 = match compute_capability {
            _ if hopper => 520,
            "8.9" => 330,
            cc if cc.starts_with('8') => 310,
            _ => 290,
        };
        DeviceOverheads {
            cuda_context_bytes: context_mib << 20,
            cublas_workspace_bytes: if hopper {
                4096 * 1024 * 8
            } else {
                4096 * 1024 * 2 + 16 * 1024 * 8
            },
        }
    }

    /// A preset's `cuda_context_mib` and `cublas_workspace_kib`, each
    /// falling back to [`DeviceOverheads::of_compute_capability`].
    fn of_preset(preset: &Dict, compute_capability: &str) -> DeviceOverheads {
        let typical = DeviceOverheads::of_compute_capability(compute_capability);
        let bytes = |key: &str, unit: u64| {
            preset
                .get(key)
                .and_then(Value::as_i64)
                .map(|n| n.max(0) as u64 * unit)
        };
        DeviceOverheads {
            cuda_context_bytes: bytes("cuda_context_mib", 1 << 20)
                .unwrap_or(typical.cuda_context_bytes),
            cublas_workspace_bytes: bytes("cublas_workspace_kib", 1 << 10)
                .unwrap_or(typical.cublas_workspace_bytes),
        }
    }
}

impl Gpu {
    /// A shipped preset (see `segtune presets`).
    pub fn preset(name: &str) -> Result<Gpu> {
        let p = presets::load(name)?;
        let num =
            |d: &Dict, k: &str, default: f64| d.get(k).and_then(Value::as_f64).unwrap_or(default);
        let text = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_string);
        let compute_capability =
            text("compute_capability").unwrap_or_else(|| DEFAULT_COMPUTE_CAPABILITY.into());
        let typical = GpuMath::of_compute_capability(&compute_capability);
        Ok(Gpu {
            name: text("preset").unwrap_or_else(|| name.to_string()),
            description: text("name"),
            vram_bytes: presets::vram_bytes(&p)
                .ok_or_else(|| Error::Input(format!("GPU preset `{name}` has no vram_mib")))?,
            bf16: p.get("bf16").is_some_and(Value::truthy),
            fp32_tflops: num(&p, "fp32_tflops", 10.0),
            fp16_tflops: num(&p, "fp16_tflops", 40.0),
            bf16_tflops: num(&p, "bf16_tflops", 40.0),
            tf32_tflops: num(&p, "tf32_tflops", typical.tf32),
            sms: p.get("sms").and_then(Value::as_i64).unwrap_or(typical.sms),
            bandwidth_gbs: num(&p, "memory_bandwidth_gbs", 500.0),
            overheads: DeviceOverheads::of_preset(&p, &compute_capability),
            architecture: text("architecture").unwrap_or_default(),
            form: text("form").unwrap_or_else(|| "desktop".into()),
            boost_clock_mhz: num(&p, "boost_clock_mhz", 0.0),
            l2_bytes: (num(&p, "l2_kib", 0.0).max(0.0) as u64) << 10,
            link: text("link").unwrap_or_else(|| "PCIe 4.0 x16".into()),
            link_gbs: num(&p, "link_gbs", 31.5),
            tensor_cores: p
                .get("tensor_cores")
                .map_or(major_of(&compute_capability) >= 7, Value::truthy),
            compute_capability,
        })
    }

    /// A GPU known only by its memory (`4G`, `4096MiB`, ...) and compute
    /// capability: its memory figures are the compute capability's typical
    /// ones, its rates (for speed and ranking) those of the table's
    /// representative card of that capability ([`representative_preset`]),
    /// which its `description` names.
    pub fn custom(vram_bytes: u64, compute_capability: &str) -> Result<Gpu> {
        let bf16 = compute_capability
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok())
            .is_some_and(|major| major >= 8);
        let card = Gpu::preset(representative_preset(compute_capability))?;
        let card_name = card
            .description
            .clone()
            .unwrap_or_else(|| card.name.clone());
        let article = if card_name.starts_with(['A', 'E', 'I', 'O', 'U'])
            || card_name.starts_with("NVIDIA")
        {
            "an"
        } else {
            "a"
        };
        Ok(Gpu {
            name: "custom".into(),
            description: Some(format!(
                "rates of {article} {card_name} (compute capability {})",
                card.compute_capability
            )),
            vram_bytes,
            compute_capability: compute_capability.to_string(),
            bf16,
            bf16_tflops: if bf16 { card.bf16_tflops } else { 0.0 },
            overheads: DeviceOverheads::of_compute_capability(compute_capability),
            form: "custom".into(),
            ..card
        })
    }

    /// The preset if one is named, else the bare `vram`.
    pub fn choose(choice: &GpuChoice) -> Result<Gpu> {
        let compute_capability = choice.compute_capability.as_deref();
        match (choice.preset.as_deref(), &choice.vram) {
            // A preset is a card: its compute capability is its own, and
            // one given beside it would be silently ignored.
            (Some(name), _) if compute_capability.is_some() => {
                let own = Gpu::preset(name)?.compute_capability;
                Err(Error::Input(format!(
                    "--compute-capability {} with --preset {name}: the preset is a card of \
                     compute capability {own}; --compute-capability describes a --vram GPU \
                     (give --vram SIZE --compute-capability X.Y for another card)",
                    compute_capability.unwrap_or_default()
                )))
            }
            (Some(name), _) => Gpu::preset(name),
            (None, Some(v)) => Gpu::custom(
                v.bytes(),
                compute_capability.unwrap_or(DEFAULT_COMPUTE_CAPABILITY),
            ),
            // Neither: the local card, where nvidia-smi names one.
            (None, None) => match (compute_capability, super::local_gpu::detect()) {
                (None, Some(found)) => found.gpu(),
                _ => Err(Error::Input(
                    "give --vram SIZE or --preset NAME (or a `segtune` section with one of them in the config); nvidia-smi found no GPU here".into(),
                )),
            },
        }
    }

    /// The rates cuDNN's algorithm choice depends on: the card's own where
    /// known; a card known only by its compute capability takes a typical
    /// card's (`GpuMath::of_compute_capability`), its ratios being what matter.
    pub fn conv_math(&self) -> GpuMath {
        let custom = self.name == "custom";
        GpuMath::of_card(custom, &self.compute_capability, self.rates(), self.sms)
    }

    /// `[fp32, tf32, fp16, bf16]` TFLOPS.
    fn rates(&self) -> [f64; 4] {
        [
            self.fp32_tflops,
            self.tf32_tflops,
            self.fp16_tflops,
            self.bf16_tflops,
        ]
    }

    /// Every shipped preset.
    pub fn presets() -> Result<Vec<Gpu>> {
        presets::names().into_iter().map(Gpu::preset).collect()
    }
}

/// The memory budget of one GPU for a training step.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Budget {
    pub gpu: String,
    /// The card's full name, for a preset (`GeForce RTX 3050 Ti Laptop GPU`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_description: Option<String>,
    pub vram_bytes: u64,
    pub compute_capability: String,
    pub bf16: bool,
    pub fp16_tflops: f64,
    pub fp32_tflops: f64,
    pub bf16_tflops: f64,
    /// TF32 tensor cores (0: none).
    #[serde(default)]
    pub tf32_tflops: f64,
    /// Streaming multiprocessors (0: a typical card's for the compute capability).
    #[serde(default)]
    pub sms: i64,
    pub bandwidth_gbs: f64,
    pub margin: f64,
    pub cuda_context_bytes: u64,
    /// cuBLAS's workspace per handle (see [`DeviceOverheads`]); 0 in
    /// searches saved before it was recorded.
    #[serde(default)]
    pub cublas_workspace_bytes: u64,
    /// VRAM x (1 - margin): what reserved memory + context may use.
    pub usable_bytes: u64,
    /// The link data-parallel GPUs all-reduce over, one direction, GB/s
    /// (the step time's communication; 0 in searches saved before it).
    #[serde(default)]
    pub link_gbs: f64,
    /// Tensor cores (Volta and newer).
    #[serde(default)]
    pub tensor_cores: bool,
    /// The L2 cache (the step time's memory-bound kernels that fit in it).
    #[serde(default)]
    pub l2_bytes: u64,
}

impl Budget {
    /// Whether half precision runs faster than fp32 on this card: tensor
    /// cores (compute capability 7.0 and newer) or the P100's double-rate
    /// fp16 (6.0). Pascal's consumer chips (6.1) run fp16 at 1/64 the rate.
    pub fn fast_half(&self) -> bool {
        let mut parts = self.compute_capability.split('.');
        let major: u32 = parts
            .next()
            .and_then(|m| m.trim().parse().ok())
            .unwrap_or(0);
        let minor: u32 = parts
            .next()
            .and_then(|m| m.trim().parse().ok())
            .unwrap_or(0);
        major >= 7 || (major, minor) == (6, 0)
    }

    /// The rates cuDNN's algorithm choice depends on (see [`Gpu::conv_math`]).
    pub fn conv_math(&self) -> GpuMath {
        let custom = self.gpu == "custom";
        GpuMath::of_card(custom, &self.compute_capability, self.rates(), self.sms)
    }

    /// `[fp32, tf32, fp16, bf16]` TFLOPS.
    fn rates(&self) -> [f64; 4] {
        [
            self.fp32_tflops,
            self.tf32_tflops,
            self.fp16_tflops,
            self.bf16_tflops,
        ]
    }

    /// `gpu` with a fraction `margin` of its VRAM kept free.
    pub fn new(gpu: &Gpu, margin: f64) -> Result<Budget> {
        if !(0.0..0.9).contains(&margin) {
            return Err(Error::Input(format!(
                "--margin {margin} must be in [0, 0.9)"
            )));
        }
        let context = gpu.overheads.cuda_context_bytes;
        let usable = (gpu.vram_bytes as f64 * (1.0 - margin)) as u64;
        if usable <= context {
            return Err(Error::Input(format!(
                "the budget of {:.2} GiB leaves nothing after the CUDA context ({:.2} GiB) and the {:.0}% margin",
                gpu.vram_bytes as f64 / (1u64 << 30) as f64,
                context as f64 / (1u64 << 30) as f64,
                margin * 100.0
            )));
        }
        Ok(Budget {
            gpu: gpu.name.clone(),
            gpu_description: gpu.description.clone(),
            vram_bytes: gpu.vram_bytes,
            compute_capability: gpu.compute_capability.clone(),
            bf16: gpu.bf16,
            fp16_tflops: gpu.fp16_tflops,
            fp32_tflops: gpu.fp32_tflops,
            bf16_tflops: gpu.bf16_tflops,
            tf32_tflops: gpu.tf32_tflops,
            sms: gpu.sms,
            bandwidth_gbs: gpu.bandwidth_gbs,
            margin,
            cuda_context_bytes: context,
            cublas_workspace_bytes: gpu.overheads.cublas_workspace_bytes,
            usable_bytes: usable,
            link_gbs: gpu.link_gbs,
            tensor_cores: gpu.tensor_cores,
            l2_bytes: gpu.l2_bytes,
        })
    }

    /// `gpu (V GiB, margin M%)`, as the emitted config's header names the
    /// budget.
    pub fn card_and_margin(&self) -> String {
        format!(
            "{} ({:.2} GiB, margin {:.0}%)",
            self.gpu,
            self.vram_bytes as f64 / (1u64 << 30) as f64,
            self.margin * 100.0
        )
    }

    /// What the caching allocator may reserve: the usable budget less the context.
    pub fn allocator_capacity(&self) -> u64 {
        self.usable_bytes.saturating_sub(self.cuda_context_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_presets_overheads_are_its_own_and_a_bare_vram_takes_its_architectures() {
        // Each shipped preset states both figures; today they equal the
        // fallback of their architecture (what predictions used before).
        for gpu in Gpu::presets().unwrap() {
            assert_eq!(
                gpu.overheads,
                DeviceOverheads::of_compute_capability(&gpu.compute_capability),
                "{}",
                gpu.name
            );
        }
        let h200 = Gpu::preset("h200").unwrap();
        assert_eq!(h200.overheads.cuda_context_bytes, 520 << 20);
        assert_eq!(h200.overheads.cublas_workspace_bytes, 32 << 20);
        let turing = Gpu::custom(8 << 30, "7.5").unwrap();
        assert_eq!(turing.overheads.cuda_context_bytes, 290 << 20);
        assert_eq!(
            turing.overheads.cublas_workspace_bytes,
            (8 << 20) + (128 << 10)
        );
        let budget = Budget::new(&Gpu::preset("rtx3050ti").unwrap(), 0.0).unwrap();
        assert_eq!(budget.cuda_context_bytes, 310 << 20);
        assert_eq!(budget.cublas_workspace_bytes, (8 << 20) + (128 << 10));
    }

    #[test]
    fn a_budget_that_leaves_nothing_is_refused() {
        let gpu = Gpu::custom(200 << 20, "8.6").unwrap();
        let err = Budget::new(&gpu, 0.05).unwrap_err().to_string();
        assert!(
            err.contains("leaves nothing after the CUDA context"),
            "{err}"
        );
        assert!(Budget::new(&Gpu::preset("rtx3050ti").unwrap(), 0.95).is_err());
    }

    #[test]
    fn a_custom_card_takes_the_rates_of_its_compute_capabilitys_card() {
        for (cc, card) in [
            ("6.0", "p100-pcie-16gb"),
            ("6.1", "gtx1080ti"),
            ("7.0", "v100-sxm2-16gb"),
            ("7.2", "v100-sxm2-16gb"),
            ("7.5", "rtx2070"),
            ("8.0", "a100-sxm4-40gb"),
            ("8.6", "rtx3060"),
            ("8.7", "rtx3060"),
            ("8.9", "rtx4070"),
            ("9.0", "h100-sxm"),
            ("10.0", "b200"),
            ("12.0", "rtx5080"),
            ("5.2", "p100-pcie-16gb"),
            ("x", "rtx3060"),
        ] {
            assert_eq!(representative_preset(cc), card, "{cc}");
        }
        let gpu = Gpu::custom(6 << 30, "8.6").unwrap();
        let rtx3060 = Gpu::preset("rtx3060").unwrap();
        assert_eq!(gpu.name, "custom");
        assert_eq!(gpu.form, "custom");
        assert_eq!(gpu.vram_bytes, 6 << 30);
        assert_eq!(
            gpu.description.as_deref(),
            Some("rates of a GeForce RTX 3060 (compute capability 8.6)")
        );
        assert_eq!(
            (
                gpu.fp32_tflops,
                gpu.fp16_tflops,
                gpu.bf16_tflops,
                gpu.bandwidth_gbs
            ),
            (12.74, 25.5, 25.5, 360.0)
        );
        assert_eq!((gpu.architecture.as_str(), gpu.link_gbs), ("Ampere", 31.5));
        assert_eq!(gpu.l2_bytes, rtx3060.l2_bytes);
        // Memory figures stay the compute capability's, and cuDNN's choice
        // a typical card's (as before the table).
        assert_eq!(gpu.overheads, DeviceOverheads::of_compute_capability("8.6"));
        assert_eq!(gpu.conv_math(), GpuMath::of_compute_capability("8.6"));
        let budget = Budget::new(&gpu, 0.05).unwrap();
        assert_eq!(budget.conv_math(), GpuMath::of_compute_capability("8.6"));
        let volta = Gpu::custom(16 << 30, "7.0").unwrap();
        assert_eq!(
            volta.description.as_deref(),
            Some("rates of a Tesla V100 SXM2 16 GB (compute capability 7.0)")
        );
        assert!(!volta.bf16 && volta.bf16_tflops == 0.0 && volta.tensor_cores);
        let ampere = Gpu::custom(40 << 30, "8.0").unwrap();
        assert!(ampere
            .description
            .unwrap()
            .starts_with("rates of an NVIDIA A100"));
        // A Pascal card's FP16 is its native rate, without tensor cores.
        let pascal = Gpu::custom(11 << 30, "6.1").unwrap();
        assert!(!pascal.tensor_cores && pascal.fp16_tflops < 1.0);
    }

    #[test]
    fn presets_carry_the_step_time_models_figures() {
        let a100 = Gpu::preset("NVIDIA A100-SXM4-80GB").unwrap();
        assert_eq!(a100.name, "a100-sxm4-80gb");
        assert_eq!(a100.description.as_deref(), Some("NVIDIA A100 SXM4 80 GB"));
        assert_eq!(a100.l2_bytes, 40 << 20);
        assert_eq!(
            (a100.link.as_str(), a100.link_gbs),
            ("NVLink 3 (600 GB/s)", 300.0)
        );
        assert_eq!(
            (a100.form.as_str(), a100.boost_clock_mhz),
            ("datacenter", 1410.0)
        );
        let laptop = Gpu::preset("nvidia geforce rtx 3060 laptop gpu").unwrap();
        assert_eq!(
            (laptop.name.as_str(), laptop.form.as_str()),
            ("rtx3060-laptop", "laptop")
        );
        let t4 = Gpu::preset("Tesla T4").unwrap();
        assert_eq!(
            (t4.architecture.as_str(), t4.tensor_cores),
            ("Turing", true)
        );
        assert_eq!(t4.vram_bytes, 15360 << 20);
        let err = Gpu::preset("RTX 3060 Laptp").unwrap_err().to_string();
        assert!(err.contains("did you mean `rtx3060-laptop`"), "{err}");
    }

    #[test]
    fn presets_name_the_card() {
        let gpu = Gpu::preset("rtx3050ti").unwrap();
        assert_eq!(gpu.name, "rtx3050ti-laptop");
        assert_eq!(gpu.vram_bytes, 4 << 30);
        assert!(gpu.bf16);
    }
}
