//! mmcv's `FFN` (`mmcv/cnn/bricks/transformer.py`) with two fully connected
//! layers: `layers.0.0` (Linear), its activation and dropout, `layers.1`
//! (Linear), dropout, then the identity added through the `dropout_layer`
//! (a `DropPath`, or none).

use super::{DropPath, Linear};
use crate::models::params::ParamScope;
use tch::Tensor;

/// The `act_cfg` of an FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// `dict(type='ReLU', inplace=True)`, mmcv's default: in place on fc1's output.
    Relu,
    /// `dict(type='GELU')`.
    Gelu,
}

pub struct Ffn {
    fc1: Linear,
    fc2: Linear,
    activation: FfnActivation,
    /// `ffn_drop`.
    drop: f64,
    /// The `dropout_layer` (a zero-probability `DropPath` for none).
    drop_path: DropPath,
}

impl Ffn {
    /// `p`: the FFN's own scope (`...ffn`).
    pub fn new(
        p: &mut ParamScope,
        embed_dims: i64,
        feedforward_channels: i64,
        activation: FfnActivation,
        drop: f64,
        drop_path: f64,
    ) -> Ffn {
        let mut layers = p.sub("layers");
        let fc1 = Linear::new(
            &mut layers.sub(0).sub(0),
            embed_dims,
            feedforward_channels,
            true,
        );
        let fc2 = Linear::new(&mut layers.sub(1), feedforward_channels, embed_dims, true);
        Ffn {
            fc1,
            fc2,
            activation,
            drop,
            drop_path: DropPath { prob: drop_path },
        }
    }

    /// A GELU FFN, as every ViT-family layer builds it.
    pub fn gelu(
        p: &mut ParamScope,
        embed_dims: i64,
        feedforward_channels: i64,
        drop: f64,
        drop_path: f64,
    ) -> Ffn {
        let activation = FfnActivation::Gelu;
        Ffn::new(
            p,
            embed_dims,
            feedforward_channels,
            activation,
            drop,
            drop_path,
        )
    }

    /// `identity + dropout_layer(layers(x))`.
    pub fn forward(&self, x: &Tensor, identity: &Tensor, training: bool) -> Tensor {
        let (out, dropped) = self.layers_and_drop(x, training);
        // Python's `out` lives until forward returns, past the add.
        let sum = identity + dropped;
        drop(out);
        sum
    }

    /// `FFN(add_identity=False)`: `dropout_layer(layers(x))`.
    pub fn forward_no_identity(&self, x: &Tensor, training: bool) -> Tensor {
        self.layers_and_drop(x, training).1
    }

    /// `layers(x)` and `dropout_layer` of it.
    fn layers_and_drop(&self, x: &Tensor, training: bool) -> (Tensor, Tensor) {
        // nn.Sequential keeps only the latest output.
        let mut out = self.fc1.forward(x);
        out = match self.activation {
            FfnActivation::Relu => {
                let _ = out.relu_();
                out
            }
            FfnActivation::Gelu => out.gelu("none"),
        };
        out = out.dropout(self.drop, training);
        out = self.fc2.forward(&out);
        out = out.dropout(self.drop, training);
        let dropped = self.drop_path.forward(&out, training);
        (out, dropped)
    }
}

#[cfg(test)]
#[path = "ffn_tests.rs"]
mod tests;
