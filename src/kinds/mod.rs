//! The settings every layer names, on the ground floor so that nothing
//! imports upward for them: mixed precision ([`Amp`]), where and what a
//! trial runs ([`DeviceChoice`], [`RunMode`]), the PyTorch and mmcv
//! releases a trial or prediction reproduces ([`TorchVersion`] and its
//! switch table, [`MmcvVersion`] and its), and the training run around the
//! step ([`TrainingSetup`]), and the GPU a user names ([`GpuChoice`]). They hold values and their names, nothing that
//! runs.

pub mod amp;
pub mod gpu;
pub mod mmcv_version;
pub mod run;
pub mod setup;
pub mod torch_version;

pub use amp::Amp;
pub use gpu::{GpuChoice, Vram, VramError};
pub use mmcv_version::{MmcvSwitch, MmcvVersion};
pub use run::{DeviceChoice, RunMode, UnknownDevice};
pub use setup::{Stack, TrainingSetup};
pub use torch_version::{Switch, TorchVersion, VersionSource};
