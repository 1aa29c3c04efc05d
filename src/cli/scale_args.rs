//! The arguments of where trials run (`--devices`, `--launcher slurm`,
//! shared by `search` and `atlas`) and of `segtune atlas`.

use super::args::{fraction, named, CommonArgs, TraceTimeoutArgs};
use crate::kinds::{Amp, TorchVersion};
use crate::search::spec::MAX_GPUS;
use crate::search::{Objective, SearchRequest, SearchRun, SearchSpec};
use std::path::PathBuf;

/// Where the trials of a search run, and how many at once (`docs/scale.md`).
#[derive(clap::Args, Debug, Clone)]
pub struct ScaleArgs {
    /// Run trials on these devices at once, one worker each: cuda:0,cuda:1
    /// (or all, every visible GPU) measure; cpu,cpu (CPU stand-ins) run
    /// the predictions' traces side by side.
    #[arg(long, value_name = "LIST", value_parser = parse_devices)]
    pub devices: Option<crate::search::Devices>,
    /// local (default) or slurm: every trial an `srun` job step of the
    /// segtune-torch worker (the binaries and --out on paths the nodes
    /// share).
    #[arg(long, value_parser = ["local", "slurm"], default_value = "local")]
    pub launcher: String,
    /// Slurm partition of the trials (default: the cluster's).
    #[arg(long)]
    pub partition: Option<String>,
    /// GPUs of each trial's job (`--gres gpu:N`; none for predictions).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus_per_trial: Option<u32>,
    /// CPUs of each trial's job (`--cpus-per-task`; default 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub cpus_per_trial: Option<u32>,
    /// Time limit of each trial's job, in Slurm's syntax (e.g. 00:20:00).
    #[arg(long, value_name = "TIME")]
    pub time: Option<String>,
    /// Slurm jobs at once (default 4).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub max_parallel: Option<u32>,
    /// More `srun` arguments, as one string split at spaces (e.g.
    /// "--qos=short --account=lab").
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub srun_args: Option<String>,
}

fn parse_devices(s: &str) -> std::result::Result<crate::search::Devices, String> {
    s.parse()
        .map_err(|e: crate::search::placement::DevicesError| e.to_string())
}

/// Slurm jobs at once when `--max-parallel` is not given.
pub const DEFAULT_MAX_PARALLEL: u32 = 4;

