//! Unit tests of `stdc_head.rs`: the parameter count of a real config's head, one loss's items, a refused key.
use crate::models::component_config::test_support::{features, head, head_error, with_key};
use serde_json::json;
use tch::{Device, Kind, Tensor};

/// `model.auxiliary_head[2]` of stdc/stdc1_4xb12-80k_cityscapes-512x1024.py
/// (resolved).
fn stdc_head() -> serde_json::Value {
    json!({
        "type": "STDCHead",
        "in_channels": 256,
        "channels": 64,
        "num_convs": 1,
        "num_classes": 2,
        "boundary_threshold": 0.1,
        "in_index": 0,
        "norm_cfg": {"type": "BN", "requires_grad": true},
        "concat_input": false,
        "align_corners": true,
        "loss_decode": [
            {"type": "CrossEntropyLoss", "loss_name": "loss_ce", "use_sigmoid": true, "loss_weight": 1.0},
            {"type": "DiceLoss", "loss_name": "loss_dice", "loss_weight": 1.0}
        ]
    })
}

#[test]
fn stdc_head_has_mmsegs_parameter_count() {
    // MMSeg's STDCHead of stdc/stdc1_4xb12-80k_cityscapes-512x1024.py
    // (auxiliary_head.2): 147,717 parameters, 6 tensors, 4 buffers, the
    // frozen fusion_kernel (3) and the laplacian_kernel first.
    let (store, _) = head(stdc_head(), "auxiliary_head.2");
    assert_eq!((store.total(), store.trainable()), (147_717, 147_714));
    assert_eq!((store.params.len(), store.buffers.len()), (6, 4));
    assert_eq!(store.params[0].name, "auxiliary_head.2.fusion_kernel");
    assert_eq!(store.buffers[0].0, "auxiliary_head.2.laplacian_kernel");
}

#[test]
fn the_loss_is_taken_against_the_boundary_targets() {
    let (_, head) = head(stdc_head(), "auxiliary_head.2");
    let feats = features(2, &[(256, 8, 8)]);
    assert_eq!(head.forward(&feats, None, true).size(), [2, 2, 8, 8]);
    // Two classes split down the middle: a boundary to find.
    let labels: Vec<Tensor> = (0..2)
        .map(|_| {
            let half = Tensor::zeros([1, 32, 16], (Kind::Int64, Device::Cpu));
            Tensor::cat(&[&half, &half.ones_like()], 2)
        })
        .collect();
    let losses = head.loss(&feats, None, &labels);
    let names: Vec<&str> = losses.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["loss_ce", "loss_dice", "acc_seg"]);
    for (name, value) in &losses {
        assert!(value.double_value(&[]).is_finite(), "{name}");
    }
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = head_error(with_key(stdc_head(), "pool_scales", json!([1, 2])));
    assert!(err.contains("`pool_scales`"), "{err}");
}

#[test]
fn the_boundary_targets_and_losses_are_mmsegs() {
    // MMSeg's STDCHead.loss_by_feat on these labels and logits (the
    // labels BaseDecodeHead receives summed per image, and the loss items):
    // [565, 565], loss_ce 0.7042245, loss_dice 0.3386390, acc_seg 47.558594.
    let cfg = super::StdcHeadCfg::from_cfg(&crate::models::component_config::test_support::dict(
        stdc_head(),
    ))
    .unwrap();
    let mut store = crate::models::params::ParamStore::new(Device::Cpu);
    let head = super::StdcHead::new(&mut store.scope("h"), cfg);
    let opts = (Kind::Int64, Device::Cpu);
    let (i, j) = (
        Tensor::arange(32, opts).view([32, 1]),
        Tensor::arange(32, opts).view([1, 32]),
    );
    let lab = (i.divide_scalar_mode(3, "floor") + j.divide_scalar_mode(5, "floor")).remainder(4);
    let _ = lab.narrow(0, 20, 4).narrow(1, 4, 8).fill_(255);
    let labels = [lab.unsqueeze(0), lab.tr().contiguous().unsqueeze(0)];
    let targets = head.boundary_targets(&labels);
    let sums: Vec<i64> = targets
        .labels
        .iter()
        .map(|t| t.sum(Kind::Int64).int64_value(&[]))
        .collect();
    assert_eq!(sums, [565, 565]);
    let logits = (Tensor::arange(2 * 2 * 8 * 8, (Kind::Float, Device::Cpu))
        .view([2, 2, 8, 8])
        .remainder(5)
        - 2.0)
        / 3.0;
    let losses = head.loss_by_feat(&logits, &labels);
    let want = [0.704_224_5, 0.338_639_0, 47.558_594];
    for ((name, got), want) in losses.iter().zip(want) {
        let got = got.double_value(&[]);
        assert!((got - want).abs() < 1e-5, "{name}: {got} vs {want}");
    }
}
