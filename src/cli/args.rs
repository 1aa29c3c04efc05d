//! The command lines of `segtune` and `segtune-torch` (clap), and their
//! conversion into the library's types: a [`TrialRequest`], an
//! [`EstimateRequest`], a [`SearchRequest`].

pub use super::scale_args::{AtlasArgs, ScaleArgs, DEFAULT_MAX_PARALLEL};
use crate::config::dump;
use crate::error::Result;
use crate::kinds::VersionSource;
use crate::kinds::{
    Amp, DeviceChoice, GpuChoice, MmcvVersion, RunMode, Stack, TorchVersion, TrainingSetup, Vram,
};
use crate::named::Named;
use crate::predict::allocator::AllocatorSettings;
use crate::predict::{EstimateRequest, Gpu, TraceKind};
use crate::search::spec::MAX_GPUS;
use crate::search::{Objective, SearchRequest, SearchRun, SearchSpec};
use crate::trial::{OpTrace, TrialRequest};
use crate::worker::machine::detect_python_torch;
use crate::worker::python_worker::PythonWorker;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use std::path::PathBuf;

/// A parser for a library enum, offering its names as the choices.
pub(super) fn named<T: Named + Send + Sync>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::ALL.iter().map(|v| v.name()))
        .map(|s| crate::named::parse(&s, "a choice").expect("a listed name parses"))
}

/// A crop size `HxW` (or one number for a square).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crop(pub (i64, i64));

/// The crop sides segtune accepts: below 32 pixels a backbone's 1/32 map
/// is empty; above 8192 one image alone is gigabytes of activations, more
/// than any GPU holds.
pub const CROP_SIDES: std::ops::RangeInclusive<i64> = 32..=8192;

impl std::str::FromStr for Crop {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Crop, String> {
        let parse = |t: &str| t.trim().parse::<i64>().ok();
        let dims = match s.split_once(['x', 'X']) {
            Some((h, w)) => parse(h).zip(parse(w)),
            None => parse(s).map(|v| (v, v)),
        };
        let (h, w) =
            dims.ok_or_else(|| format!("`{s}` is not a crop size; write HxW, e.g. 512x512"))?;
        for side in [h, w] {
            if !CROP_SIDES.contains(&side) {
                return Err(format!(
                    "crop `{s}`: each side must be {} to {} pixels, not {side}",
                    CROP_SIDES.start(),
                    CROP_SIDES.end()
                ));
            }
        }
        Ok(Crop((h, w)))
    }
}

/// `--vram` as bytes (a trial's cap).
fn vram_bytes(s: &str) -> std::result::Result<u64, String> {
    s.parse::<Vram>()
        .map(|v| v.bytes())
        .map_err(|e| e.to_string())
}

/// A value parser for a count that must be at least `min`.
fn at_least(min: i64) -> impl Fn(&str) -> std::result::Result<i64, String> + Clone {
    move |s: &str| {
        let v: i64 = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a whole number"))?;
        if v < min {
            Err(format!("must be at least {min}, not {v}"))
        } else {
            Ok(v)
        }
    }
}

/// A fraction in `[0, max]` (`--ignore-fraction`, `--margin`).
/// `--gt-segments`: a number of classes (at least 1) or `all` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segments(pub Option<i64>);

fn segments(s: &str) -> std::result::Result<Segments, String> {
    if s.trim() == "all" {
        return Ok(Segments(None));
    }
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 1 => Ok(Segments(Some(n))),
        _ => Err(format!(
            "`{s}` is neither `all` nor a number of classes (at least 1)"
        )),
    }
}

/// `on` or `off` (also `true`/`false`, `1`/`0`).
fn on_off(s: &str) -> std::result::Result<bool, String> {
    match s.trim() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("`{s}` is neither `on` nor `off`")),
    }
}

pub(super) fn fraction(max: f64) -> impl Fn(&str) -> std::result::Result<f64, String> + Clone {
    move |s: &str| {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a number"))?;
        if (0.0..=max).contains(&v) {
            Ok(v)
        } else {
            Err(format!("`{s}` must be between 0 and {max}"))
        }
    }
}

