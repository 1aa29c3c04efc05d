//! Helpers shared by the integration tests: where `../shared` is, and the
//! rule that a test needing it fails under CI and is skipped (loudly) elsewhere.

#![allow(dead_code)]

pub mod scale;

use std::path::PathBuf;

/// `../shared` relative to the crate, or `SEGTUNE_SHARED` if set.
pub fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("SEGTUNE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    dir.join("mmseg-configs/configs").is_dir().then_some(dir)
}

/// The shared data directory, or `None` after saying why the test is
/// skipped; under `CI=true` a missing directory fails the test.
pub fn require_shared(test: &str) -> Option<PathBuf> {
    match shared_dir() {
        Some(d) => Some(d),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: ../shared/mmseg-configs is missing, and CI=true requires it")
        }
        None => {
            eprintln!("SKIPPED {test}: ../shared/mmseg-configs not found (set SEGTUNE_SHARED)");
            None
        }
    }
}

/// The interpreter that `var` names (scripts/test-env.sh sets it), or
/// `None` after saying why the test is skipped; under `CI=true` a missing
/// one fails the test.
pub fn require_python(test: &str, var: &str) -> Option<PathBuf> {
    let found = std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    if found.is_none() {
        let why = format!("{var} is not set or names no file; scripts/test-env.sh sets it");
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{test}: {why}");
        }
        eprintln!("SKIPPED {test}: {why}");
    }
    found
}

/// The README's example config (a Rhai recipe importing the 3050 Ti preset).
pub fn readme_example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs/examples/segformer_mit-b0_8xb2-160k_ade20k-512x512.rhai")
}

/// Every `.py` config under `dir`, sorted.
pub fn configs_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("readable corpus dir") {
            let p = entry.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "py") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A table of `tests/fixtures/`: `#` comment lines, a header row, then
/// tab-separated rows (blank lines skipped).
pub struct Fixture {
    text: String,
    header: Vec<String>,
}

impl Fixture {
    pub fn read(name: &str) -> Fixture {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let header = Self::lines(&text)
            .next()
            .unwrap_or_else(|| panic!("{name} has no header row"))
            .split('\t')
            .map(str::to_string)
            .collect();
        Fixture { text, header }
    }

    fn lines(text: &str) -> impl Iterator<Item = &str> {
        text.lines().filter(|l| !l.starts_with('#'))
    }

    /// The index of column `name`.
    pub fn col(&self, name: &str) -> usize {
        self.header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("column {name}"))
    }

    /// The rows after the header, each split into its fields.
    pub fn rows(&self) -> impl Iterator<Item = Vec<&str>> {
        Self::lines(&self.text)
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.split('\t').collect())
    }
}

/// Writes `text` to `dir/name`; returns the path.
pub fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// `segtune search CONFIG --preset rtx3050ti --device cpu --quiet --out OUT`
/// (predicted mode), to which a test adds its own arguments.
pub fn search_command(config: &std::path::Path, out: &std::path::Path) -> assert_cmd::Command {
    search_command_on(config, out, RTX3050TI)
}

/// The budget arguments of a 3050 Ti laptop.
pub const RTX3050TI: &[&str] = &["--preset", "rtx3050ti"];

/// [`search_command`] on another budget (`--vram 2700M`, ...).
pub fn search_command_on(
    config: &std::path::Path,
    out: &std::path::Path,
    budget: &[&str],
) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("segtune").unwrap();
    cmd.arg("search")
        .arg(config)
        .args(budget)
        .args(["--device", "cpu", "--quiet", "--out"])
        .arg(out);
    cmd
}

