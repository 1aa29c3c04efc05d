//! Where a search's trials run and how many at once: `--devices` (one
//! evaluator per listed device: CUDA devices for real trials, `cpu` for a
//! CPU stand-in that runs traces) and `--launcher slurm` (every worker a
//! Slurm job step, `--max-parallel` at once). See `docs/scale.md`.

use crate::error::{Error, Result};
use crate::worker::launcher::SlurmLauncher;
use crate::worker::Worker;

/// One entry of `--devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSlot {
    /// A CPU stand-in: an evaluator of predictions (traces on this host).
    Cpu,
    /// CUDA device N: real trials there.
    Cuda(usize),
}

/// `--devices`: a comma-separated list of `cpu`, `cuda` (`cuda:0`) and
/// `cuda:N`, or `all` (every visible CUDA device).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Devices {
    List(Vec<DeviceSlot>),
    AllCuda,
}

/// A `--devices` value that names no device list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`--devices {given}`: {why}; write a comma-separated list of cpu, cuda:N (e.g. cuda:0,cuda:1), or all")]
pub struct DevicesError {
    pub given: String,
    pub why: String,
}

/// At most this many devices or Slurm slots (a search has a few dozen
/// candidates; more slots than that only queue).
pub const MAX_SLOTS: usize = 256;

impl std::str::FromStr for Devices {
    type Err = DevicesError;

    fn from_str(s: &str) -> std::result::Result<Devices, DevicesError> {
        let err = |why: String| DevicesError {
            given: s.to_string(),
            why,
        };
        let t = s.trim();
        if t == "all" {
            return Ok(Devices::AllCuda);
        }
        let mut slots = Vec::new();
        for item in t.split(',').map(str::trim) {
            let slot = match item {
                "cpu" => DeviceSlot::Cpu,
                "cuda" => DeviceSlot::Cuda(0),
                "" => return Err(err("an empty entry".into())),
                other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                    Some(Ok(n)) => DeviceSlot::Cuda(n),
                    _ => return Err(err(format!("`{other}` is no device"))),
                },
            };
            slots.push(slot);
        }
        let cuda: Vec<usize> = slots
            .iter()
            .filter_map(|d| match d {
                DeviceSlot::Cuda(n) => Some(*n),
                DeviceSlot::Cpu => None,
            })
            .collect();
        if !cuda.is_empty() && cuda.len() != slots.len() {
            return Err(err(
                "CUDA devices and CPU stand-ins mixed (a search measures on CUDA or predicts on the CPU)"
                    .into(),
            ));
        }
        if let Some(n) = cuda
            .iter()
            .enumerate()
            .find(|(i, n)| cuda[..*i].contains(n))
            .map(|(_, n)| n)
        {
            return Err(err(format!(
                "cuda:{n} listed twice (one worker per device)"
            )));
        }
        if slots.len() > MAX_SLOTS {
            return Err(err(format!("more than {MAX_SLOTS} devices")));
        }
        Ok(Devices::List(slots))
    }
}

impl Devices {
    /// The CUDA devices listed, with `all` as the `visible` ones.
    pub fn cuda(&self, visible: usize) -> Vec<usize> {
        match self {
            Devices::AllCuda => (0..visible).collect(),
            Devices::List(slots) => slots
                .iter()
                .filter_map(|d| match d {
                    DeviceSlot::Cuda(n) => Some(*n),
                    DeviceSlot::Cpu => None,
                })
                .collect(),
        }
    }

    /// Entries of the list (CPU stand-ins or CUDA devices); `all`: `visible`.
    pub fn count(&self, visible: usize) -> usize {
        match self {
            Devices::AllCuda => visible,
            Devices::List(slots) => slots.len(),
        }
    }

    /// Whether the list is CPU stand-ins only (the search predicts).
    pub fn cpu_only(&self) -> bool {
        matches!(self, Devices::List(s) if s.iter().all(|d| *d == DeviceSlot::Cpu))
    }
}

/// `--launcher slurm`'s settings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlurmOptions {
    pub partition: Option<String>,
    pub gpus_per_trial: Option<u32>,
    pub cpus_per_trial: Option<u32>,
    pub time: Option<String>,
    /// Trials (Slurm jobs) at once.
    pub max_parallel: usize,
    pub srun_args: Vec<String>,
}

/// Where a search's trials run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// `--devices` (none: the one device `--device` chooses).
    pub devices: Option<Devices>,
    /// `--launcher slurm` (none: here).
    pub slurm: Option<SlurmOptions>,
    /// Traces run at once on this host when neither `--devices` nor Slurm
    /// says (none: one per core, see `run::trace_slots`); an atlas running
    /// several searches at once gives each 1.
    pub local_traces: Option<usize>,
}