#[derive(clap::Parser, Debug)]
#[command(
    name = "segtune",
    version,
    about = "Find the MMSegmentation training config that fits your GPU, by measurement"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Print a config fully resolved, as MMEngine's Config.fromfile would.
    #[command(
        after_help = "Examples:\n  segtune resolve configs/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py\n  segtune resolve my_config.py --format json --cfg-options train_dataloader.batch_size=4"
    )]
    Resolve {
        /// An MMSeg Python config (.py) or a segtune Rhai config (.rhai).
        config: PathBuf,
        /// Output format: py (loadable by mmengine, keys sorted), json
        /// (tuples as {"__tuple__": [...]}), rhai.
        #[arg(long, value_parser = named::<dump::Format>(), default_value = "py")]
        format: dump::Format,
        /// Override settings, as tools/train.py's --cfg-options: KEY=VALUE
        /// with dotted keys (list items by index: a.0.b=1).
        #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
        cfg_options: Vec<String>,
    },
    /// Run a short real training trial of the config's model and measure
    /// peak memory and speed (CPU or CUDA).
    #[command(
        after_help = "Examples:\n  segtune trial my_config.py --batch-size 2 --crop 512x512 --amp bf16\n  segtune trial my_config.py --device cuda --batch-size 4 --json"
    )]
    Trial(TrialCommandArgs),
    /// Show the config's model: type, whether segtune supports it, parameters.
    #[command(
        after_help = "Example:\n  segtune inspect configs/swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py"
    )]
    Inspect(InspectArgs),
    /// Predict the GPU memory of training without that GPU: an exact CPU
    /// trace of one step replayed through a model of PyTorch's CUDA caching
    /// allocator, plus the CUDA context and workspaces. Every figure is a
    /// prediction.
    #[command(
        after_help = "Examples:\n  segtune estimate my_config.py --preset rtx3050ti --batch-size 2 --crop 512x512 --amp fp16\n  segtune estimate my_config.py --vram 24G --batch-size 8 --torch 1.10 --gpus 4"
    )]
    Estimate(EstimateArgs),
    /// Why a setting fits or not: the predicted peak of one training step
    /// split into parameters, optimizer state, activations by model part
    /// (backbone stages, heads, losses), gradients, the input batch, the
    /// cuBLAS workspace, the allocator's reserve and the CUDA context.
    #[command(
        after_help = "Examples:\n  segtune explain my_config.py --preset rtx3050ti --batch-size 4 --crop 512x512 --amp fp16\n  segtune explain my_config.py --vram 8G --json"
    )]
    Explain(EstimateArgs),
    /// Find the best feasible training config for a GPU budget: batch x crop
    /// x AMP (x accumulation keeping the recipe's effective batch), ranked;
    /// the winner is written as an MMSeg config.
    #[command(
        after_help = "Examples:\n  segtune search my_config.py --preset rtx3050ti\n  segtune search my_config.py --vram 8G --objective throughput --out runs/tune --all\n  segtune search docs/examples/segformer_mit-b0_8xb2-160k_ade20k-512x512.rhai"
    )]
    Search(SearchArgs),
    /// Which models train on which GPUs, and how: for every config under
    /// the directories and every GPU, the best feasible setting as `search`
    /// picks it (or the least memory it needs when nothing fits), beside
    /// the config's published mIoU; atlas.html, atlas.csv and atlas.json in
    /// --out. Traces are shared between GPUs and kept for re-runs.
    #[command(
        after_help = "Examples:\n  segtune atlas mmsegmentation/configs --preset rtx3060 --preset t4\n  segtune atlas configs/segformer --all-presets\n  segtune atlas configs/segformer configs/pspnet --preset rtx3050ti --preset rtx3090 --out atlas\n  segtune atlas my_configs --vram 6G --results site-packages/mmseg/.mim/configs"
    )]
    Atlas(AtlasArgs),
    /// Write a finished search's report: a self-contained HTML page and
    /// SVG charts (memory and throughput against batch with the budget,
    /// the winner marked, the winner's peak split into parts) from the
    /// --out directory's journal, into DIR/report/.
    #[command(
        after_help = "Example:\n  segtune search my_config.py --preset rtx3050ti --out runs/tune\n  segtune report runs/tune    # writes runs/tune/report/report.html"
    )]
    Report {
        /// A `segtune search --out` directory.
        dir: PathBuf,
    },
    /// Print a JSON schema: `search` (the search settings) or `result` (`search --json`).
    Schema {
        #[arg(value_parser = ["search", "result", "atlas"])]
        which: String,
    },
    /// List the shipped GPU presets (for --preset and `import` in .rhai
    /// configs): every NVIDIA card of the table, Pascal to Blackwell.
    #[command(
        after_help = "Examples:\n  segtune presets\n  segtune presets --json\n  segtune estimate my_config.py --preset \"NVIDIA GeForce RTX 3060 Laptop GPU\""
    )]
    Presets {
        /// Every field of every card as a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Check this machine once, in words: segtune's build, the libtorch its
    /// worker loads and its CUDA, the NVIDIA driver and the CUDA it runs,
    /// each GPU and its preset, the Python for --torch and --python-worker,
    /// and what to do where something does not fit. Exit 1 when segtune
    /// cannot work here as it is.
    #[command(after_help = "Examples:\n  segtune doctor\n  segtune doctor --json")]
    Doctor {
        /// The findings as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "Examples:\n  segtune completions bash > ~/.local/share/bash-completion/completions/segtune\n  segtune completions zsh > ~/.zfunc/_segtune\n  segtune completions fish > ~/.config/fish/completions/segtune.fish"
    )]
    Completions {
        #[arg(value_parser = clap::value_parser!(clap_complete::Shell))]
        shell: clap_complete::Shell,
    },
}

