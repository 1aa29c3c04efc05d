//! The `segtune` command line: argument parsing and output, nothing else.
//! Every bad input ends with a message on stderr and exit code 2.

use crate::config::{self, dump, presets, ConfigError};
pub use crate::trial::optim::Amp;
pub use crate::trial::Stack;
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;

/// Exit code of every usage or input error.
pub const EXIT_INPUT_ERROR: i32 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "segtune",
    version,
    about = "Find the MMSegmentation training config that fits your GPU, by measurement"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print a config fully resolved, as MMEngine's Config.fromfile would.
    Resolve {
        /// An MMSeg Python config (.py) or a segtune Rhai config (.rhai).
        config: PathBuf,
        /// Output format: py (loadable by mmengine, keys sorted), json
        /// (tuples as {"__tuple__": [...]}), rhai.
        #[arg(long, value_enum, default_value = "py")]
        format: dump::Format,
        /// Override settings, as tools/train.py's --cfg-options: KEY=VALUE
        /// with dotted keys (list items by index: a.0.b=1).
        #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
        cfg_options: Vec<String>,
    },
    /// Run a short real training trial of the config's model and measure
    /// peak memory and speed (CPU or CUDA).
    Trial(TrialArgs),
    /// Show the config's model: type, whether segtune supports it, parameters.
    Inspect(InspectArgs),
    /// Predict the GPU memory of training without that GPU: an exact CPU
    /// trace of one step replayed through a model of PyTorch's CUDA caching
    /// allocator, plus the CUDA context and workspaces. Every figure is a
    /// prediction.
    Estimate(EstimateArgs),
    /// Find the best feasible training config for a GPU budget: batch x crop
    /// x AMP (x accumulation keeping the recipe's effective batch), ranked;
    /// the winner is written as an MMSeg config.
    Search(SearchArgs),
    /// Print a JSON schema: `search` (the search settings) or `result` (`search --json`).
    Schema {
        #[arg(value_parser = ["search", "result"])]
        which: String,
    },
    /// List the shipped GPU presets (for --preset and `import` in .rhai configs).
    Presets,
}

/// A crop size `HxW` (or one number for a square).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crop(pub (i64, i64));

impl std::str::FromStr for Crop {
    type Err = String;
    fn from_str(s: &str) -> Result<Crop, String> {
        let parse = |t: &str| t.trim().parse::<i64>().ok().filter(|v| *v > 0);
        let dims = match s.split_once(['x', 'X']) {
            Some((h, w)) => parse(h).zip(parse(w)),
            None => parse(s).map(|v| (v, v)),
        };
        dims.map(Crop)
            .ok_or_else(|| format!("`{s}` is not a crop size; write HxW, e.g. 512x512"))
    }
}

/// `segtune trial` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct TrialArgs {
    /// The config (.py or .rhai).
    pub config: PathBuf,
    #[arg(long, default_value_t = 2)]
    pub batch_size: i64,
    /// Crop HxW (also sets data_preprocessor.size, as changing the crop does).
    #[arg(long, default_value = "512x512")]
    pub crop: Crop,
    #[arg(long, value_enum, default_value = "off")]
    pub amp: Amp,
    /// accumulative_counts (default: the config's).
    #[arg(long)]
    pub accum: Option<i64>,
    /// Measured steps.
    #[arg(long, default_value_t = 2)]
    pub steps: usize,
    /// Warm-up steps before the measured ones (optimizer state is created in the first step).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[arg(long, default_value_t = 0)]
    pub seed: i64,
    /// Fraction of label pixels set to ignore_index in the synthetic batch.
    #[arg(long, default_value_t = 0.05)]
    pub ignore_fraction: f64,
    /// CPU threads for libtorch (default: libtorch's choice).
    #[arg(long)]
    pub threads: Option<i32>,
    /// Cap on live CPU tensor bytes; an allocation beyond it fails as out of memory.
    #[arg(long, value_name = "BYTES")]
    pub cpu_cap: Option<u64>,
    /// Write every CPU allocation and free (from the model build on) to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace_out: Option<PathBuf>,
    #[command(flatten)]
    pub setup: TrainingSetup,
    /// On the CPU, stand in for a CUDA run where CUDA's PyTorch does
    /// otherwise: CUDA's autocast rules (half precision held as bf16),
    /// fp16's GradScaler, the optimizers' foreach implementation.
    #[arg(long)]
    pub as_cuda: bool,
    #[arg(long)]
    pub json: bool,
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    pub cfg_options: Vec<String>,
}

