//! Unit tests of `ham_head.rs`: the parameter counts of the real configs'
//! heads and their names, one forward's shape, refused settings.
use crate::models::component_config::test_support::{features, head, head_error, with_key};
use serde_json::json;

/// `model.decode_head` of segnext/segnext_mscan-t_1xb16-adamw-160k_ade20k-512x512.py
/// (resolved).
fn mscan_t_head() -> serde_json::Value {
    json!({
        "type": "LightHamHead", "in_channels": [64, 160, 256], "in_index": [1, 2, 3],
        "channels": 256, "ham_channels": 256, "dropout_ratio": 0.1, "num_classes": 150,
        "norm_cfg": {"type": "GN", "num_groups": 32, "requires_grad": true},
        "align_corners": false,
        "loss_decode": {"type": "CrossEntropyLoss", "use_sigmoid": false, "loss_weight": 1.0},
        "ham_kwargs": {"MD_S": 1, "MD_R": 16, "train_steps": 6, "eval_steps": 7,
                       "inv_t": 100, "rand_init": true}
    })
}

#[test]
fn the_four_heads_have_mmsegs_parameter_counts() {
    // params_all.json, segnext/segnext_mscan-{t,s,b,l}_*: by_prefix.decode_head.total.
    let (store, _) = head(mscan_t_head(), "decode_head");
    assert_eq!(store.total(), 359_830);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        &names[..5],
        [
            "decode_head.conv_seg.weight",
            "decode_head.conv_seg.bias",
            "decode_head.squeeze.conv.weight",
            "decode_head.squeeze.gn.weight",
            "decode_head.squeeze.gn.bias",
        ]
    );
    assert!(names.contains(&"decode_head.hamburger.ham_in.conv.bias"));
    assert!(names.contains(&"decode_head.hamburger.ham_out.gn.weight"));
    let s = with_key(mscan_t_head(), "in_channels", json!([128, 320, 512]));
    assert_eq!(head(s.clone(), "decode_head").0.total(), 482_710);
    let b = with_key(
        with_key(s, "channels", json!(512)),
        "ham_channels",
        json!(512),
    );
    assert_eq!(head(b.clone(), "decode_head").0.total(), 1_358_486);
    let l = with_key(
        with_key(b, "channels", json!(1024)),
        "ham_channels",
        json!(1024),
    );
    assert_eq!(head(l, "decode_head").0.total(), 4_289_686);
}

#[test]
fn the_head_classifies_at_the_first_selected_maps_resolution() {
    let (_, head) = head(mscan_t_head(), "decode_head");
    let feats = features(2, &[(32, 16, 16), (64, 8, 8), (160, 4, 4), (256, 2, 2)]);
    assert_eq!(head.forward(&feats, None, true).size(), [2, 150, 8, 8]);
    assert_eq!(head.forward(&feats, None, false).size(), [2, 150, 8, 8]);
}

#[test]
fn unknown_ham_kwargs_and_fixed_bases_are_refused() {
    let err = head_error(with_key(
        mscan_t_head(),
        "ham_kwargs",
        json!({"rand_init": false}),
    ));
    assert!(err.contains("`rand_init`"), "{err}");
    let err = head_error(with_key(mscan_t_head(), "ham_kwargs", json!({"MD_X": 3})));
    assert!(err.contains("`MD_X`"), "{err}");
    let err = head_error(with_key(
        mscan_t_head(),
        "input_transform",
        json!("resize_concat"),
    ));
    assert!(err.contains("input_transform"), "{err}");
}
