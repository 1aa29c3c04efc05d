//! Unit tests of `host.rs`: tensors of host values, the flag the op-level
//! trace reads while they are built, the shape-only segments.
use super::*;

#[test]
fn host_values_become_tensors_and_the_flag_is_down_afterwards() {
    let t = from_host(&[1i64, 2, 3]);
    assert_eq!(Vec::<i64>::try_from(&t).unwrap(), [1, 2, 3]);
    let s = scalar_from_host(2.5f32);
    assert_eq!((s.dim(), s.double_value(&[])), (0, 2.5));
    // Set only while building (the trace's fallback reads it then).
    assert!(!segtune_building_host_data());
    assert!(outside_op_trace(|| segtune_building_host_data()));
    assert!(!segtune_building_host_data());
}

#[test]
fn shape_only_segments_mark_values_unavailable_until_cleared() {
    assert!(!values_unavailable());
    set_shape_only_segments(Some(3));
    assert!(values_unavailable());
    assert_eq!(shape_only_segments(), Some(3));
    set_shape_only_segments(None);
    assert!(!values_unavailable());
    assert_eq!(shape_only_segments(), None);
}
