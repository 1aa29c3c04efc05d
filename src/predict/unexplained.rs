//! What a GPU run of a model family holds beyond every tensor its step keeps
//! and every kernel scratch segtune models, where a published run shows it
//! and its source is not found: the range's high end covers it, the
//! likeliest figure stays the trace's, and the estimate says so
//! (docs/prediction.md, "What stays under").

use super::estimate::Estimate;

/// One family: its backbone's MMSeg type, the share of the likeliest
/// figure a published run held beyond it, and that run.
#[derive(Debug, Clone, Copy)]
pub struct UnexplainedExcess {
    pub backbone: &'static str,
    /// Published / predicted - 1, rounded up to the percent.
    pub share: f64,
    pub evidence: &'static str,
}

/// The families whose published GPU figure is above the prediction for
/// reasons not found (Fast-SCNN was one until its BCE loss's temporaries
/// were modelled, `kernels::native`). Each model was checked against MMSeg's own step
/// (the Python worker's meta trace: equal within 0.05%), so what is missing
/// is on the GPU side of the 2021-22 stacks: what their CUDA kernels and
/// cuDNN took through the caching allocator beyond the saved tensors.
pub const UNEXPLAINED: &[UnexplainedExcess] = &[
    UnexplainedExcess {
        backbone: "ERFNet",
        share: 0.42,
        evidence: "MMSeg's zoo run erfnet_fcn_4x4_512x1024_160k_cityscapes (log 2022-07-04, 4 V100): 6.04 GiB published, 4.27 GiB predicted",
    },
];

/// The row of `backbone`, if its family has one.
pub fn excess_of(backbone: &str) -> Option<&'static UnexplainedExcess> {
    UNEXPLAINED.iter().find(|u| u.backbone == backbone)
}

/// Widens `e`'s range to cover `backbone`'s unexplained excess and says so
/// in its notes; the likeliest and the least figures do not move.
pub fn widen(e: &mut Estimate, backbone: &str) {
    let Some(u) = excess_of(backbone) else {
        return;
    };
    let covered = (e.predicted_peak_allocated_bytes as f64 * (1.0 + u.share)).ceil() as u64;
    e.predicted_peak_allocated_high_bytes = e.predicted_peak_allocated_high_bytes.max(covered);
    e.notes.push(format!(
        "{backbone}: a published run held {:.0}% more than the likeliest figure for reasons not yet found ({}); the range's high end covers it, the likeliest figure is the trace's",
        u.share * 100.0,
        u.evidence
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_family_is_a_registered_backbone_with_its_evidence() {
        for u in UNEXPLAINED {
            assert!(
                crate::models::backbones::BACKBONE_FACTS
                    .iter()
                    .any(|(name, _)| *name == u.backbone),
                "{}",
                u.backbone
            );
            assert!(u.share > 0.05 && u.share < 1.0 && u.evidence.contains("published"));
        }
        assert!(excess_of("ResNetV1c").is_none());
    }
}