/// The training run around the step: how many GPUs, which software stack.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainingSetup {
    /// GPUs training data-parallel (DDP): each also holds DDP's gradient
    /// buckets, one more copy of the trainable parameters.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..))]
    pub gpus: i64,
    /// Whose memory behaviour to reproduce: `current` (PyTorch 2.x +
    /// MMEngine) or `zoo-2021` (PyTorch <= 1.10 + mmcv 1.x, as MMSeg's
    /// model-zoo memory was measured; CPU traces only).
    #[arg(long, value_enum, default_value = "current")]
    pub stack: Stack,
}

impl Default for TrainingSetup {
    fn default() -> TrainingSetup {
        TrainingSetup {
            gpus: 1,
            stack: Stack::Current,
        }
    }
}

/// `segtune estimate` arguments.
#[derive(clap::Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("gpu").required(true).args(["preset", "vram"])))]
pub struct EstimateArgs {
    /// The config (.py or .rhai).
    pub config: PathBuf,
    /// A shipped GPU preset (see `segtune presets`).
    #[arg(long)]
    pub preset: Option<String>,
    /// GPU memory: 4G, 4GB, 4GiB, 3.5G, 4096M, 4096MiB or bytes. All units
    /// are binary (1G = 1024 MiB, as nvidia-smi's MiB).
    #[arg(long)]
    pub vram: Option<String>,
    /// Compute capability for --vram (decides the CUDA context and cuBLAS workspace terms).
    #[arg(long, default_value = "8.6")]
    pub compute_capability: String,
    /// Batch size per GPU (default: the recipe's train_dataloader.batch_size).
    #[arg(long)]
    pub batch_size: Option<i64>,
    /// Crop HxW (default: the recipe's).
    #[arg(long)]
    pub crop: Option<Crop>,
    /// Mixed precision (default: the recipe's; AmpOptimWrapper means its dtype).
    #[arg(long, value_enum)]
    pub amp: Option<Amp>,
    /// CPU threads for the traced step (default: every core).
    #[arg(long)]
    pub threads: Option<i32>,
    #[command(flatten)]
    pub setup: TrainingSetup,
    #[arg(long)]
    pub json: bool,
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    pub cfg_options: Vec<String>,
}

/// `segtune search` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct SearchArgs {
    /// The config (.py or .rhai); a `segtune` dict in it may carry these settings.
    pub config: PathBuf,
    /// GPU memory: 4G, 4GB, 4GiB, 3.5G, 4096M, 4096MiB or bytes. All units
    /// are binary (1G = 1 GiB = 1024 MiB, as nvidia-smi's MiB).
    #[arg(long)]
    pub vram: Option<String>,
    /// A shipped GPU preset (see `segtune presets`).
    #[arg(long)]
    pub preset: Option<String>,
    /// Compute capability for --vram (CUDA context, cuBLAS workspace, bf16; default 8.6).
    #[arg(long)]
    pub compute_capability: Option<String>,
    /// Fraction of the VRAM kept free (default 0.05).
    #[arg(long)]
    pub margin: Option<f64>,
    /// auto (a CUDA device if there is one, else predict), cpu (predict), cuda:N (measure).
    #[arg(long)]
    pub device: Option<String>,
    /// Where the journal (trials.jsonl) and the emitted config go.
    #[arg(long, default_value = "segtune-out")]
    pub out: PathBuf,
    /// keep-crop (default: the recipe's crop if anything fits at it, then
    /// throughput) or throughput.
    #[arg(long)]
    pub objective: Option<String>,
    /// Also list the infeasible candidates with their reason.
    #[arg(long)]
    pub all: bool,
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// CPU threads for each traced step (predicted mode; two run side by
    /// side; default: half the cores each).
    #[arg(long)]
    pub threads: Option<i32>,
    /// Evaluate every candidate of the grid, without pruning (for benchmarks).
    #[arg(long, hide = true)]
    pub exhaustive: bool,
    /// Seconds before a CUDA trial counts as timed out.
    #[arg(long, default_value_t = 600)]
    pub trial_timeout: u64,
    /// GPUs training data-parallel (default 1): the batch is per GPU, the
    /// recipe's effective batch is kept as batch x accumulation x GPUs, and
    /// each GPU also holds DDP's gradient buckets.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub gpus: Option<i64>,
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    pub cfg_options: Vec<String>,
}