impl Placement {
    /// Evaluators run at once: `--max-parallel` on Slurm, the devices
    /// listed here, else 1.
    pub fn slots(&self, visible_cuda: usize) -> usize {
        match (&self.slurm, &self.devices) {
            (Some(s), _) => s.max_parallel.max(1),
            (None, Some(d)) => d.count(visible_cuda).max(1),
            (None, None) => 1,
        }
    }

    /// `worker`, its trials run where this says: as Slurm job steps of a
    /// search of its own id (the temporary files of traces then under
    /// `out`, which the nodes must share), or here.
    pub fn place(&self, worker: &Worker, out: &std::path::Path) -> Result<Worker> {
        let Some(launcher) = self.launcher(&search_id(out)) else {
            return Ok(worker.clone());
        };
        super::journal::check_out_dir(out)?;
        let tmp = out.join(".segtune-tmp");
        crate::worker::set_temp_root(&tmp)
            .map_err(|e| Error::io(format!("cannot create {}", tmp.display()), e))?;
        Ok(worker.clone().launched_by(std::sync::Arc::new(launcher)))
    }

    /// The Slurm launcher for the search `search_id`, when there is one.
    pub fn launcher(&self, search_id: &str) -> Option<SlurmLauncher> {
        let s = self.slurm.as_ref()?;
        let mut l = SlurmLauncher::new(search_id);
        if let Some(srun) = std::env::var_os("SEGTUNE_SRUN") {
            l.srun = srun;
        }
        if let Some(scancel) = std::env::var_os("SEGTUNE_SCANCEL") {
            l.scancel = scancel;
        }
        if let Some(scontrol) = std::env::var_os("SEGTUNE_SCONTROL") {
            l.scontrol = scontrol;
        }
        l.partition = s.partition.clone();
        l.gpus_per_trial = s.gpus_per_trial;
        l.cpus_per_trial = s.cpus_per_trial;
        l.time = s.time.clone();
        l.extra_args = s.srun_args.clone();
        Some(l)
    }

    /// Refuses what cannot run: `--devices` naming CUDA devices that are
    /// not visible (here; on Slurm the node's are counted by a job).
    pub fn check(&self, visible_cuda: usize) -> Result<()> {
        if let Some(Devices::List(slots)) = &self.devices {
            for d in slots {
                if let DeviceSlot::Cuda(n) = d {
                    if *n >= visible_cuda && self.slurm.is_none() {
                        return Err(Error::Input(format!(
                            "--devices names cuda:{n}, but {visible_cuda} CUDA device(s) are visible"
                        )));
                    }
                }
            }
        }
        if self.slurm.is_some() && self.devices.is_some() {
            return Err(Error::Input(
                "--devices and --launcher slurm: on Slurm each trial gets its GPUs from \
                 --gpus-per-trial and trials run --max-parallel at once; drop --devices"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// A search's id (8 hex digits): its Slurm jobs' names start with
/// `segtune-<id>-`, unique per run (two searches of one config do not
/// cancel each other's jobs).
pub fn search_id(out: &std::path::Path) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let text = format!("{}|{}|{now}", out.display(), std::process::id());
    super::journal::hash_text(&text)[..8].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_parse_and_odd_ones_are_refused_by_value() {
        assert_eq!(
            "cpu,cpu".parse::<Devices>().unwrap(),
            Devices::List(vec![DeviceSlot::Cpu, DeviceSlot::Cpu])
        );
        assert_eq!(
            "cuda:0, cuda:1".parse::<Devices>().unwrap().cuda(0),
            vec![0, 1]
        );
        assert_eq!("all".parse::<Devices>().unwrap().cuda(3), vec![0, 1, 2]);
        assert!("cpu,cpu".parse::<Devices>().unwrap().cpu_only());
        for bad in [
            "",
            "gpu",
            "cuda:x",
            "cpu,cuda:0",
            "cuda:1,cuda:1",
            "cpu,,cpu",
        ] {
            let e = bad.parse::<Devices>().unwrap_err().to_string();
            assert!(e.contains(&format!("`--devices {bad}`")), "{e}");
        }
    }

    #[test]
    fn slots_come_from_slurm_then_devices() {
        let mut p = Placement::default();
        assert_eq!(p.slots(4), 1);
        p.devices = Some(Devices::AllCuda);
        assert_eq!(p.slots(4), 4);
        assert!(p.check(4).is_ok());
        p.devices = Some("cuda:5".parse().unwrap());
        assert!(p.check(2).unwrap_err().to_string().contains("cuda:5"));
        p.devices = None;
        p.slurm = Some(SlurmOptions {
            max_parallel: 3,
            ..SlurmOptions::default()
        });
        assert_eq!(p.slots(0), 3);
        let id = search_id(std::path::Path::new("out"));
        assert_eq!(id.len(), 8);
        assert!(p.launcher(&id).unwrap().job_prefix.starts_with("segtune-"));
    }
}
