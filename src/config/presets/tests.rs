use super::*;
use rhai::Dynamic;

const FIELDS: &[&str] = CARD_FIELDS;

fn num(p: &Dict, k: &str) -> f64 {
    p.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn text<'a>(p: &'a Dict, k: &str) -> &'a str {
    p.get(k).and_then(Value::as_str).unwrap_or_default()
}

#[test]
fn every_file_in_presets_is_embedded() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|f| f.strip_suffix(".rhai").map(str::to_string))
        .collect();
    files.sort();
    let mut embedded: Vec<String> = names().into_iter().map(str::to_string).collect();
    embedded.sort();
    assert_eq!(files, embedded);
    assert!(names().len() >= 45, "{}", names().len());
}

#[test]
fn every_preset_loads_with_every_field() {
    for name in names() {
        let p = load(name).unwrap();
        for field in FIELDS {
            assert!(p.contains_key(*field), "{name} lacks {field}");
        }
        assert_eq!(text(&p, "preset"), name);
        let smi = p["nvidia_smi_names"].as_seq().unwrap();
        assert!(
            !smi.is_empty() && smi.iter().all(|s| s.as_str().is_some()),
            "{name}"
        );
        assert_eq!(card_names(name).len(), 1 + smi.len(), "{name}");
        for k in FIELDS.iter().filter(|k| k.ends_with("_tflops")) {
            assert!(num(&p, k) >= 0.0, "{name} {k}");
        }
        for k in [
            "vram_mib",
            "sms",
            "boost_clock_mhz",
            "fp32_tflops",
            "fp16_tflops",
            "memory_bandwidth_gbs",
            "l2_kib",
            "link_gbs",
        ] {
            assert!(num(&p, k) > 0.0, "{name} {k}");
        }
        assert!(
            ["desktop", "laptop", "datacenter"].contains(&text(&p, "form")),
            "{name}"
        );
        let link = text(&p, "link");
        assert!(
            link.starts_with("PCIe ") || link.starts_with("NVLink "),
            "{name}: {link}"
        );
        // A laptop is named as one.
        assert_eq!(
            text(&p, "form") == "laptop",
            text(&p, "name").ends_with("Laptop GPU"),
            "{name}"
        );
    }
    assert_eq!(
        vram_bytes(&load("rtx3050ti").unwrap()),
        Some(4096 * 1024 * 1024)
    );
    assert!(load("gtx9999").is_err());
}

#[test]
fn compute_capability_architecture_and_rates_agree() {
    for name in names() {
        let p = load(name).unwrap();
        let cc = text(&p, "compute_capability");
        let major: u32 = cc.split('.').next().unwrap().parse().unwrap();
        let arch = text(&p, "architecture");
        let want = match cc {
            "6.0" | "6.1" => "Pascal",
            "7.0" => "Volta",
            "7.5" => "Turing",
            "8.0" | "8.6" => "Ampere",
            "8.9" => "Ada",
            "9.0" => "Hopper",
            "10.0" | "12.0" => "Blackwell",
            other => panic!("{name}: compute capability {other}"),
        };
        assert_eq!(arch, want, "{name}");
        assert_eq!(p["bf16"].truthy(), major >= 8, "{name}");
        let tensor = p["tensor_cores"].truthy();
        assert_eq!(
            tensor,
            major >= 7 && !["gtx1650", "gtx1660ti"].contains(&name),
            "{name}"
        );
        if major < 8 {
            assert_eq!(num(&p, "bf16_tflops"), 0.0, "{name}: no bf16 before 8.0");
            assert_eq!(num(&p, "tf32_tflops"), 0.0, "{name}: no TF32 before 8.0");
        } else {
            assert!(num(&p, "tf32_tflops") >= num(&p, "fp32_tflops"), "{name}");
            assert_eq!(num(&p, "bf16_tflops"), num(&p, "fp16_tflops"), "{name}");
        }
        let (fp32, fp16) = (num(&p, "fp32_tflops"), num(&p, "fp16_tflops"));
        match (arch, tensor) {
            // GP102/GP104/GP106: FP16 at 1/64 of FP32; GP100: twice it.
            ("Pascal", _) if cc == "6.1" => assert!((fp16 * 64.0 - fp32).abs() < 0.1, "{name}"),
            ("Pascal", _) => assert!((fp16 - 2.0 * fp32).abs() < 0.1, "{name}"),
            // TU116/TU117: FP16 units at twice FP32, no tensor cores.
            (_, false) => assert!((fp16 - 2.0 * fp32).abs() < 0.05, "{name}"),
            // Tensor cores with FP32 accumulate: at least twice FP32.
            (_, true) => assert!(fp16 >= 1.99 * fp32, "{name}: {fp16} vs {fp32}"),
        }
    }
}