/// `segtune inspect` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct InspectArgs {
    pub config: PathBuf,
    #[arg(long)]
    pub json: bool,
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    pub cfg_options: Vec<String>,
}

/// The machine's cores (at least 1).
pub fn cores() -> i32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as i32)
}

/// `cpu` -> `None`, `cuda` -> `Some(0)`, `cuda:N` -> `Some(N)`.
pub fn parse_device(s: &str) -> Result<Option<usize>, String> {
    match s {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Some)
            .ok_or_else(|| format!("error: `--device {other}`: write cpu, cuda or cuda:N")),
    }
}

/// The `segtune-torch` worker next to this executable.
pub fn worker_path() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().ok();
    let worker = exe
        .as_ref()
        .and_then(|e| e.parent())
        .map(|d| d.join("segtune-torch"));
    worker.filter(|w| w.is_file()).ok_or_else(|| {
        "error: segtune-torch (the libtorch worker) is not next to segtune; build both with `cargo build --release`".to_string()
    })
}

/// Runs `segtune-torch` (next to this executable) with the same arguments.
fn run_worker() -> i32 {
    let worker = match worker_path() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{e}");
            return EXIT_INPUT_ERROR;
        }
    };
    match std::process::Command::new(&worker)
        .args(std::env::args_os().skip(1))
        .status()
    {
        Ok(status) => status.code().unwrap_or(EXIT_INPUT_ERROR),
        Err(e) => {
            eprintln!("error: cannot run {}: {e}", worker.display());
            EXIT_INPUT_ERROR
        }
    }
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_INPUT_ERROR } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    if matches!(cli.command, Command::Trial(_) | Command::Inspect(_)) {
        return run_worker();
    }
    match run(cli) {
        Ok(text) => {
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`segtune resolve x.py | head`) is not an error.
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
            0
        }
        Err(e) => {
            eprint!("{e}");
            EXIT_INPUT_ERROR
        }
    }
}

/// An error message from a command as a config error (without a doubled `error:`).
fn plain_error(e: String) -> ConfigError {
    ConfigError::new(
        config::ErrorKind::Evaluation,
        e.trim_start_matches("error: ").trim_end().to_string(),
    )
}

/// Runs one command and returns everything it prints on success, so that
/// nothing reaches stdout when it fails half-way.
pub fn run(cli: Cli) -> Result<String, ConfigError> {
    match cli.command {
        Command::Resolve {
            config,
            format,
            cfg_options,
        } => {
            let cfg = config::resolve(&config, &cfg_options)?;
            dump::render(&cfg, format)
        }
        Command::Trial(_) | Command::Inspect(_) => unreachable!("run by the segtune-torch worker"),
        Command::Estimate(args) => crate::predict::cli::estimate(args)
            .map_err(|e| ConfigError::new(config::ErrorKind::Evaluation, e)),
        Command::Search(args) => {
            let result = crate::search::command::search(&args).map_err(plain_error)?;
            Ok(if args.json {
                serde_json::to_string_pretty(&result).expect("results serialise") + "\n"
            } else {
                crate::search::command::render(&result, args.all)
            })
        }
        Command::Schema { which } => {
            let schema = if which == "search" {
                schemars::schema_for!(crate::search::SearchSpec)
            } else {
                schemars::schema_for!(crate::search::SearchResult)
            };
            Ok(serde_json::to_string_pretty(&schema).expect("schemas serialise") + "\n")
        }
        Command::Presets => {
            let mut out = String::new();
            for name in presets::names() {
                let p = presets::load(name)?;
                let get = |k: &str| p.get(k).map(config::value::python_str).unwrap_or_default();
                out.push_str(&format!(
                    "{name:18} {:32} {:>7} MiB  cc {}  bf16 {}\n",
                    get("name"),
                    get("vram_mib"),
                    get("compute_capability"),
                    get("bf16")
                ));
            }
            Ok(out)
        }
    }
}
