//! Unit tests of `params.rs`: dotted names in registration order, counts
//! per prefix, frozen parameters, buffers.
use super::*;

#[test]
fn parameters_are_named_by_their_scopes_in_registration_order() {
    let mut store = ParamStore::new(Device::Cpu);
    {
        let mut backbone = store.scope("backbone");
        let mut stems = backbone.sub("stem");
        let mut stem = stems.sub(0);
        let _ = stem.param_normal("weight", &[8, 3, 3, 3], 0.02);
        let _ = stem.param_zeros("bias", &[8]);
    }
    let _ = store
        .scope("decode_head")
        .param_ones("conv_seg.weight", &[4, 8]);
    let names: Vec<&str> = store.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "backbone.stem.0.weight",
            "backbone.stem.0.bias",
            "decode_head.conv_seg.weight"
        ]
    );
    // 8*3*3*3 + 8 + 4*8 float32 parameters.
    assert_eq!(store.total(), 216 + 8 + 32);
    assert_eq!(store.param_bytes(), 4 * (216 + 8 + 32));
    assert_eq!(
        store.by_prefix(),
        vec![
            ("backbone".to_string(), 224, 224),
            ("decode_head".to_string(), 32, 32)
        ]
    );
}

#[test]
fn frozen_parameters_count_in_the_total_not_in_the_trainable() {
    let mut store = ParamStore::new(Device::Cpu);
    let mut scope = store.scope("backbone");
    let _ = scope.param_zeros("a", &[10]);
    let mark = scope.registered();
    let _ = scope.param_zeros("b", &[5]);
    let _ = scope.param_zeros("c", &[3]);
    scope.freeze_since(mark);
    let _ = scope.param_zeros("d", &[2]);
    scope.freeze_last(1);
    assert_eq!(store.total(), 20);
    assert_eq!(store.trainable(), 10);
    assert_eq!(store.by_prefix(), vec![("backbone".to_string(), 20, 10)]);
}

#[test]
fn buffers_are_kept_apart_from_parameters() {
    let mut store = ParamStore::new(Device::Cpu);
    let _ = store.scope("backbone").sub("bn").buffer(
        "running_mean",
        Tensor::zeros([16], (Kind::Float, Device::Cpu)),
    );
    assert!(store.params.is_empty());
    assert_eq!(store.buffers[0].0, "backbone.bn.running_mean");
    assert_eq!(store.buffer_bytes(), 64);
}
