//! Unit tests of `beit.rs`: the parameter count of a real config's backbone,
//! the relative position index, one forward's shapes, refused settings.
use super::relative_position_index;
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py
/// (resolved; tuples as lists).
fn beit_base() -> serde_json::Value {
    json!({
        "type": "BEiT", "img_size": [640, 640], "patch_size": 16, "in_channels": 3,
        "embed_dims": 768, "num_layers": 12, "num_heads": 12, "mlp_ratio": 4,
        "out_indices": [3, 5, 7, 11], "qv_bias": true, "attn_drop_rate": 0.0,
        "drop_path_rate": 0.1, "norm_cfg": {"type": "LN", "eps": 1e-06},
        "act_cfg": {"type": "GELU"}, "norm_eval": false, "init_values": 0.1
    })
}

/// A small BEiT for forward tests: a 4x4 patch grid at 64x64.
fn tiny() -> serde_json::Value {
    json!({
        "type": "BEiT", "img_size": 64, "embed_dims": 32, "num_layers": 4,
        "num_heads": 2, "out_indices": [1, 3], "drop_path_rate": 0.1
    })
}

#[test]
fn beit_base_has_mmsegs_parameter_and_buffer_counts() {
    // params_all.json, beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py:
    // params.by_prefix.backbone.total; one relative_position_index per layer.
    let (store, _) = backbone(beit_base());
    assert_eq!(store.total(), 86_554_176);
    assert_eq!(store.buffers.len(), 12);
}

#[test]
fn the_parameters_are_named_and_ordered_as_in_the_state_dict() {
    let (store, _) = backbone(tiny());
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names[..8],
        [
            "backbone.cls_token",
            "backbone.patch_embed.projection.weight",
            "backbone.patch_embed.projection.bias",
            "backbone.layers.0.gamma_1",
            "backbone.layers.0.gamma_2",
            "backbone.layers.0.ln1.weight",
            "backbone.layers.0.ln1.bias",
            "backbone.layers.0.attn.q_bias",
        ]
    );
    assert!(names.contains(&"backbone.layers.3.ffn.layers.0.0.weight"));
    assert!(names.contains(&"backbone.layers.3.attn.relative_position_bias_table"));
}

#[test]
fn the_relative_position_index_matches_beit_py() {
    // beit.py's construction for window_size (2, 2), as torch computes it:
    // the class token's row is 12 - 3, its column 12 - 2, its corner 12 - 1.
    let index = relative_position_index(2, 2);
    #[rustfmt::skip]
    let expected = vec![
        11, 9, 9, 9, 9,
        10, 4, 3, 1, 0,
        10, 5, 4, 2, 1,
        10, 7, 6, 4, 3,
        10, 8, 7, 5, 4,
    ];
    assert_eq!(index, expected);
}

#[test]
fn each_output_index_gives_a_patch_grid_map() {
    let (_, net) = backbone(tiny());
    let outs = net.forward(&image(2, 64, 64), true);
    assert_eq!(shapes(&outs), [vec![2, 32, 4, 4], vec![2, 32, 4, 4]]);
}

#[test]
#[should_panic(expected = "must match the size of tensor b (17)")]
fn a_crop_of_another_patch_grid_fails_as_in_mmseg() {
    let (_, net) = backbone(tiny());
    net.forward(&image(1, 32, 32), true);
}

#[test]
fn settings_segtune_does_not_build_are_refused_by_name() {
    let err = backbone_error(with_key(tiny(), "num_fcs", json!(3)));
    assert!(err.contains("`num_fcs`"), "{err}");
    let err = backbone_error(with_key(tiny(), "act_cfg", json!({"type": "ReLU"})));
    assert!(err.contains("`act_cfg`"), "{err}");
    let err = backbone_error(with_key(tiny(), "with_cp", json!(true)));
    assert!(err.contains("`with_cp`"), "{err}");
    let err = backbone_error(with_key(tiny(), "num_heads", json!(3)));
    assert!(err.contains("num_heads=3"), "{err}");
}
