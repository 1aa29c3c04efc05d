//! The shipped Rhai SegFormer recipe (docs/examples) resolves to exactly what
//! mmengine makes of MMSeg's Python original, types included.

mod common;

use segtune::config::{self, dump, Value};
use std::path::PathBuf;

#[test]
fn rhai_segformer_example_equals_the_mmseg_python_config() {
    let Some(shared) =
        common::require_shared("rhai_segformer_example_equals_the_mmseg_python_config")
    else {
        return;
    };
    let example = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs/examples/segformer_mit-b0_8xb2-160k_ade20k-512x512.rhai");
    let mut resolved = config::resolve(&example, &[]).unwrap_or_else(|e| panic!("{e}"));
    let search = resolved
        .shift_remove("segtune")
        .expect("the example carries segtune's search settings");
    assert_eq!(
        search.get_path("preset"),
        Some(&Value::Str("rtx3050ti-laptop".into()))
    );
    let got = Value::Dict(resolved);
    let json = shared
        .join("mmseg-configs/resolved/segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.json");
    let want =
        dump::from_json(&serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap());
    assert!(got.same_as(&want), "{:?}", got.first_difference(&want, ""));
}
