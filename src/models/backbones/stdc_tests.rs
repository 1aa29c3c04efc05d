//! Unit tests of `stdc.rs`: the parameter counts of real configs' backbones, one forward's shapes, refused keys.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of stdc/stdc1_4xb12-80k_cityscapes-512x1024.py
/// (resolved; tuples as lists), with `stdc_type` and `bottleneck_type`.
fn stdc(stdc_type: &str, bottleneck_type: &str) -> serde_json::Value {
    json!({
        "type": "STDCContextPathNet",
        "backbone_cfg": {
            "type": "STDCNet",
            "stdc_type": stdc_type,
            "in_channels": 3,
            "channels": [32, 64, 256, 512, 1024],
            "bottleneck_type": bottleneck_type,
            "num_convs": 4,
            "norm_cfg": {"type": "BN", "requires_grad": true},
            "act_cfg": {"type": "ReLU"},
            "with_final_conv": false
        },
        "last_in_channels": [1024, 512],
        "out_channels": 128,
        "ffm_cfg": {"in_channels": 384, "out_channels": 256, "scale_factor": 4}
    })
}

#[test]
fn stdc1_and_stdc2_have_mmsegs_parameter_counts() {
    // params_all.json, stdc/stdc1_4xb12-80k_cityscapes-512x1024.py and
    // stdc/stdc2_4xb12-80k_cityscapes-512x1024.py: params.by_prefix.backbone.total;
    // MMSeg's len(list(parameters())), len(list(buffers())) of the backbone.
    let (store, _) = backbone(stdc("STDCNet1", "cat"));
    assert_eq!(store.total(), 7_679_904);
    assert_eq!((store.params.len(), store.buffers.len()), (113, 111));
    let (store, _) = backbone(stdc("STDCNet2", "cat"));
    assert_eq!(store.total(), 11_710_368);
    assert_eq!((store.params.len(), store.buffers.len()), (185, 183));
}

#[test]
fn the_outputs_are_the_shallow_map_the_context_maps_and_the_fusion() {
    // Batch 2: the global pooling's ConvModule has one value per channel,
    // which BatchNorm in training refuses at batch 1.
    for fusion in ["cat", "add"] {
        let (_, net) = backbone(stdc("STDCNet1", fusion));
        let outs = net.forward(&image(2, 64, 64), true);
        // outs[0] (channels[2], 1/8), arms_out (out_channels, 1/16 and 1/8),
        // feat_fuse (ffm out_channels, 1/8).
        assert_eq!(
            shapes(&outs),
            [
                vec![2, 256, 8, 8],
                vec![2, 128, 4, 4],
                vec![2, 128, 8, 8],
                vec![2, 256, 8, 8]
            ],
            "{fusion}"
        );
    }
}

#[test]
fn unknown_keys_are_refused_by_name() {
    let err = backbone_error(with_key(
        stdc("STDCNet1", "cat"),
        "frozen_stages_typo",
        json!(1),
    ));
    assert!(err.contains("`frozen_stages_typo`"), "{err}");
    let err = backbone_error(stdc("STDCNet3", "cat"));
    assert!(
        err.contains("invalid structure STDCNet3 for STDCNet."),
        "{err}"
    );
}

#[test]
fn a_plain_stdc_net_with_add_fusion_and_a_final_conv_is_mmsegs() {
    // MMSeg's STDCNet(stdc_type='STDCNet2', in_channels=3,
    // channels=(32, 64, 256, 512, 1024), bottleneck_type='add', num_convs=3,
    // norm_cfg=dict(type='BN'), act_cfg=dict(type='ReLU'),
    // with_final_conv=True): 11,747,424 parameters in 144 tensors, 144
    // buffers; on a [2, 3, 64, 64] input, maps of 1/8, 1/16, 1/32.
    let (store, net) = backbone(json!({
        "type": "STDCNet",
        "stdc_type": "STDCNet2",
        "in_channels": 3,
        "channels": [32, 64, 256, 512, 1024],
        "bottleneck_type": "add",
        "num_convs": 3,
        "norm_cfg": {"type": "BN"},
        "act_cfg": {"type": "ReLU"},
        "with_final_conv": true
    }));
    assert_eq!(store.total(), 11_747_424);
    assert_eq!((store.params.len(), store.buffers.len()), (144, 144));
    let outs = net.forward(&image(2, 64, 64), true);
    assert_eq!(
        shapes(&outs),
        [vec![2, 256, 8, 8], vec![2, 512, 4, 4], vec![2, 1024, 2, 2]]
    );
}
