//! Unit tests of `generate_edge.rs`: the edge map of a small label, the pipeline step read.
use super::GenerateEdge;
use crate::models::component_config::test_support::dict;
use serde_json::json;
use tch::Tensor;

#[test]
fn a_vertical_border_is_marked_and_dilated_as_cv2_does() {
    // Columns 0-2 class 1, columns 3-5 class 2: `left` marks column 2, the
    // diagonals mark column 2 too (and column 3 for up-right); ignored
    // pixels (255) mark nothing.
    let label = Tensor::from_slice(&[
        1i64, 1, 1, 2, 2, 2, //
        1, 1, 1, 2, 2, 2, //
        1, 1, 1, 2, 2, 2, //
        255, 255, 255, 255, 255, 255,
    ])
    .view([1, 4, 6]);
    let width1 = GenerateEdge {
        edge_width: 1,
        ignore_index: 255,
    };
    let edge: Vec<i64> = Vec::try_from(width1.edge_map(&label).view([-1])).unwrap();
    assert_eq!(
        edge,
        [
            0, 0, 1, 1, 0, 0, //
            0, 0, 1, 1, 0, 0, //
            0, 0, 1, 0, 0, 0, //
            0, 0, 0, 0, 0, 0,
        ]
    );
    // A 2x2 square anchored at (1, 1): each mark spreads down and right
    // (as numpy + cv2.dilate give it).
    let width2 = GenerateEdge {
        edge_width: 2,
        ignore_index: 255,
    };
    let edge: Vec<i64> = Vec::try_from(width2.edge_map(&label).view([-1])).unwrap();
    assert_eq!(
        edge,
        [
            0, 0, 1, 1, 1, 0, //
            0, 0, 1, 1, 1, 0, //
            0, 0, 1, 1, 1, 0, //
            0, 0, 1, 1, 0, 0,
        ]
    );
}

#[test]
fn the_step_is_read_from_the_train_dataloaders_pipeline() {
    let cfg = dict(json!({"train_dataloader": {"dataset": {"pipeline": [
        {"type": "LoadImageFromFile"},
        {"type": "GenerateEdge", "edge_width": 4},
        {"type": "PackSegInputs"}
    ]}}}));
    let edge = GenerateEdge::from_train_pipeline(&cfg).unwrap().unwrap();
    assert_eq!((edge.edge_width, edge.ignore_index), (4, 255));
    assert_eq!(
        GenerateEdge::from_train_pipeline(&dict(json!({}))).unwrap(),
        None
    );
}
