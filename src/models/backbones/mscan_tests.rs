//! Unit tests of `mscan.rs`: the parameter counts of the real configs'
//! backbones, the four stages' shapes, refused settings.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of segnext/segnext_mscan-t_1xb16-adamw-160k_ade20k-512x512.py
/// (resolved; the checkpoint dropped).
fn mscan_t() -> serde_json::Value {
    json!({
        "type": "MSCAN", "init_cfg": null,
        "embed_dims": [32, 64, 160, 256], "mlp_ratios": [8, 8, 4, 4],
        "drop_rate": 0.0, "drop_path_rate": 0.1, "depths": [3, 3, 5, 2],
        "attention_kernel_sizes": [5, [1, 7], [1, 11], [1, 21]],
        "attention_kernel_paddings": [2, [0, 3], [0, 5], [0, 10]],
        "act_cfg": {"type": "GELU"}, "norm_cfg": {"type": "BN", "requires_grad": true}
    })
}

#[test]
fn the_four_sizes_have_mmsegs_parameter_counts() {
    // params_all.json, segnext/segnext_mscan-{t,s,b,l}_*: by_prefix.backbone.total.
    assert_eq!(backbone(mscan_t()).0.total(), 3_903_584);
    let s = with_key(mscan_t(), "embed_dims", json!([64, 128, 320, 512]));
    let s = with_key(s, "depths", json!([2, 2, 4, 2]));
    assert_eq!(backbone(s.clone()).0.total(), 13_450_176);
    let b = with_key(s, "depths", json!([3, 3, 12, 3]));
    assert_eq!(backbone(b.clone()).0.total(), 26_277_824);
    let l = with_key(b, "depths", json!([3, 5, 27, 3]));
    assert_eq!(backbone(l).0.total(), 44_636_864);
}

#[test]
fn every_stage_is_an_output_at_strides_4_to_32() {
    let (store, net) = backbone(mscan_t());
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[0], "backbone.patch_embed1.proj.0.weight");
    assert!(names.contains(&"backbone.block1.0.attn.spatial_gating_unit.conv2_2.weight"));
    let first_block = names
        .iter()
        .position(|n| n.starts_with("backbone.block1.0."))
        .unwrap();
    assert_eq!(names[first_block], "backbone.block1.0.layer_scale_1");
    let outs = net.forward(&image(2, 64, 64), true);
    assert_eq!(
        shapes(&outs),
        [
            vec![2, 32, 16, 16],
            vec![2, 64, 8, 8],
            vec![2, 160, 4, 4],
            vec![2, 256, 2, 2]
        ]
    );
}

#[test]
fn other_activations_and_kernel_lists_are_refused() {
    let err = backbone_error(with_key(mscan_t(), "act_cfg", json!({"type": "ReLU"})));
    assert!(err.contains("`act_cfg`"), "{err}");
    let err = backbone_error(with_key(
        mscan_t(),
        "attention_kernel_sizes",
        json!([5, [1, 7]]),
    ));
    assert!(err.contains("need 4 entries"), "{err}");
    let err = backbone_error(with_key(mscan_t(), "with_cp", json!(true)));
    assert!(err.contains("`with_cp`"), "{err}");
}
