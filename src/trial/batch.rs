//! The synthetic training batch of a trial, shaped like the recipe's.

use super::TrialRequest;
use crate::models::segmentors::generate_edge::GenerateEdge;
use tch::{Device, Kind, Tensor};

/// One synthetic batch: `images` are `3 x H x W` float32 holding integers
/// 0..255 (BGR, as MMSeg's loader hands them over), `labels` are
/// `1 x H x W` int64 class maps, on the CPU. For a model that takes
/// `pixel_values` (Hugging Face), one `B x 3 x H x W` float32 tensor of
/// normalised values and one `B x H x W` label tensor, as transformers'
/// data collator stacks them. `edges` are the labels' `1 x H x W` int64
/// edge maps when the pipeline's `GenerateEdge` makes them (PIDNet), else
/// empty.
pub struct Batch {
    pub images: Vec<Tensor>,
    pub labels: Vec<Tensor>,
    pub edges: Vec<Tensor>,
}

impl Batch {
    pub fn synthetic(
        request: &TrialRequest,
        num_classes: i64,
        ignore_index: i64,
        pixel_values: bool,
        edge_maps: Option<GenerateEdge>,
    ) -> Batch {
        let (h, w) = request.crop;
        if pixel_values {
            let b = request.batch_size;
            let images = Tensor::randn([b, 3, h, w], (Kind::Float, Device::Cpu));
            let classes = request
                .gt_segments
                .map_or(num_classes, |g| g.min(num_classes));
            let mut labels = Tensor::randint(classes, [b, h, w], (Kind::Int64, Device::Cpu));
            if request.ignore_fraction > 0.0 {
                let mask =
                    Tensor::rand([b, h, w], (Kind::Float, Device::Cpu)).lt(request.ignore_fraction);
                let _ = labels.masked_fill_(&mask, ignore_index);
            }
            return Batch {
                images: vec![images],
                labels: vec![labels],
                edges: Vec::new(),
            };
        }
        let mut images = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..request.batch_size {
            images.push(
                Tensor::randint(256, [3, h, w], (Kind::Int64, Device::Cpu)).to_kind(Kind::Float),
            );
            let classes = request
                .gt_segments
                .map_or(num_classes, |g| g.min(num_classes));
            let mut label = Tensor::randint(classes, [1, h, w], (Kind::Int64, Device::Cpu));
            if request.ignore_fraction > 0.0 {
                let mask =
                    Tensor::rand([1, h, w], (Kind::Float, Device::Cpu)).lt(request.ignore_fraction);
                let _ = label.masked_fill_(&mask, ignore_index);
            }
            labels.push(label);
        }
        // The pipeline's GenerateEdge, after the label is final.
        let edges = match edge_maps {
            Some(g) => labels.iter().map(|l| g.edge_map(l)).collect(),
            None => Vec::new(),
        };
        Batch {
            images,
            labels,
            edges,
        }
    }

    pub fn bytes(&self) -> i64 {
        self.images
            .iter()
            .chain(&self.labels)
            .chain(&self.edges)
            .map(|t| t.numel() as i64 * t.kind().elt_size_in_bytes() as i64)
            .sum()
    }
}