impl ScaleArgs {
    /// Slurm's options without `--launcher slurm`: the user's mistake, named.
    pub fn check(&self) -> std::result::Result<(), String> {
        let given: Vec<&str> = [
            ("--partition", self.partition.is_some()),
            ("--gpus-per-trial", self.gpus_per_trial.is_some()),
            ("--cpus-per-trial", self.cpus_per_trial.is_some()),
            ("--time", self.time.is_some()),
            ("--max-parallel", self.max_parallel.is_some()),
            ("--srun-args", self.srun_args.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        if self.launcher != "slurm" && !given.is_empty() {
            return Err(format!(
                "{} apply to Slurm jobs: add --launcher slurm",
                given.join(", ")
            ));
        }
        Ok(())
    }

    pub fn placement(&self) -> crate::search::Placement {
        let slurm = (self.launcher == "slurm").then(|| crate::search::SlurmOptions {
            partition: self.partition.clone(),
            gpus_per_trial: self.gpus_per_trial,
            cpus_per_trial: self.cpus_per_trial,
            time: self.time.clone(),
            max_parallel: self.max_parallel.unwrap_or(DEFAULT_MAX_PARALLEL) as usize,
            srun_args: self
                .srun_args
                .as_deref()
                .map(|a| a.split_whitespace().map(String::from).collect())
                .unwrap_or_default(),
        });
        crate::search::Placement {
            devices: self.devices.clone(),
            slurm,
            local_traces: None,
        }
    }
}

/// `segtune atlas` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct AtlasArgs {
    /// Directories searched recursively for configs (.py, .rhai; `_base_`
    /// left out), e.g. your mmsegmentation/configs; or config files.
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// A shipped GPU preset (slug or the name nvidia-smi prints); give it
    /// several times for several GPUs.
    #[arg(long, value_name = "NAME")]
    pub preset: Vec<String>,
    /// Every card of the table (`segtune presets`: 52, Pascal to
    /// Blackwell; each is a search of its own).
    #[arg(long, conflicts_with = "preset")]
    pub all_presets: bool,
    /// A GPU by its memory (4G, 6GiB, ...); give it several times for several.
    #[arg(long, allow_hyphen_values = true)]
    pub vram: Vec<crate::kinds::Vram>,
    /// Compute capability of the --vram GPUs (default 8.6).
    #[arg(long)]
    pub compute_capability: Option<String>,
    /// Trees of MMSeg `metafile.yaml` files with the published results
    /// (default: the config directories; the installed package has them
    /// under mmseg/.mim/configs).
    #[arg(long, value_name = "DIR")]
    pub results: Vec<PathBuf>,
    /// Where atlas.html, atlas.csv, atlas.json, the searches and the caches go.
    #[arg(long, default_value = "segtune-atlas")]
    pub out: PathBuf,
    /// The trace cache (default: OUT/trace-cache).
    #[arg(long, value_name = "DIR")]
    pub trace_cache: Option<PathBuf>,
    /// Fraction of each GPU's VRAM kept free (default 0.05).
    #[arg(long, value_parser = fraction(0.9), allow_negative_numbers = true)]
    pub margin: Option<f64>,
    /// keep-crop (default) or throughput, as for search.
    #[arg(long, value_parser = named::<Objective>())]
    pub objective: Option<Objective>,
    /// The precisions each search may choose: off (fp32), fp16, bf16,
    /// comma-separated or repeated (default: all each GPU runs). A GPU
    /// that runs none of them gets a row saying so.
    #[arg(long, value_delimiter = ',', value_parser = named::<Amp>(), value_name = "PRECISION")]
    pub amp: Vec<Amp>,
    /// cpu (predict; default) or cuda:N (measure every winner there).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// GPUs training data-parallel (default 1).
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..=MAX_GPUS))]
    pub gpus: Option<i64>,
    /// The PyTorch release to predict for (default 2.11).
    #[arg(long, value_name = "X.Y")]
    pub torch: Option<TorchVersion>,
    /// CPU threads for each traced step.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=4096))]
    pub threads: Option<i32>,
    /// Configs searched at once, each on a thread of its own (default: this
    /// host's cores, at most 8; on Slurm --max-parallel; 1 when measuring on
    /// a CUDA device).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
    #[command(flatten)]
    pub timeouts: TraceTimeoutArgs,
    #[command(flatten)]
    pub scale: ScaleArgs,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub python: super::args::PythonWorkerArgs,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl AtlasArgs {
    /// `--jobs`, or its default for where the searches run.
    fn jobs(&self) -> usize {
        if let Some(n) = self.jobs {
            return n as usize;
        }
        if self.scale.launcher == "slurm" {
            return self.scale.max_parallel.unwrap_or(DEFAULT_MAX_PARALLEL) as usize;
        }
        if self.device != "cpu" {
            return 1;
        }
        crate::trial::host_cores().clamp(1, 8) as usize
    }

    /// The atlas's request (`presets`: the shipped presets' names, for
    /// --all-presets).
    pub fn request(&self, presets: &[&str]) -> crate::search::atlas::AtlasRequest {
        use crate::kinds::GpuChoice;
        use crate::search::atlas::AtlasRequest;
        let mut gpus: Vec<GpuChoice> = if self.all_presets {
            presets.iter().map(|p| GpuChoice::preset(p)).collect()
        } else {
            self.preset.iter().map(|p| GpuChoice::preset(p)).collect()
        };
        gpus.extend(
            self.vram
                .iter()
                .map(|v| GpuChoice::custom(v.clone(), self.compute_capability.clone())),
        );
        let cache_dir = self
            .trace_cache
            .clone()
            .unwrap_or_else(|| self.out.join("trace-cache"));
        AtlasRequest {
            dirs: self.dirs.clone(),
            gpus,
            out: self.out.clone(),
            results: self.results.clone(),
            search: SearchRequest {
                config: PathBuf::new(),
                cfg_options: self.common.cfg_options.clone(),
                settings: SearchSpec {
                    margin: self.margin,
                    objective: self.objective,
                    device: Some(self.device.clone()),
                    gpus: self.gpus,
                    torch: self.torch,
                    ..SearchSpec::default()
                },
                precisions: (!self.amp.is_empty()).then(|| self.amp.clone()),
                mode: crate::kinds::RunMode::Train,
                exhaustive: false,
                out: self.out.clone(),
                run: SearchRun {
                    trace_timeout: self.timeouts.deadline(),
                    threads: self.threads,
                    placement: self.scale.placement(),
                    trace_cache: Some(std::sync::Arc::new(crate::predict::TraceCache::new(
                        cache_dir,
                    ))),
                    python: self.python.worker(),
                    ..SearchRun::default()
                },
            },
            jobs: self.jobs(),
        }
    }
}
