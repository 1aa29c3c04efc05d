//! Unit tests of `pidnet.rs`: the parameter counts of real configs' backbones, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of pidnet/pidnet-{s,m,l}_2xb6-120k_1024x1024-cityscapes.py
/// (resolved): `channels`, `ppm_channels`, `num_stem_blocks`,
/// `num_branch_blocks`.
fn pidnet(channels: i64, ppm: i64, stem: i64, branch: i64) -> serde_json::Value {
    json!({
        "type": "PIDNet",
        "in_channels": 3,
        "channels": channels,
        "ppm_channels": ppm,
        "num_stem_blocks": stem,
        "num_branch_blocks": branch,
        "align_corners": false,
        "norm_cfg": {"type": "SyncBN", "requires_grad": true},
        "act_cfg": {"type": "ReLU", "inplace": true},
        "init_cfg": {"type": "Pretrained", "checkpoint": "pidnet.pth"}
    })
}

#[test]
fn pidnet_s_m_l_have_mmsegs_parameter_counts() {
    // params_all.json, pidnet/pidnet-{s,m,l}_2xb6-120k_1024x1024-cityscapes.py:
    // params.by_prefix.backbone.total
    assert_eq!(backbone(pidnet(32, 96, 2, 3)).0.total(), 7_475_232);
    assert_eq!(backbone(pidnet(64, 96, 2, 3)).0.total(), 28_240_256);
    assert_eq!(backbone(pidnet(64, 112, 3, 4)).0.total(), 36_343_712);
}

#[test]
fn training_gives_the_p_copy_the_fusion_and_the_d_copy_at_one_eighth() {
    for (stem, branch) in [(2, 3), (3, 4)] {
        let (_, net) = backbone(pidnet(16, 32, stem, branch));
        let outs = net.forward(&image(2, 128, 64), true);
        assert_eq!(
            shapes(&outs),
            [vec![2, 32, 16, 8], vec![2, 64, 16, 8], vec![2, 32, 16, 8]]
        );
        let outs = net.forward(&image(2, 128, 64), false);
        assert_eq!(shapes(&outs), [vec![2, 64, 16, 8]]);
    }
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = backbone_error(with_key(pidnet(32, 96, 2, 3), "with_cp", json!(true)));
    assert!(err.contains("`with_cp`"), "{err}");
}
