//! Property tests over the translator, the evaluator, the merger and the
//! dumpers: arbitrary input never panics, and dumped configs load back to
//! the same values.

use proptest::prelude::*;
use segtune::config::{self, dump, merge, Dict, Value};
use std::path::Path;

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_][a-z0-9_]{0,8}",
        "[a-z]{1,4}\\.[a-z]{1,4}",
        Just("type".to_string()),
        Just("_delete_".to_string()),
        Just("0".to_string()),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        prop_oneof![
            any::<f64>().prop_filter("finite", |f| f.is_finite()),
            Just(1e-6),
            Just(0.1),
            Just(1e16)
        ]
        .prop_map(Value::Float),
        "[ -~]{0,12}".prop_map(Value::Str),
        "\\PC{0,6}".prop_map(Value::Str),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::List),
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Tuple),
            prop::collection::vec((key(), inner), 0..5)
                .prop_map(|kv| Value::Dict(kv.into_iter().collect())),
        ]
    })
}

/// Python keywords: no Python config can bind them at the top level.
const PY_KEYWORDS: &[&str] = &[
    "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del", "elif",
    "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda",
    "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

fn top_level() -> impl Strategy<Value = Dict> {
    prop::collection::vec(("[a-z][a-z0-9_]{0,8}", value()), 0..6).prop_map(|kv| {
        kv.into_iter()
            .filter(|(k, _)| !config::RESERVED_KEYS.contains(&k.as_str()))
            .filter(|(k, _)| !PY_KEYWORDS.contains(&k.as_str()))
            .collect()
    })
}

/// Python-ish expressions built from the config grammar (some ill-typed).
fn py_expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        "-?[0-9]{1,5}",
        "[0-9]{1,3}\\.[0-9]{0,3}(e-?[0-9])?",
        "'[a-z ]{0,5}'",
        Just("None".to_string()),
        Just("True".to_string()),
        Just("x".to_string()),
        Just("crop".to_string()),
    ];
    leaf.prop_recursive(4, 40, 4, |inner| {
        prop_oneof![
            (
                inner.clone(),
                prop_oneof![
                    Just("+"),
                    Just("-"),
                    Just("*"),
                    Just("/"),
                    Just("//"),
                    Just("%"),
                    Just("**"),
                    Just("<"),
                    Just("=="),
                    Just(" and "),
                    Just(" or "),
                    Just(" in ")
                ],
                inner.clone()
            )
                .prop_map(|(a, op, b)| format!("({a}{op}{b})")),
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("({},)", v.join(", "))),
            prop::collection::vec(inner.clone(), 0..3).prop_map(|v| format!(
                "dict({})",
                v.iter()
                    .enumerate()
                    .map(|(i, e)| format!("k{i}={e}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{{'a': {a}, 'b': {b}}}")),
            inner.clone().prop_map(|a| format!("[v for v in {a}]")),
            inner
                .clone()
                .prop_map(|a| format!("{{f'k{{i}}': v for i, v in enumerate({a})}}")),
            inner.clone().prop_map(|a| format!("len({a})")),
            inner.clone().prop_map(|a| format!("sum({a})")),
            inner.clone().prop_map(|a| format!("int({a})")),
            inner.clone().prop_map(|a| format!("-{a}")),
            inner.clone().prop_map(|a| format!("not {a}")),
            (inner.clone(), inner.clone(), inner.clone())
                .prop_map(|(a, b, c)| format!("({a} if {b} else {c})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}[{b}]")),
            inner.clone().prop_map(|a| format!("f'<{{{a}}}>'")),
            inner.prop_map(|a| format!("range({a})")),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(src in "\\PC{0,80}") {
        let _ = config::evaluate_source(Path::new("fuzz.py"), &src);
        let _ = config::evaluate_source(Path::new("fuzz.rhai"), &src);
    }

    #[test]
    fn generated_python_never_panics(e in py_expr(), e2 in py_expr()) {
        let src = format!("x = [1, 2.5, 'a']\ncrop = (512, 512)\ny = {e}\nz = {e2}\nx.update(a={e})\n");
        let _ = config::evaluate_source(Path::new("gen.py"), &src);
    }

    #[test]
    fn merging_never_panics(a in top_level(), b in top_level(), list_keys in any::<bool>()) {
        let _ = merge::merge_a_into_b(a, Value::Dict(b), list_keys);
    }

    #[test]
    fn cfg_options_never_panic(items in prop::collection::vec("[a-z0-9_.]{0,10}=[\\[\\]()a-z0-9,.'\" -]{0,16}", 0..4), base in top_level()) {
        if let Ok(opts) = merge::parse_cfg_options(&items) {
            let _ = merge::apply_cfg_options(base, opts);
        }
    }

    #[test]
    fn python_and_rhai_dumps_load_back_to_the_same_values(cfg in top_level()) {
        let want = Value::Dict(cfg.clone());
        let py = dump::to_python(&cfg).unwrap();
        let back = config::evaluate_source(Path::new("dump.py"), &py).unwrap_or_else(|e| panic!("{e}\n{py}"));
        prop_assert!(Value::Dict(back.clone()).same_as(&want), "{:?}\n{py}", Value::Dict(back).first_difference(&want, ""));
        let rhai = dump::to_rhai(&cfg);
        let back = config::evaluate_source(Path::new("dump.rhai"), &rhai).unwrap_or_else(|e| panic!("{e}\n{rhai}"));
        prop_assert!(Value::Dict(back.clone()).same_as(&want), "{:?}\n{rhai}", Value::Dict(back).first_difference(&want, ""));
        let json = dump::to_json(&want);
        prop_assert!(dump::from_json(&serde_json::from_str(&json).unwrap()).same_as(&want));
    }
}
