//! What every segmentor's training step shares: mmengine's
//! `BaseModel.parse_losses` (`mmengine/model/base_model/base_model.py`),
//! which turns the loss items of `loss()` into the total loss and the
//! logged values.

use tch::{Device, Kind, Tensor};

/// The losses of one training forward, as `parse_losses` sums them.
pub struct StepLosses {
    /// The total loss (sum of every `loss*` item).
    pub loss: Tensor,
    /// `(name, value)` of every logged item (`decode.loss_ce`, `decode.acc_seg`).
    pub items: Vec<(String, Tensor)>,
}

/// mmengine's `BaseModel.parse_losses`: the mean of every item, and their
/// sum over the items whose name contains `loss`.
pub fn parse_losses(items: Vec<(String, Tensor)>) -> StepLosses {
    let items: Vec<(String, Tensor)> = items
        .into_iter()
        .map(|(n, v)| (n, v.mean(None::<Kind>)))
        .collect();
    let mut loss: Option<Tensor> = None;
    for (name, v) in &items {
        if name.contains("loss") {
            loss = Some(match loss {
                None => v + 0.0,
                Some(acc) => acc + v,
            });
        }
    }
    let loss = loss.unwrap_or_else(|| Tensor::zeros([], (Kind::Float, Device::Cpu)));
    StepLosses { loss, items }
}

#[cfg(test)]
#[path = "base_tests.rs"]
mod tests;
