//! Unit tests of `maskformer_loss.rs`: the matching costs' settings read
//! from a config, refused costs.
use super::match_costs;
use crate::models::component_config::test_support::dict;
use serde_json::json;

#[test]
fn the_assigners_costs_are_read_in_order() {
    let a = dict(json!({
        "type": "mmdet.HungarianAssigner",
        "match_costs": [
            {"type": "mmdet.ClassificationCost", "weight": 1.0},
            {"type": "mmdet.FocalLossCost", "weight": 20.0, "binary_input": true},
            {"type": "mmdet.DiceCost", "weight": 1.0, "pred_act": true, "eps": 1.0}
        ]
    }));
    let c = match_costs(Some(&a)).unwrap();
    assert_eq!((c.cls, c.focal, c.dice), (1.0, 20.0, 1.0));
    assert!(c.dice_pred_act && c.dice_naive);
    assert_eq!((c.focal_alpha, c.focal_gamma, c.dice_eps), (0.25, 2.0, 1.0));
}

#[test]
fn a_class_score_focal_cost_is_refused_by_name() {
    let a = dict(json!({
        "type": "mmdet.HungarianAssigner",
        "match_costs": [{"type": "mmdet.FocalLossCost", "weight": 2.0}]
    }));
    let err = match_costs(Some(&a)).unwrap_err().to_string();
    assert!(err.contains("binary_input"), "{err}");
    let a = dict(json!({
        "type": "mmdet.HungarianAssigner",
        "match_costs": [{"type": "mmdet.FocalLossCost", "binary_input": false}]
    }));
    let err = match_costs(Some(&a)).unwrap_err().to_string();
    assert!(err.contains("binary_input"), "{err}");
}
