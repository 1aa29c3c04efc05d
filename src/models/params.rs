//! Parameters and buffers of a model, in registration order (the order
//! PyTorch's `named_parameters()` gives, which the optimizer follows), with
//! MMSeg's dotted names (`backbone.layers.0.0.projection.weight`).

use tch::{Device, Kind, Tensor};

/// One parameter.
pub struct Param {
    pub name: String,
    pub tensor: Tensor,
}

impl Param {
    pub fn trainable(&self) -> bool {
        self.tensor.requires_grad()
    }
    pub fn numel(&self) -> i64 {
        self.tensor.numel() as i64
    }
}

/// Every parameter and buffer of a model.
pub struct ParamStore {
    device: Device,
    pub params: Vec<Param>,
    pub buffers: Vec<(String, Tensor)>,
}

impl ParamStore {
    pub fn new(device: Device) -> ParamStore {
        ParamStore {
            device,
            params: Vec::new(),
            buffers: Vec::new(),
        }
    }

    /// A scope that names parameters under `prefix`.
    pub fn scope(&mut self, prefix: &str) -> ParamScope<'_> {
        ParamScope {
            store: self,
            prefix: prefix.to_string(),
        }
    }

    pub fn total(&self) -> i64 {
        self.params.iter().map(Param::numel).sum()
    }

    pub fn trainable(&self) -> i64 {
        self.params
            .iter()
            .filter(|p| p.trainable())
            .map(Param::numel)
            .sum()
    }

    /// Parameter counts (total, trainable) per first name component.
    pub fn by_prefix(&self) -> Vec<(String, i64, i64)> {
        let mut out: Vec<(String, i64, i64)> = Vec::new();
        for p in &self.params {
            let prefix = p.name.split('.').next().unwrap_or("").to_string();
            let trainable = if p.trainable() { p.numel() } else { 0 };
            match out.iter_mut().find(|(k, _, _)| *k == prefix) {
                Some(entry) => {
                    entry.1 += p.numel();
                    entry.2 += trainable;
                }
                None => out.push((prefix, p.numel(), trainable)),
            }
        }
        out
    }

    pub fn param_bytes(&self) -> i64 {
        self.params
            .iter()
            .map(|p| p.numel() * p.tensor.kind().elt_size_in_bytes() as i64)
            .sum()
    }

    pub fn buffer_bytes(&self) -> i64 {
        self.buffers
            .iter()
            .map(|(_, b)| b.numel() as i64 * b.kind().elt_size_in_bytes() as i64)
            .sum()
    }
}

/// Names parameters under a dotted prefix while a model is built.
pub struct ParamScope<'a> {
    store: &'a mut ParamStore,
    prefix: String,
}

impl ParamScope<'_> {
    pub fn device(&self) -> Device {
        self.store.device
    }

    /// A nested scope (`sub("layers").sub("0")`).
    pub fn sub(&mut self, name: impl std::fmt::Display) -> ParamScope<'_> {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        ParamScope {
            store: self.store,
            prefix,
        }
    }

    fn register(&mut self, name: &str, init: Tensor) -> Tensor {
        let tensor = init.set_requires_grad(true);
        let full = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        self.store.params.push(Param {
            name: full,
            tensor: tensor.shallow_clone(),
        });
        tensor
    }

    pub fn param_normal(&mut self, name: &str, shape: &[i64], std: f64) -> Tensor {
        let t =
            tch::no_grad(|| Tensor::empty(shape, (Kind::Float, self.device())).normal_(0.0, std));
        self.register(name, t)
    }

    pub fn param_uniform(&mut self, name: &str, shape: &[i64], bound: f64) -> Tensor {
        let t = tch::no_grad(|| {
            Tensor::empty(shape, (Kind::Float, self.device())).uniform_(-bound, bound)
        });
        self.register(name, t)
    }

    pub fn param_zeros(&mut self, name: &str, shape: &[i64]) -> Tensor {
        let t = Tensor::zeros(shape, (Kind::Float, self.device()));
        self.register(name, t)
    }

    pub fn param_ones(&mut self, name: &str, shape: &[i64]) -> Tensor {
        let t = Tensor::ones(shape, (Kind::Float, self.device()));
        self.register(name, t)
    }

    /// Marks the last `n` registered parameters as frozen (`requires_grad=False`).
    pub fn freeze_last(&mut self, n: usize) {
        let len = self.store.params.len();
        for p in &mut self.store.params[len.saturating_sub(n)..] {
            let _ = p.tensor.set_requires_grad(false);
        }
    }

    /// How many parameters the model has so far (a mark for [`Self::freeze_since`]).
    pub fn registered(&self) -> usize {
        self.store.params.len()
    }

    /// Freezes (`requires_grad=False`) every parameter registered since
    /// `mark` (a [`Self::registered`] count): what `param.requires_grad =
    /// False` over a module's `parameters()` does.
    pub fn freeze_since(&mut self, mark: usize) {
        for p in &mut self.store.params[mark..] {
            let _ = p.tensor.set_requires_grad(false);
        }
    }

    pub fn buffer(&mut self, name: &str, t: Tensor) -> Tensor {
        let full = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        self.store.buffers.push((full, t.shallow_clone()));
        t
    }
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
