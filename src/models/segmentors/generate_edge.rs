//! The training pipeline's `GenerateEdge` (`mmseg/datasets/transforms/
//! transforms.py`, from CE2P, Ruan et al., AAAI 2019, arXiv:1809.05996):
//! an edge map of the label map, 1 where a pixel's label differs from its
//! lower, right or diagonal neighbour (neither ignored), dilated by an
//! `edge_width` square (`cv2.dilate`), packed by `PackSegInputs` as an
//! int64 `1 x H x W` tensor (`gt_edge_map`) beside the label.
//!
//! It is a data-pipeline product: the trial makes it from each synthetic
//! label when it makes the batch, and the data preprocessor pads it as
//! it pads the labels. PIDHead's loss reads it.

use crate::config::{Dict, Value};
use crate::models::component_config::ComponentConfig;
use crate::models::ModelError;
use tch::{Kind, Tensor};

const SOURCE: &str = "mmseg/datasets/transforms/transforms.py";

/// `GenerateEdge(edge_width=3, ignore_index=255)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerateEdge {
    pub edge_width: i64,
    pub ignore_index: i64,
}

impl GenerateEdge {
    /// The `GenerateEdge` step of the config's training pipeline
    /// (`train_dataloader.dataset(.dataset)*.pipeline`, else
    /// `train_pipeline`), if it has one.
    pub fn from_train_pipeline(cfg: &Dict) -> Result<Option<GenerateEdge>, ModelError> {
        let Some(pipeline) = train_pipeline(cfg) else {
            return Ok(None);
        };
        let step = pipeline
            .as_seq()
            .unwrap_or_default()
            .iter()
            .filter_map(Value::as_dict)
            .find(|d| d.get("type").and_then(Value::as_str) == Some("GenerateEdge"));
        let Some(step) = step else {
            return Ok(None);
        };
        let mut c = ComponentConfig::new(step, "GenerateEdge", SOURCE);
        let edge = GenerateEdge {
            edge_width: c.int("edge_width", 3)?,
            ignore_index: c.int("ignore_index", 255)?,
        };
        if edge.edge_width < 1 {
            // cv2.getStructuringElement refuses an empty kernel.
            return Err(c.config_error("edge_width must be at least 1"));
        }
        c.finish()?;
        Ok(Some(edge))
    }

    /// `transform(results)['gt_edge_map']` of one `[1, H, W]` int64 label
    /// map, as `PackSegInputs` hands it over: `[1, H, W]` int64 of 0 and 1.
    pub fn edge_map(&self, label: &Tensor) -> Tensor {
        let seg = label.select(0, 0); // [H, W]
        let (h, w) = (seg.size()[0], seg.size()[1]);
        let mut edge = Tensor::zeros([h, w], (Kind::Bool, seg.device()));
        // (edge rows, cols) marked where seg[rows_a, cols_a] != seg[rows_b, cols_b]:
        // down, left, up-left, up-right, as (start, len) per axis.
        let (dh, dw) = (h - 1, w - 1);
        let marks = [
            ((1, dh), (0, w), (1, dh), (0, w), (0, dh), (0, w)),
            ((0, h), (0, dw), (0, h), (0, dw), (0, h), (1, dw)),
            ((0, dh), (0, dw), (0, dh), (0, dw), (1, dh), (1, dw)),
            ((0, dh), (1, dw), (0, dh), (1, dw), (1, dh), (0, dw)),
        ];
        for (er, ec, ar, ac, br, bc) in marks {
            let part = |t: &Tensor, r: (i64, i64), c: (i64, i64)| {
                t.narrow(0, r.0, r.1).narrow(1, c.0, c.1)
            };
            let (a, b) = (part(&seg, ar, ac), part(&seg, br, bc));
            let differs = a
                .ne_tensor(&b)
                .logical_and(&a.ne(self.ignore_index))
                .logical_and(&b.ne(self.ignore_index));
            let _ = part(&edge, er, ec).logical_or_(&differs);
        }
        // cv2.dilate with a k x k rectangle anchored at (k/2, k/2).
        let k = self.edge_width;
        let (before, after) = (k / 2, k - 1 - k / 2);
        edge = edge
            .to_kind(Kind::Float)
            .view([1, 1, h, w])
            .constant_pad_nd([before, after, before, after])
            .max_pool2d([k, k], [1, 1], [0, 0], [1, 1], false);
        edge.view([1, h, w]).to_kind(Kind::Int64)
    }
}

/// The training pipeline: under `train_dataloader.dataset` (or the
/// `dataset` of dataset wrappers), else the config's `train_pipeline`.
fn train_pipeline(cfg: &Dict) -> Option<&Value> {
    let from_loader = cfg
        .get("train_dataloader")
        .and_then(crate::config::dataloader_pipeline);
    from_loader.or_else(|| cfg.get("train_pipeline"))
}

#[cfg(test)]
#[path = "generate_edge_tests.rs"]
mod tests;
