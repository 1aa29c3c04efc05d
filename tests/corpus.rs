//! Resolves all 769 MMSeg 1.2.2 configs and compares each, value for value,
//! with what MMEngine's `Config.fromfile` made of it (`resolved/*.json`).

mod common;

use segtune::config::{dump, eval::Limits, Loader, Value};

#[test]
fn all_mmseg_configs_resolve_exactly_as_mmengine() {
    let Some(shared) = common::require_shared("all_mmseg_configs_resolve_exactly_as_mmengine")
    else {
        return;
    };
    let root = shared.join("mmseg-configs/configs");
    let resolved = shared.join("mmseg-configs/resolved");
    let configs = common::configs_under(&root);
    assert_eq!(configs.len(), 769, "the corpus should hold 769 configs");
    let mut loader = Loader::new(Limits::default());
    let mut failures = Vec::new();
    for path in &configs {
        let rel = path.strip_prefix(&root).unwrap();
        let expected_path = resolved.join(rel).with_extension("json");
        let expected: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&expected_path).unwrap()).unwrap();
        let expected = dump::from_json(&expected);
        match loader.load(path) {
            Ok(cfg) => {
                if let Some(diff) = Value::Dict(cfg).first_difference(&expected, "") {
                    failures.push(format!("{}: {diff}", rel.display()));
                }
            }
            Err(e) => failures.push(format!("{}: {e}", rel.display())),
        }
    }
    let identical = configs.len() - failures.len();
    println!(
        "resolved identically to mmengine: {identical}/{}",
        configs.len()
    );
    for f in failures.iter().take(20) {
        println!("  {f}");
    }
    assert!(
        failures.is_empty(),
        "{identical}/{} identical; first failure: {}",
        configs.len(),
        failures[0]
    );
}