/// The GPU to predict for or search on: a shipped preset, or a memory size
/// and the card's compute capability.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct GpuArgs {
    /// A shipped GPU preset (see `segtune presets`): its slug (`rtx3060`)
    /// or the name nvidia-smi prints ("NVIDIA GeForce RTX 3060 Laptop
    /// GPU"), case-insensitive. Neither --preset nor --vram: the card
    /// nvidia-smi finds.
    #[arg(long)]
    pub preset: Option<String>,
    /// GPU memory: 4G, 4GB, 4GiB, 3.5G, 4096M, 4096MiB or bytes. All units
    /// are binary (1G = 1 GiB = 1024 MiB, as nvidia-smi's MiB).
    #[arg(long, allow_hyphen_values = true)]
    pub vram: Option<Vram>,
    /// Compute capability for --vram (decides the CUDA context, the cuBLAS
    /// workspace and bf16; default 8.6).
    #[arg(long)]
    pub compute_capability: Option<String>,
}

impl GpuArgs {
    /// The GPU the flags name.
    pub fn choice(&self) -> GpuChoice {
        GpuChoice {
            vram: self.vram.clone(),
            preset: self.preset.clone(),
            compute_capability: self.compute_capability.clone(),
        }
    }

    fn gpu(&self) -> Result<Gpu> {
        Gpu::choose(&self.choice())
    }
}

/// What the synthetic batch and the step are: the classes in its label
/// maps, training or inference, and cuDNN's algorithm choice.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq)]
pub struct StepArgs {
    /// Classes present in each synthetic label map, or `all` (uniform random
    /// labels, as MMSeg's CPU oracle). Mask2Former makes one ground-truth
    /// segment per class present: its memory grows with this (see
    /// docs/trials.md).
    #[arg(long, value_name = "N|all", value_parser = segments, default_value = "20", allow_negative_numbers = true)]
    pub gt_segments: Segments,
    /// train: training steps; infer: test steps (no gradients; the batch
    /// is the test batch, --crop the image size, model.test_cfg decides
    /// whole or slide inference; `search` ranks inference settings by
    /// images/s and emits test_cfg and test_dataloader.batch_size).
    #[arg(long, value_parser = named::<RunMode>(), default_value = "train")]
    pub mode: RunMode,
    /// torch.backends.cudnn.benchmark: on or off (default: the config's
    /// env_cfg.cudnn_benchmark, which MMSeg's default runtime sets on; off
    /// under randomness.deterministic).
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub cudnn_benchmark: Option<bool>,
}

/// What every command that reads a config takes besides it.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct CommonArgs {
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// Override settings, as tools/train.py's --cfg-options: KEY=VALUE
    /// with dotted keys (list items by index: a.0.b=1).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    pub cfg_options: Vec<String>,
}

/// `segtune trial`'s arguments: the request's, and which worker runs it.
#[derive(clap::Args, Debug, Clone)]
pub struct TrialCommandArgs {
    #[command(flatten)]
    pub trial: TrialArgs,
    #[command(flatten)]
    pub python: PythonWorkerArgs,
}

