//! One inference step, as MMEngine's `TestLoop.run_iter` runs it: under
//! `torch.no_grad()` and `autocast(enabled=fp16)`, `model.test_step(data)`
//! (the data preprocessor's test path, then `predict` with
//! `model.test_cfg`), the predictions kept until the step ends (the
//! evaluator reads them), then the batch and the predictions freed.

use super::batch::Batch;
use super::error::TrialError;
use super::memory::{CpuCounter, Phase};
use super::run::PhasePeaks;
use super::trace::phase_code;
use super::TrialRequest;
use crate::models::EncoderDecoder;
use tch::Tensor;

/// Runs one test step; its peak is the forward phase's (the other two are 0).
pub fn infer_step(
    model: &EncoderDecoder,
    batch: Batch,
    request: &TrialRequest,
    counter: &CpuCounter,
    base: i64,
    step: usize,
) -> Result<(PhasePeaks, Vec<(String, Tensor)>), TrialError> {
    let Batch { images, labels, .. } = batch;
    let device = model.device();
    let (h, w) = request.crop;
    let predictions = tch::no_grad(|| -> Result<_, TrialError> {
        let _autocast = super::run::autocast(request, device)?;
        counter.set_phase_code(phase_code(step, Phase::Preprocess));
        // `cast_data` copies the labels to the device with the images.
        let labels_on_device: Vec<Tensor> = labels.iter().map(|l| l.to_device(device)).collect();
        let (inputs, paddings) = model.preprocess_test(&images)?;
        counter.set_phase_code(phase_code(step, Phase::Forward));
        let predictions = model.predict(&inputs, &paddings, (h, w));
        drop(inputs);
        Ok((predictions, labels_on_device))
    })?;
    let forward_peak = counter.peak() - base;
    drop(predictions);
    drop(images);
    drop(labels);
    Ok((
        PhasePeaks {
            forward: forward_peak,
            backward: 0,
            optimizer: 0,
        },
        Vec::new(),
    ))
}