/// The oracle fixtures of the models the shared oracle lacks, measured
/// with the shared oracle script on an AMX CPU (commands inside each):
/// one config per CNN head type, Swin-T UPerNet, `with_cp=True` models and
/// Mask2Former with a lowered `num_points` or `with_cp=True`, the heads of
/// issue 16; K-Net and PSANet through `scripts/oracle-extra.py`; MobileNetV2;
/// the ViT family (ViT UPerNet with MultiLevelNeck, SETR, Segmenter); ICNet
/// and BiSeNetV1; Twins (PCPVT, SVT); ResNeSt; mmpretrain's ConvNeXt and
/// PoolFormer. `oracle_cpu_realtime.json` (BiSeNetV2, STDC, DDRNet, PIDNet,
/// MobileNetV3 LR-ASPP, SegNeXt) was measured on an AVX-512-bf16 CPU
/// without AMX: its peaks are compared on a CPU of that class only.
pub const EXTRA_ORACLES: [&str; 15] = [
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_cnn_extra.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_swin_extra.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_with_cp.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_mask2former_knobs.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_heads_extra.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_knet_psa.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_mobilenet_v2.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_vit.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_icnet_bisenet.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_twins.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_resnest.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_mmpretrain.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_realtime.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_maskformer_beit_mae.json"
    ),
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/oracle_cpu_cgnet_erfnet_fastscnn_dpt.json"
    ),
];

/// An oracle model's `cfg_options` (a fixture's model may be a shared
/// config with options, e.g. `with_cp`); none for the shared oracle's.
pub fn fixture_cfg_options(model: &serde_json::Value) -> Vec<String> {
    model["cfg_options"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.as_str().map(String::from))
        .collect()
}

/// `--cfg-options A=B ...` as command-line arguments (none when empty).
pub fn cfg_options_args(options: &[String]) -> Vec<&str> {
    if options.is_empty() {
        return Vec::new();
    }
    std::iter::once("--cfg-options")
        .chain(options.iter().map(String::as_str))
        .collect()
}

/// Why segtune cannot build the config's model (with `cfg_options`), if it cannot.
pub fn why_unsupported(config: &std::path::Path, cfg_options: &[String]) -> Option<String> {
    match segtune::config::resolve(config, cfg_options) {
        Ok(cfg) => segtune::models::check_supported(&cfg)
            .err()
            .map(|e| e.to_string()),
        Err(e) => Some(e.to_string()),
    }
}

/// What the Python `check` script (which loads `sys.argv[1]` with MMEngine,
/// merges `--cfg-options` through MMEngine's `DictAction`, and prints JSON)
/// prints for the emitted config, and then for the original config with
/// the printed `--cfg-options` `line` pasted into bash; both must agree.
pub fn mmengine_reads_emitted_and_pasted(
    python: &std::path::Path,
    check: &str,
    emitted: &std::path::Path,
    original: &std::path::Path,
    line: &str,
) -> serde_json::Value {
    let read = python_check(python, check, emitted);
    println!("mmengine reads the emitted config as {read}");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("check.py");
    std::fs::write(&script, check).unwrap();
    let pasted = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("\"$0\" \"$1\" \"$2\" {line}"))
        .arg(python)
        .arg(&script)
        .arg(original)
        .output()
        .unwrap();
    assert!(
        pasted.status.success(),
        "the printed line does not paste into bash: {line}\n{}",
        String::from_utf8_lossy(&pasted.stderr)
    );
    let parsed: serde_json::Value = serde_json::from_slice(&pasted.stdout).unwrap();
    assert_eq!(
        parsed, read,
        "the --cfg-options line, as MMEngine parses it: {line}"
    );
    read
}

/// What the Python `check` script prints (JSON) for `sys.argv[1]` = `arg`;
/// a failing script fails the test with its stderr.
pub fn python_check(
    python: &std::path::Path,
    check: &str,
    arg: &std::path::Path,
) -> serde_json::Value {
    let run = std::process::Command::new(python)
        .args(["-c", check])
        .arg(arg)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_slice(&run.stdout).unwrap()
}

/// `segtune estimate CONFIG --json ARGS`, which must succeed: its report.
pub fn estimate_json(config: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_segtune"))
        .arg("estimate")
        .arg(config)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Chromium, or why there is none (fails under CI=true).
pub fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::process::Command::new(name)
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| PathBuf::from(name))
    });
    if found.is_none() {
        let why = "Chromium is not installed (Debian: apt-get install chromium; scripts/setup-tests does it as root)";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("page test: {why}; not rendered");
    }
    found
}

/// Headless Chromium on `url` with `args` (`--dump-dom`, `--screenshot=...`).
pub fn headless(browser: &std::path::Path, args: &[&str], url: &str) -> std::process::Output {
    std::process::Command::new(browser)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--hide-scrollbars",
        ])
        .args(args)
        .arg(url)
        .output()
        .unwrap()
}