/// Which worker runs MMSeg's step: segtune's rebuild or MMSeg itself.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PythonWorkerArgs {
    /// Run the step with MMSeg itself in Python (the Python worker: your
    /// MMSeg, your custom_imports modules, MMSeg's own train_step) instead
    /// of segtune's libtorch rebuild: for component types segtune does not
    /// build. This runs your Python code (custom_imports); without this
    /// flag segtune never does.
    #[arg(long)]
    pub python_worker: bool,
    /// The Python interpreter of the Python worker (with torch and
    /// MMSegmentation). Default: the Python segtune asks for its torch
    /// release ($SEGTUNE_PYTHON, else python3 with torch), else python3.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
}

/// `segtune trial` arguments (also `segtune-torch trial`'s, for people; the
/// parent sends workers the request itself, see [`TrialRequest::to_json`]).
#[derive(clap::Args, Debug, Clone)]
pub struct TrialArgs {
    /// The config (.py or .rhai).
    pub config: PathBuf,
    #[arg(long, default_value_t = 2, value_parser = at_least(1), allow_negative_numbers = true)]
    pub batch_size: i64,
    /// Crop HxW (also sets data_preprocessor.size, as changing the crop does).
    #[arg(long, default_value = "512x512", allow_hyphen_values = true)]
    pub crop: Crop,
    #[arg(long, value_parser = named::<Amp>(), default_value = "off")]
    pub amp: Amp,
    /// accumulative_counts (default: the config's).
    #[arg(long, value_parser = at_least(1), allow_negative_numbers = true)]
    pub accum: Option<i64>,
    /// Measured steps.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000).map(|v| v as usize))]
    pub steps: usize,
    /// Warm-up steps before the measured ones (optimizer state is created in the first step).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=1000).map(|v| v as usize))]
    pub warmup: usize,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceChoice,
    #[arg(long, default_value_t = 0)]
    pub seed: i64,
    /// Fraction of label pixels set to ignore_index in the synthetic batch.
    #[arg(long, default_value_t = 0.05, value_parser = fraction(1.0), allow_negative_numbers = true)]
    pub ignore_fraction: f64,
    #[command(flatten)]
    pub step: StepArgs,
    /// CPU threads for libtorch (default: libtorch's choice).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=4096))]
    pub threads: Option<i32>,
    /// Cap on live CPU tensor bytes; an allocation beyond it fails as out of memory.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    pub cpu_cap: Option<u64>,
    /// GPU memory this trial may use (4G, 3.5G, 4096M, bytes): on CUDA the
    /// caching allocator is capped at it less the CUDA context, so a
    /// larger card stands in for a smaller one; with --as-cuda on the CPU
    /// the counted tensors are capped at it.
    #[arg(long, value_parser = vram_bytes, allow_hyphen_values = true)]
    pub vram: Option<u64>,
    /// Write every CPU allocation and free (from the model build on) to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace_out: Option<PathBuf>,
    #[command(flatten)]
    pub setup: SetupArgs,
    /// On the CPU, stand in for a CUDA run where CUDA's PyTorch does
    /// otherwise: CUDA's autocast rules (half precision held as bf16),
    /// fp16's GradScaler, the optimizers' foreach implementation.
    #[arg(long)]
    pub as_cuda: bool,
    /// What the trace counts: every CPU allocation (off), or the storages
    /// each ATen op returns, run by CPU kernels (cpu) or meta kernels
    /// (meta: no compute, no host memory for tensors).
    #[arg(long, value_parser = named::<OpTrace>(), default_value = "off")]
    pub op_trace: OpTrace,
    /// Seconds before the worker is stopped and the trial reported as timed
    /// out (default: 600 on CUDA; on the CPU scaled from the steps and the
    /// pixels of the batch, as a traced step's deadline).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub timeout: Option<u64>,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl TrialArgs {
    pub fn request(&self) -> TrialRequest {
        TrialRequest {
            config: self.config.clone(),
            cfg_options: self.common.cfg_options.clone(),
            batch_size: self.batch_size,
            crop: self.crop.0,
            amp: self.amp,
            accumulative_counts: self.accum,
            warmup_steps: self.warmup,
            measured_steps: self.steps,
            device: self.device,
            seed: self.seed,
            ignore_fraction: self.ignore_fraction,
            gt_segments: self.step.gt_segments.0,
            threads: self.threads,
            cpu_cap_bytes: self.cpu_cap,
            vram_budget_bytes: self.vram,
            trace_out: self.trace_out.clone(),
            setup: self.setup.setup(),
            as_cuda: self.as_cuda,
            op_trace: self.op_trace,
            mode: self.step.mode,
            cudnn_benchmark: self.step.cudnn_benchmark,
        }
    }
}

