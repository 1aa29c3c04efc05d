//! Unit tests of `base.rs`: mmengine's `parse_losses` on tiny known items.
use super::*;

#[test]
fn the_total_is_the_sum_of_the_means_of_the_loss_items() {
    let items = vec![
        (
            "decode.loss_ce".to_string(),
            Tensor::from_slice(&[1.0f32, 3.0]),
        ),
        ("decode.acc_seg".to_string(), Tensor::from_slice(&[50.0f32])),
        ("aux.loss_ce".to_string(), Tensor::from_slice(&[0.5f32])),
    ];
    let parsed = parse_losses(items);
    // mean(1, 3) + 0.5; the accuracy is logged, not summed.
    assert_eq!(parsed.loss.double_value(&[]), 2.5);
    let logged: Vec<(&str, f64)> = parsed
        .items
        .iter()
        .map(|(n, v)| (n.as_str(), v.double_value(&[])))
        .collect();
    assert_eq!(
        logged,
        [
            ("decode.loss_ce", 2.0),
            ("decode.acc_seg", 50.0),
            ("aux.loss_ce", 0.5)
        ]
    );
}

#[test]
fn no_loss_items_give_a_zero_loss() {
    let parsed = parse_losses(vec![(
        "acc_seg".to_string(),
        Tensor::from_slice(&[10.0f32]),
    )]);
    assert_eq!(parsed.loss.double_value(&[]), 0.0);
}
