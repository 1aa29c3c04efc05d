//! The worker side of the protocol: what `segtune-torch` does with a
//! [`TrialRequest`] (resolve the config, check the model, pick the device,
//! run, write the trace) and with an inspection (build the model, count its
//! parameters). Runs in the process that loads libtorch.

use crate::config::{self, Value};
use crate::error::{Error, Result};
use crate::kinds::DeviceChoice;
use crate::models::{check_supported, EncoderDecoder, ModelError};
use crate::trial::report::PrefixCount;
use crate::trial::{TrialReport, TrialRequest};
use std::path::Path;
use tch::Device;

/// Runs the request's trial in this process. `Err` is for inputs that
/// stop it before any step (a config or model error, a missing device, a
/// trace that cannot be written); everything that happens in the steps is
/// the report's status.
pub fn execute(request: &TrialRequest) -> Result<TrialReport> {
    let cfg = config::resolve(&request.config, &request.cfg_options)?;
    check_supported(&cfg).map_err(|source| Error::Model {
        source,
        config: request.config.clone(),
    })?;
    let device = match request.device {
        DeviceChoice::Cpu => Device::Cpu,
        DeviceChoice::Cuda(i) if (i as i64) < cuda_device_count() => Device::Cuda(i),
        DeviceChoice::Cuda(i) => {
            return Err(Error::Input(format!(
                "--device cuda:{i} requested, but libtorch sees {} CUDA device(s)",
                cuda_device_count()
            )))
        }
    };
    let mut report = crate::trial::run(&cfg, request, device);
    if let (Some(path), Some(trace)) = (&request.trace_out, report.trace.take()) {
        let text =
            crate::trial::trace::to_text_with_work(&trace, &report.kernel_calls, &report.op_work);
        std::fs::write(path, text)
            .map_err(|e| Error::io(format!("cannot write the trace to {}", path.display()), e))?;
    }
    Ok(report)
}

/// The CUDA devices libtorch sees.
pub fn cuda_device_count() -> i64 {
    if tch::Cuda::is_available() {
        tch::Cuda::device_count()
    } else {
        0
    }
}

/// What `segtune inspect` tells about a config's model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelSummary {
    pub config: String,
    pub model_type: Option<String>,
    pub backbone_type: Option<String>,
    pub decode_head_type: Option<String>,
    pub supported: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub params_total: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub params_trainable: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub params_by_prefix: Option<indexmap::IndexMap<String, PrefixCount>>,
    /// Why segtune cannot build it, as the user reads it (`error`'s text).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// Why segtune cannot build it, as data: the parent of the worker
    /// takes the error's kind from here.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<ModelError>,
    /// For a model segtune builds, that the config's `custom_imports` were
    /// read and not imported ([`config::custom_imports_note`]); for types
    /// it does not build, where they would come from and how to let
    /// segtune run that code ([`ModelError::unknown_type_help`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub note: Option<String>,
}

/// Builds the config's model on the CPU (if segtune supports it) and
/// counts its parameters.
pub fn inspect(config_path: &Path, cfg_options: &[String]) -> Result<ModelSummary> {
    let cfg = config::resolve(config_path, cfg_options)?;
    let model_type = |k: &str| {
        cfg.get("model")
            .and_then(|m| m.get_path(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let mut summary = ModelSummary {
        config: config_path.display().to_string(),
        model_type: model_type("type"),
        backbone_type: model_type("backbone.type"),
        decode_head_type: model_type("decode_head.type"),
        supported: false,
        params_total: None,
        params_trainable: None,
        params_by_prefix: None,
        reason: None,
        error: None,
        note: config::custom_imports_note(&cfg),
    };
    // Built on meta kernels: only the shapes are counted, and filling every
    // weight (its initialisation, on the CPU) was most of an inspection.
    // Where the host refuses the meta trace its address space, on the CPU.
    let counter = crate::trial::memory::CpuCounter::install();
    let mut switches = crate::trial::emulation::Switches::new(&counter);
    let _ = switches.trace_ops(crate::trial::memory::OpTrace::Meta);
    match check_supported(&cfg).and_then(|_| EncoderDecoder::build(&cfg, Device::Cpu)) {
        Ok(model) => {
            summary.supported = true;
            summary.params_total = Some(model.params.total());
            summary.params_trainable = Some(model.params.trainable());
            summary.params_by_prefix = Some(
                model
                    .params
                    .by_prefix()
                    .into_iter()
                    .map(|(k, total, trainable)| (k, PrefixCount { total, trainable }))
                    .collect(),
            );
        }
        Err(e) => {
            summary.reason = Some(e.to_string());
            summary.note = e.unknown_type_help(&config::custom_imports(&cfg), config_path);
            summary.error = Some(e);
        }
    }
    Ok(summary)
}
