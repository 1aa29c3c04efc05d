//! Unit tests of `boundary_loss.rs`: the class-balanced binary cross-entropy, a refused key.
use super::BoundaryLossCfg;
use crate::models::component_config::test_support::dict;
use serde_json::json;
use tch::{Kind, Reduction, Tensor};

#[test]
fn edges_and_non_edges_are_weighted_by_the_others_share() {
    let l = BoundaryLossCfg::from_cfg(&dict(json!({"type": "BoundaryLoss", "loss_weight": 20.0})))
        .unwrap();
    assert_eq!(l.loss_name, "loss_boundary");
    let pred = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 0.0]).view([1, 1, 2, 2]);
    // One edge pixel of four: it weighs 3/4, the others 1/4.
    let gt = Tensor::from_slice(&[1u8, 0, 0, 0]).view([1, 2, 2]);
    let target = gt.view([1, -1]).to_kind(Kind::Float);
    let weight = Tensor::from_slice(&[0.75f32, 0.25, 0.25, 0.25]).view([1, -1]);
    let expected = pred.view([1, -1]).binary_cross_entropy_with_logits(
        &target,
        Some(&weight),
        None::<&Tensor>,
        Reduction::Mean,
    );
    let got = l.forward(&pred, &gt).double_value(&[]);
    assert!(
        (got - 20.0 * expected.double_value(&[])).abs() < 1e-5,
        "{got}"
    );
}

#[test]
fn an_unknown_key_is_refused_by_name() {
    let err = BoundaryLossCfg::from_cfg(&dict(json!({"type": "BoundaryLoss", "edge_width": 3})))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`edge_width`"), "{err}");
}