#[test]
fn the_calibrated_presets_keep_their_memory_figures() {
    // Zoo calibration rests on these: vram_mib, compute capability, CUDA
    // context (MiB) and cuBLAS workspace (KiB).
    for (name, vram, cc, context, cublas) in [
        ("rtx3050ti-laptop", 4096, "8.6", 310, 8320),
        ("rtx2070", 8192, "7.5", 290, 8320),
        ("rtx3060", 12288, "8.6", 310, 8320),
        ("rtx3090", 24576, "8.6", 310, 8320),
        ("rtx4090", 24564, "8.9", 330, 8320),
        ("h200", 143771, "9.0", 520, 32768),
    ] {
        let p = load(name).unwrap();
        assert_eq!(p["vram_mib"].as_i64(), Some(vram), "{name}");
        assert_eq!(text(&p, "compute_capability"), cc, "{name}");
        assert_eq!(p["cuda_context_mib"].as_i64(), Some(context), "{name}");
        assert_eq!(p["cublas_workspace_kib"].as_i64(), Some(cublas), "{name}");
    }
    // The others leave them to the compute capability's typical figures.
    for name in names() {
        let p = load(name).unwrap();
        let calibrated = p.contains_key("cuda_context_mib");
        assert_eq!(calibrated, p.contains_key("cublas_workspace_kib"), "{name}");
    }
}

#[test]
fn names_resolve_case_and_spaces_aside() {
    for (text, want) in [
        ("rtx3060", "rtx3060"),
        ("rtx3050ti", "rtx3050ti-laptop"),
        ("3050ti", "rtx3050ti-laptop"),
        ("rtx3050ti-laptop.rhai", "rtx3050ti-laptop"),
        ("NVIDIA GeForce RTX 3060 Laptop GPU", "rtx3060-laptop"),
        ("GeForce RTX 3060 Laptop GPU", "rtx3060-laptop"),
        ("nvidia   geforce rtx 3060 LAPTOP gpu ", "rtx3060-laptop"),
        ("Tesla T4", "t4"),
        ("GeForce RTX 4090", "rtx4090"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA A10", "a10"),
        ("a10", "a10"),
        ("RTX 3080", "rtx3080"),
        ("rtx-4070-laptop", "rtx4070-laptop"),
        ("NVIDIA TITAN RTX", "titan-rtx"),
    ] {
        assert_eq!(resolve(text), Some(want), "{text}");
    }
    for miss in ["gtx9999", "", "NVIDIA", "GeForce"] {
        assert_eq!(resolve(miss), None, "{miss}");
    }
}

#[test]
fn no_two_presets_share_a_name() {
    let mut seen: std::collections::HashMap<&str, &str> = Default::default();
    for (slug, normal, _) in keys() {
        if let Some(other) = seen.insert(normal.as_str(), slug) {
            assert_eq!(other, *slug, "`{normal}` names both {other} and {slug}");
        }
    }
    let mut compacts: std::collections::HashMap<&str, &str> = Default::default();
    for (slug, _, short) in keys() {
        if let Some(other) = compacts.insert(short.as_str(), slug) {
            assert_eq!(other, *slug, "`{short}` names both {other} and {slug}");
        }
    }
}

#[test]
fn a_miss_suggests_the_closest_card() {
    assert_eq!(
        suggestion("GeForce RTX 3060 Laptp"),
        Some(("rtx3060-laptop", "NVIDIA GeForce RTX 3060 Laptop GPU"))
    );
    assert_eq!(suggestion("rtx4090x").map(|s| s.0), Some("rtx4090"));
    assert_eq!(suggestion("Tesla T5").map(|s| s.0), Some("t4"));
    let err = load("rtx 3060 laptopp").unwrap_err().to_string();
    assert!(
        err.contains("unknown GPU preset `rtx 3060 laptopp`"),
        "{err}"
    );
    assert!(
        err.contains("did you mean `rtx3060-laptop` (NVIDIA GeForce RTX 3060 Laptop GPU)?"),
        "{err}"
    );
    assert!(err.contains("segtune presets"), "{err}");
    assert!(!err.contains("rtx5090"), "no list of every card: {err}");
    assert_eq!(levenshtein("kitten", "sitting"), 3);
    assert_eq!(levenshtein("", "abc"), 3);
}

#[test]
fn dynamic_unit_is_none() {
    assert_eq!(
        super::super::eval::to_value(&Dynamic::UNIT).unwrap(),
        Value::None
    );
}
