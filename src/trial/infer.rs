//! One inference step, as MMEngine's `TestLoop.run_iter` runs it: under
//! `torch.no_grad()` and `autocast(enabled=fp16)`, `model.test_step(data)`
//! (the data preprocessor's test path, then `predict` with
//! `model.test_cfg`), the predictions kept until the step ends (the
//! evaluator reads them), then the batch and the predictions freed.

use super::batch::Batch;
use super::error::TrialError;
use super::memory::Phase;
use super::run::{PhasePeaks, StepClock};
use super::TrialRequest;
use crate::models::EncoderDecoder;
use tch::Tensor;

/// Runs one test step; its peak is the forward phase's (the other two are 0).
pub(super) fn infer_step(
    model: &EncoderDecoder,
    batch: Batch,
    request: &TrialRequest,
    clock: StepClock,
) -> Result<(PhasePeaks, Vec<(String, Tensor)>), TrialError> {
    let Batch { images, labels, .. } = batch;
    let device = model.device();
    let (h, w) = request.crop;
    let predictions = tch::no_grad(|| -> Result<_, TrialError> {
        let _autocast = super::run::autocast(request, device)?;
        clock.enter(Phase::Preprocess);
        // `cast_data` copies the labels to the device with the images.
        let labels_on_device: Vec<Tensor> = labels.iter().map(|l| l.to_device(device)).collect();
        let (inputs, paddings) = model.preprocess_test(&images)?;
        clock.enter(Phase::Forward);
        let predictions = model.predict(&inputs, &paddings, (h, w));
        drop(inputs);
        Ok((predictions, labels_on_device))
    })?;
    let forward_peak = clock.peak();
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
