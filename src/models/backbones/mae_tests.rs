//! Unit tests of `mae.rs`: the parameter count of a real config's backbone,
//! the position embedding's place, one forward's shapes, a refused key.
use crate::models::component_config::test_support::{
    backbone, backbone_error, image, shapes, with_key,
};
use serde_json::json;

/// `model.backbone` of mae/mae-base_upernet_8xb2-amp-160k_ade20k-512x512.py
/// (resolved; tuples as lists).
fn mae_base() -> serde_json::Value {
    json!({
        "type": "MAE", "img_size": [512, 512], "patch_size": 16, "embed_dims": 768,
        "num_layers": 12, "num_heads": 12, "mlp_ratio": 4, "init_values": 1.0,
        "drop_path_rate": 0.1, "out_indices": [3, 5, 7, 11]
    })
}

fn tiny() -> serde_json::Value {
    json!({
        "type": "MAE", "img_size": 64, "embed_dims": 32, "num_layers": 2,
        "num_heads": 2, "out_indices": [1]
    })
}

#[test]
fn mae_base_has_mmsegs_parameter_and_buffer_counts() {
    // params_all.json, mae/mae-base_upernet_8xb2-amp-160k_ade20k-512x512.py:
    // params.by_prefix.backbone.total
    let (store, _) = backbone(mae_base());
    assert_eq!(store.total(), 87_023_424);
    assert_eq!(store.buffers.len(), 12);
}

#[test]
fn pos_embed_follows_cls_token_and_qkv_has_a_bias() {
    let (store, _) = backbone(tiny());
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[..2], ["backbone.cls_token", "backbone.pos_embed"]);
    assert!(names.contains(&"backbone.layers.0.attn.qkv.bias"));
    assert!(!names.contains(&"backbone.layers.0.attn.q_bias"));
}

#[test]
fn the_output_is_a_patch_grid_map() {
    let (_, net) = backbone(tiny());
    assert_eq!(
        shapes(&net.forward(&image(1, 64, 64), true)),
        [vec![1, 32, 4, 4]]
    );
}

#[test]
#[should_panic(expected = "against pos_embed made for img_size")]
fn a_crop_of_another_patch_grid_fails_at_the_position_embedding() {
    let (_, net) = backbone(tiny());
    net.forward(&image(1, 128, 128), true);
}

#[test]
fn qv_bias_is_not_an_argument_of_mae() {
    let err = backbone_error(with_key(tiny(), "qv_bias", json!(true)));
    assert!(err.contains("MAE `qv_bias`"), "{err}");
}