/// The training run around the step: how many GPUs, which PyTorch.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupArgs {
    /// GPUs training data-parallel (DDP): each also holds DDP's gradient
    /// buckets, one more copy of the trainable parameters.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=MAX_GPUS))]
    pub gpus: i64,
    /// The PyTorch release whose memory behaviour to reproduce, MAJOR.MINOR
    /// from 1.8 to 2.11 (docs/prediction.md lists what moves between
    /// them; older than 2.11: CPU only). Default for estimate: the torch of
    /// your Python (python3, or $SEGTUNE_PYTHON), else 2.11.
    #[arg(long, value_name = "X.Y", conflicts_with = "stack")]
    pub torch: Option<TorchVersion>,
    /// Alias of --torch: `current` (2.11) or `zoo-2021` (1.10; MMSeg's
    /// 2020-2022 model-zoo runs hold what 1.9 holds where the two differ,
    /// MobileNetV2's ReLU6: --torch 1.9).
    #[arg(long, value_parser = named::<Stack>())]
    pub stack: Option<Stack>,
    /// The mmcv release whose building blocks to reproduce, from 1.0.0 to
    /// 2.1.0 (default 2.1.0, what MMSeg 1.x runs on; an older one for an
    /// MMSeg 0.x log: before 1.4.5 HSwish is mmcv's own x * ReLU6(x + 3) / 6).
    #[arg(long, value_name = "X.Y.Z", default_value_t = MmcvVersion::NEWEST)]
    pub mmcv: MmcvVersion,
}

impl SetupArgs {
    /// The release given (--torch or --stack), if one was.
    fn given_torch(&self) -> Option<TorchVersion> {
        self.torch.or(self.stack.map(Stack::torch))
    }

    /// For a trial: the given release, else the libtorch segtune links.
    fn setup(&self) -> TrainingSetup {
        TrainingSetup {
            gpus: self.gpus,
            torch: self.given_torch().unwrap_or(TorchVersion::NEWEST),
            mmcv: self.mmcv,
        }
    }

    /// For a prediction: the given release, else the torch of the user's
    /// Python, else the newest; and where it came from.
    fn predicted_setup(&self) -> (TrainingSetup, VersionSource) {
        let (torch, source) = match self.given_torch() {
            Some(v) => (v, VersionSource::Given),
            None => match detect_python_torch() {
                Some((v, python)) => (v, VersionSource::Python(python)),
                None => (TorchVersion::NEWEST, VersionSource::Newest),
            },
        };
        (
            TrainingSetup {
                gpus: self.gpus,
                torch,
                mmcv: self.mmcv,
            },
            source,
        )
    }
}

