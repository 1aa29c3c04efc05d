//! Unit tests of `swin.rs`: names, shapes, the relative position index,
//! padding, frozen stages and refused settings.

use super::*;
use crate::models::component_config::test_support::{dict, to_value};
use crate::models::params::ParamStore;
use serde_json::json;

/// `model.backbone` of `swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py`.
fn swin_t() -> Dict {
    dict(json!({
        "type": "SwinTransformer",
        "pretrain_img_size": 224,
        "embed_dims": 96,
        "patch_size": 4,
        "window_size": 7,
        "mlp_ratio": 4,
        "depths": [2, 2, 6, 2],
        "num_heads": [3, 6, 12, 24],
        "strides": [4, 2, 2, 2],
        "out_indices": [0, 1, 2, 3],
        "qkv_bias": true,
        "qk_scale": null,
        "patch_norm": true,
        "drop_rate": 0.0,
        "attn_drop_rate": 0.0,
        "drop_path_rate": 0.3,
        "use_abs_pos_embed": false,
        "act_cfg": {"type": "GELU"},
        "norm_cfg": {"type": "LN", "requires_grad": true},
        "init_cfg": {"type": "Pretrained", "checkpoint": "swin_tiny.pth"},
    }))
}

#[test]
fn relative_position_index_is_swins() {
    // WindowMSA with window 2: the 4x4 index of the 3x3 bias table.
    let mut store = ParamStore::new(tch::Device::Cpu);
    let mut cfg = SwinConfig::from_cfg(&swin_t()).unwrap();
    cfg.window_size = 2;
    let msa = WindowMsa::new(&mut store.scope("w_msa"), &cfg, 6, 3);
    let got: Vec<i64> = Vec::try_from(msa.relative_position_index.view([-1])).unwrap();
    // torch: WindowMSA(6, 3, (2, 2)).relative_position_index
    assert_eq!(got, vec![4, 3, 1, 0, 5, 4, 2, 1, 7, 6, 4, 3, 8, 7, 5, 4]);
}

#[test]
fn corner_padding_is_adaptive_paddings() {
    assert_eq!(corner_padding((64, 64), 4, 4), None);
    assert_eq!(corner_padding((65, 66), 4, 4), Some((3, 2)));
    assert_eq!(corner_padding((7, 8), 2, 2), Some((1, 0)));
}

#[test]
fn swin_t_has_mmsegs_names_and_output_shapes() {
    let mut store = ParamStore::new(tch::Device::Cpu);
    let backbone = build(&mut store.scope("backbone"), &swin_t()).unwrap();
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[0], "backbone.patch_embed.projection.weight");
    assert!(names.contains(&"backbone.stages.0.blocks.1.attn.w_msa.relative_position_bias_table"));
    assert!(names.contains(&"backbone.stages.2.blocks.5.ffn.layers.0.0.weight"));
    assert!(names.contains(&"backbone.stages.2.downsample.reduction.weight"));
    assert_eq!(*names.last().unwrap(), "backbone.norm3.bias");
    // A size that needs padding in the embedding, the windows and the merges.
    let x = Tensor::zeros([1, 3, 90, 70], (Kind::Float, tch::Device::Cpu));
    let outs = backbone.forward(&x, true);
    let shapes: Vec<Vec<i64>> = outs.iter().map(|o| o.size()).collect();
    assert_eq!(
        shapes,
        vec![
            vec![1, 96, 23, 18],
            vec![1, 192, 12, 9],
            vec![1, 384, 6, 5],
            vec![1, 768, 3, 3]
        ]
    );
}

#[test]
fn frozen_stages_freeze_the_embedding_and_stages() {
    let mut cfg = swin_t();
    cfg.insert("frozen_stages".into(), to_value(&json!(1)));
    let mut store = ParamStore::new(tch::Device::Cpu);
    build(&mut store.scope("backbone"), &cfg).unwrap();
    let frozen: Vec<&str> = store
        .params
        .iter()
        .filter(|p| !p.trainable())
        .map(|p| p.name.as_str())
        .collect();
    assert!(frozen.contains(&"backbone.patch_embed.projection.weight"));
    assert!(frozen.contains(&"backbone.stages.0.downsample.reduction.weight"));
    assert!(frozen.contains(&"backbone.norm0.weight"));
    assert!(!frozen.contains(&"backbone.stages.1.blocks.0.norm1.weight"));
}

#[test]
fn settings_segtune_does_not_implement_are_refused_by_name() {
    for (key, value) in [
        ("attn_drop_rate", json!(0.1)),
        ("act_cfg", json!({"type": "ReLU"})),
        ("norm_cfg", json!({"type": "BN"})),
    ] {
        let mut cfg = swin_t();
        cfg.insert(key.into(), to_value(&value));
        let err = SwinConfig::from_cfg(&cfg).unwrap_err();
        assert!(
            matches!(&err, ModelError::Unsupported { setting, source, .. } if setting == key && source.as_deref() == Some(SOURCE)),
            "{key}: {err}"
        );
    }
}
