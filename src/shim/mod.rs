//! The C++ shim under models and trials: what libtorch gives only from C++
//! (the counting allocators, CUDA statistics, the op-level trace on the
//! `Fake` dispatch key, kernel calls, checkpointing, autocast's lists, mmcv's
//! ops) in `shim*.cpp`, declared once for C++ in `segtune_ffi.h`, and
//! [`ffi`], the one Rust seam to it. The shim is on the ground floor: models
//! and trials call it, it calls nothing of segtune's but
//! `segtune_building_host_data` (`models::layers::host`).

pub mod ffi;

#[cfg(test)]
mod tests {
    /// `meta_by_rule` looks an op's name up in one set before its rules:
    /// a rule whose name is missing there would never run (its op would go
    /// to CPU stand-ins).
    #[test]
    fn every_meta_shape_rule_is_in_the_lookup_set() {
        let source = include_str!("shim_meta_rules.cpp");
        let (set, rules) = source
            .split_once("if (!kRuled.count(name)) return false;")
            .expect("the lookup comes before the rules");
        let listed: std::collections::BTreeSet<&str> = set
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|n| n.starts_with("aten::"))
            .collect();
        let ruled: std::collections::BTreeSet<&str> = rules
            .split("name == \"")
            .skip(1)
            .map(|rest| rest.split('"').next().unwrap())
            .collect();
        assert!(!ruled.is_empty());
        let missing: Vec<_> = ruled.difference(&listed).collect();
        assert!(missing.is_empty(), "add to kRuled: {missing:?}");
    }
}