/// `segtune estimate` arguments.
#[derive(clap::Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("gpu").required(false).args(["preset", "vram"])))]
pub struct EstimateArgs {
    /// The config (.py or .rhai).
    pub config: PathBuf,
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Batch size per GPU (default: the recipe's train_dataloader.batch_size).
    #[arg(long, value_parser = at_least(1), allow_negative_numbers = true)]
    pub batch_size: Option<i64>,
    /// Crop HxW (default: the recipe's).
    #[arg(long, allow_hyphen_values = true)]
    pub crop: Option<Crop>,
    /// Mixed precision (default: the recipe's; AmpOptimWrapper means its dtype).
    #[arg(long, value_parser = named::<Amp>())]
    pub amp: Option<Amp>,
    /// CPU threads for the traced step (default: every core).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=4096))]
    pub threads: Option<i32>,
    #[command(flatten)]
    pub step: StepArgs,
    #[command(flatten)]
    pub setup: SetupArgs,
    /// How the step is traced: op outputs with meta kernels (meta: no
    /// compute, no host memory), the same with CPU kernels (cpu), or every
    /// CPU allocation (cpu-allocator, the trace before op-level traces).
    #[arg(long, value_parser = named::<TraceKind>(), default_value = "meta")]
    pub trace: TraceKind,
    /// The caching allocator's settings, as PYTORCH_CUDA_ALLOC_CONF:
    /// expandable_segments:True and/or max_split_size_mb:N (the reserved
    /// memory with the defaults is shown beside).
    #[arg(long, value_name = "CONF", value_parser = clap::value_parser!(AllocatorSettings), default_value = "")]
    pub alloc_conf: AllocatorSettings,
    #[command(flatten)]
    pub timeouts: TraceTimeoutArgs,
    #[command(flatten)]
    pub python: PythonWorkerArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// How long a traced step may take.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceTimeoutArgs {
    /// Seconds a traced step may take before its worker is stopped and it
    /// counts as timed out (default: scaled from the trace kind and the
    /// step's pixels).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub trace_timeout: Option<u64>,
}

impl TraceTimeoutArgs {
    pub(super) fn deadline(&self) -> Option<std::time::Duration> {
        self.trace_timeout.map(std::time::Duration::from_secs)
    }
}

impl EstimateArgs {
    /// The request; `python`: the Python worker that traces the step, if
    /// one does.
    pub fn request(&self, python: Option<PythonWorker>) -> Result<EstimateRequest> {
        let (setup, torch_source) = self.setup.predicted_setup();
        Ok(EstimateRequest {
            config: self.config.clone(),
            cfg_options: self.common.cfg_options.clone(),
            gpu: self.gpu.gpu()?,
            batch_size: self.batch_size,
            crop: self.crop.map(|c| c.0),
            amp: self.amp,
            threads: self.threads,
            gt_segments: self.step.gt_segments.0,
            setup,
            torch_source: torch_source.to_string(),
            trace: self.trace,
            alloc_conf: self.alloc_conf,
            mode: self.step.mode,
            cudnn_benchmark: self.step.cudnn_benchmark,
            trace_timeout: self.timeouts.deadline(),
            python,
        })
    }
}

/// `segtune search` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct SearchArgs {
    /// The config (.py or .rhai); a `segtune` dict in it may carry these
    /// settings. A Hugging Face model directory works too (see --hf).
    #[arg(required_unless_present = "hf")]
    pub config: Option<PathBuf>,
    /// A Hugging Face SegFormer directory as `save_pretrained` writes it
    /// (config.json, optionally preprocessor_config.json and the run's
    /// training_args.json): searches batch, image size, accumulation,
    /// fp16/bf16 and gradient checkpointing, and writes training_args.json
    /// and preprocessor_config.json for the winner.
    #[arg(long, value_name = "DIR", conflicts_with = "config")]
    pub hf: Option<PathBuf>,
    /// The GPU (default: the config's `segtune` settings).
    #[command(flatten)]
    pub gpu: GpuArgs,
    /// Fraction of the VRAM kept free (default 0.05).
    #[arg(long, value_parser = fraction(0.9), allow_negative_numbers = true)]
    pub margin: Option<f64>,
    /// auto (a CUDA device if there is one, else predict), cpu (predict), cuda:N (measure).
    #[arg(long)]
    pub device: Option<String>,
    /// Where the journal (trials.jsonl) and the emitted config go.
    #[arg(long, default_value = "segtune-out")]
    pub out: PathBuf,
    /// keep-crop (default: the recipe's crop if anything fits at it, then
    /// throughput) or throughput.
    #[arg(long, value_parser = named::<Objective>())]
    pub objective: Option<Objective>,
    /// The precisions the search may choose: off (fp32), fp16, bf16,
    /// comma-separated or repeated (default: all the GPU runs; bf16 needs
    /// compute capability 8.0 or newer).
    #[arg(long, value_delimiter = ',', value_parser = named::<Amp>(), value_name = "PRECISION")]
    pub amp: Vec<Amp>,
    /// Also list the infeasible candidates with their reason.
    #[arg(long)]
    pub all: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// After the table, say why: the winner's predicted peak split into
    /// parts beside the next larger batch's, which does not fit.
    #[arg(long)]
    pub why: bool,
    #[command(flatten)]
    pub step: StepArgs,
    /// CPU threads for each traced step (predicted mode; two run side by
    /// side; default: half the cores each).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=4096))]
    pub threads: Option<i32>,
    /// Evaluate every candidate of the grid, without pruning (for benchmarks).
    #[arg(long, hide = true)]
    pub exhaustive: bool,
    /// How predicted candidates are traced (see `segtune estimate --trace`).
    #[arg(long, value_parser = named::<TraceKind>(), default_value = "meta")]
    pub trace: TraceKind,
    /// Seconds before a CUDA trial counts as timed out.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub trial_timeout: u64,
    #[command(flatten)]
    pub timeouts: TraceTimeoutArgs,
    /// GPUs training data-parallel (default 1): the batch is per GPU, the
    /// recipe's effective batch is kept as batch x accumulation x GPUs, and
    /// each GPU also holds DDP's gradient buckets.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..=MAX_GPUS))]
    pub gpus: Option<i64>,
    /// The effective batch to keep, GPUs x batch x accumulation (default:
    /// `segtune.effective_batch`, else `auto_scale_lr.base_batch_size`,
    /// else the file name's NxbB where its B is the config's batch, else
    /// the config's batch x --gpus x accumulation).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub effective_batch: Option<i64>,
    /// keep-updates (default: iteration-counted settings such as
    /// train_cfg.max_iters scaled so the recipe's optimizer updates are
    /// kept when the batch per iteration changes) or keep-iters (left as
    /// they are: more accumulation, fewer updates).
    #[arg(long, value_parser = named::<crate::search::recipe::Schedule>())]
    pub schedule: Option<crate::search::recipe::Schedule>,
    /// The PyTorch release to predict for, MAJOR.MINOR from 1.8 to 2.11
    /// (default: `segtune.torch` in the config, else the torch of your
    /// Python, else 2.11). Older than 2.11: predicted only.
    #[arg(long, value_name = "X.Y")]
    pub torch: Option<TorchVersion>,
    #[command(flatten)]
    pub scale: ScaleArgs,
    /// Keep traced steps in DIR and replay them instead of tracing again
    /// (a trace does not depend on the GPU: one serves every preset and
    /// every re-run; keyed by the resolved model, batch, crop, precision,
    /// PyTorch release and the worker binary).
    #[arg(long, value_name = "DIR")]
    pub trace_cache: Option<PathBuf>,
    #[command(flatten)]
    pub python: PythonWorkerArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl SearchArgs {
    pub fn request(&self) -> SearchRequest {
        SearchRequest {
            config: self.config_path().to_path_buf(),
            cfg_options: self.common.cfg_options.clone(),
            settings: SearchSpec {
                gpu: self.gpu.choice(),
                margin: self.margin,
                objective: self.objective,
                device: self.device.clone(),
                gpus: self.gpus,
                torch: self.torch,
                effective_batch: self.effective_batch,
                schedule: self.schedule,
            },
            precisions: (!self.amp.is_empty()).then(|| self.amp.clone()),
            mode: self.step.mode,
            exhaustive: self.exhaustive,
            out: self.out.clone(),
            run: SearchRun {
                trial_timeout: std::time::Duration::from_secs(self.trial_timeout),
                trace_timeout: self.timeouts.deadline(),
                threads: self.threads,
                trace: self.trace,
                gt_segments: self.step.gt_segments.0,
                // `--torch` and the config's `segtune.torch` come before the
                // environment's, which is asked only without them.
                // The Python worker's trace is of the PyTorch segtune links.
                ask_python_torch: self.torch.is_none() && !self.python.python_worker,
                cudnn_benchmark: self.step.cudnn_benchmark,
                placement: self.scale.placement(),
                trace_cache: self
                    .trace_cache
                    .as_ref()
                    .map(|d| std::sync::Arc::new(crate::predict::TraceCache::new(d))),
                python: self.python.worker(),
            },
        }
    }
}

impl PythonWorkerArgs {
    /// The Python worker asked for (`--python-worker`); `None`: segtune's
    /// own worker. Never chosen by itself: the Python worker runs the
    /// config's `custom_imports`, the user's code, which segtune runs only
    /// when asked (a type segtune does not build says how to ask).
    pub fn worker(&self) -> Option<PythonWorker> {
        self.python_worker
            .then(|| PythonWorker::locate(self.python.as_deref()))
    }
}

/// `segtune inspect` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct InspectArgs {
    pub config: PathBuf,
    #[command(flatten)]
    pub python: PythonWorkerArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl SearchArgs {
    /// The config file or model directory to search.
    pub fn config_path(&self) -> &std::path::Path {
        self.config
            .as_deref()
            .or(self.hf.as_deref())
            .expect("clap requires a config or --hf")
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
