//! The config engine's semantics on hand-written configs: each case states
//! what MMEngine 0.10.7 gives (SPEC.md) and checks segtune gives the same.

use segtune::config::{self, dump, ErrorKind, Value};
use std::path::{Path, PathBuf};

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().unwrap())
    }
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }
}

fn resolve(p: &Path) -> Value {
    Value::Dict(config::resolve(p, &[]).unwrap_or_else(|e| panic!("{e}")))
}

/// Parses the JSON encoding of `resolved/` (tuples as `__tuple__`).
fn expect(json: &str) -> Value {
    dump::from_json(&serde_json::from_str(json).unwrap())
}

fn assert_same(got: &Value, want: &Value) {
    assert!(
        got.same_as(want),
        "difference: {:?}\n got: {}",
        got.first_difference(want, ""),
        dump::to_json(got)
    );
}

#[test]
fn python_arithmetic_types_and_builtins() {
    let d = Dir::new();
    let p = d.file(
        "a.py",
        r#"
crop_size = (512, 1024)
one = (1,)
ratio = 1 / 4.
half = 7 / 2
q = -7 // 2
m = -7 % 3
p = 2 ** 10
f = 1e-4
neg = -0.5
ws = [1.0] * 3 + [0.1]
depths = [2, 2, 6, 2]
n = len(depths) - 1
s = sum([18, 36, 72, 144])
sizes = [int(512 * x * 0.1) for x in range(5, 8)]
names = {f'backbone.stages.{i}.blocks.{j}.norm': dict(decay_mult=0.0) for i, d in enumerate(depths[:2]) for j in range(d)}
raw = r'a\b'
cat = 'ab' 'cd'
cond = 'x' if n > 2 else 'y'
both = n > 2 and 'yes'
either = 0 or None
chain = 1 < n <= 3
fmt = f'{ratio:.2f}-{n:03d}-{f}'
"""docstring in the middle"""
"#,
    );
    assert_same(
        &resolve(&p),
        &expect(
            r#"{"crop_size": {"__tuple__": [512, 1024]}, "one": {"__tuple__": [1]}, "ratio": 0.25, "half": 3.5,
            "q": -4, "m": 2, "p": 1024, "f": 0.0001, "neg": -0.5, "ws": [1.0, 1.0, 1.0, 0.1],
            "depths": [2, 2, 6, 2], "n": 3, "s": 270, "sizes": [256, 307, 358],
            "names": {"backbone.stages.0.blocks.0.norm": {"decay_mult": 0.0}, "backbone.stages.0.blocks.1.norm": {"decay_mult": 0.0},
                      "backbone.stages.1.blocks.0.norm": {"decay_mult": 0.0}, "backbone.stages.1.blocks.1.norm": {"decay_mult": 0.0}},
            "raw": "a\\b", "cat": "abcd", "cond": "x", "both": "yes", "either": null, "chain": true,
            "fmt": "0.25-003-0.0001"}"#,
        ),
    );
}

#[test]
fn each_file_is_evaluated_eagerly_and_merged_by_mmengine_rules() {
    let d = Dir::new();
    d.file(
        "base.py",
        "crop_size = (512, 512)\npipeline = [dict(type='RandomCrop', crop_size=crop_size)]\nmodel = dict(type='EncoderDecoder', backbone=dict(depth=50, norm=dict(type='BN')), neck=dict(a=1))\nopt = dict(type='SGD', lr=0.01)\n",
    );
    let p = d.file(
        "child.py",
        "_base_ = './base.py'\ncrop_size = (256, 256)\nmodel = dict(backbone=dict(depth=101), neck=dict(_delete_=True, b=2), head=dict(_delete_=True, c=3))\nopt = dict(lr=0.02)\n",
    );
    assert_same(
        &resolve(&p),
        &expect(
            r#"{"crop_size": {"__tuple__": [256, 256]},
                "pipeline": [{"type": "RandomCrop", "crop_size": {"__tuple__": [512, 512]}}],
                "model": {"type": "EncoderDecoder", "backbone": {"depth": 101, "norm": {"type": "BN"}}, "neck": {"b": 2},
                          "head": {"_delete_": true, "c": 3}},
                "opt": {"type": "SGD", "lr": 0.02}}"#,
        ),
    );
}

#[test]
fn base_references_textual_and_attribute() {
    let d = Dir::new();
    d.file(
        "base.py",
        "crop_size = (512, 512)\nmodel = dict(backbone=dict(depth=50))\n",
    );
    let p = d.file(
        "child.py",
        "_base_ = ['./base.py']\n_base_.model.update(extra=1)\na = {{_base_.crop_size}}\nb = [{{ _base_.model.backbone }}, 1]\nc = _base_.crop_size[0] * 2\nd = _base_.model.backbone.depth\n",
    );
    assert_same(
        &resolve(&p),
        &expect(
            r#"{"crop_size": {"__tuple__": [512, 512]}, "model": {"backbone": {"depth": 50}, "extra": 1},
                "a": {"__tuple__": [512, 512]}, "b": [{"depth": 50}, 1], "c": 1024, "d": 50}"#,
        ),
    );
}

#[test]
fn update_on_a_dict_and_positional_dict() {
    let d = Dir::new();
    let p = d.file(
        "a.py",
        "keys = {'backbone': dict(lr_mult=0.1)}\nkeys.update({'head': dict(lr_mult=10.0)})\nkeys.update(neck=dict(lr_mult=1.0))\nopt = dict(custom_keys=keys)\nx = dict(dict(type='A'), b=1)\n",
    );
    assert_same(
        &resolve(&p),
        &expect(
            r#"{"keys": {"backbone": {"lr_mult": 0.1}, "head": {"lr_mult": 10.0}, "neck": {"lr_mult": 1.0}},
                "opt": {"custom_keys": {"backbone": {"lr_mult": 0.1}, "head": {"lr_mult": 10.0}, "neck": {"lr_mult": 1.0}}},
                "x": {"type": "A", "b": 1}}"#,
        ),
    );
}

#[test]
fn update_of_an_aliased_dict_is_refused_not_mis_evaluated() {
    let d = Dir::new();
    let p = d.file(
        "a.py",
        "keys = dict(a=1)\nopt = dict(custom_keys=keys)\nkeys.update(b=2)\n",
    );
    let e = config::resolve(&p, &[]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert_eq!(e.location.as_ref().unwrap().line, 3);
}

#[test]
fn predefined_and_environment_variables() {
    let d = Dir::new();
    let p = d.file("cfg.py", "name = '{{ fileBasenameNoExtension }}'\next = '{{fileExtname}}'\nn = {{'$SEGTUNE_TEST_UNSET_VAR:80'}}\n");
    assert_same(
        &resolve(&p),
        &expect(r#"{"name": "cfg", "ext": ".py", "n": 80}"#),
    );
}

#[test]
fn rhai_config_inherits_from_python_and_python_from_rhai() {
    let d = Dir::new();
    d.file(
        "base.py",
        "crop_size = (512, 512)\nmodel = dict(type='EncoderDecoder', backbone=dict(depth=50))\n",
    );
    let r = d.file(
        "mid.rhai",
        r#"
let _base_ = "./base.py";
import "rtx3050ti" as gpu;
let model = #{ backbone: #{ depth: 101 } };
let crop = tuple([_base_.crop_size[0] / 2, 256]);
let vram = gpu::vram_mib;
let lr = 6e-5;
"#,
    );
    assert_same(
        &resolve(&r),
        &expect(
            r#"{"crop_size": {"__tuple__": [512, 512]}, "model": {"type": "EncoderDecoder", "backbone": {"depth": 101}},
                "crop": {"__tuple__": [256, 256]}, "vram": 4096, "lr": 6e-05}"#,
        ),
    );
    let p = d.file(
        "top.py",
        "_base_ = './mid.rhai'\nmodel = dict(backbone=dict(depth=18))\n",
    );
    assert_eq!(
        resolve(&p).get_path("model.backbone.depth"),
        Some(&Value::Int(18))
    );
    assert_eq!(resolve(&p).get_path("vram"), Some(&Value::Int(4096)));
}

/// A `.rhai` module next to the config (or below it) is a file like a
/// config: its `_base_` is loaded and bound, its own imports are relative
/// to it, and a module two others import (a diamond, not a cycle) is
/// loaded once.
#[test]
fn imported_rhai_modules_load_their_bases_and_imports() {
    let d = Dir::new();
    d.file("lib/sizes.py", "crop_size = (512, 1024)\n");
    d.file(
        "lib/common.rhai",
        "let _base_ = \"sizes.py\";\nexport const short = _base_.crop_size[0];\nfn twice(x) { x * 2 }\n",
    );
    d.file(
        "lib/left.rhai",
        "import \"common\" as c;\nexport const left = c::twice(c::short);\n",
    );
    d.file(
        "lib/right.rhai",
        "import \"common\" as c;\nexport const right = c::short + 1;\n",
    );
    let top = d.file(
        "top.rhai",
        "import \"lib/left\" as l;\nimport \"lib/right\" as r;\nlet sizes = [l::left, r::right];\n",
    );
    assert_same(&resolve(&top), &expect(r#"{"sizes": [1024, 513]}"#));
}

#[test]
fn rhai_dump_evaluates_back_to_the_same_config() {
    let d = Dir::new();
    let p = d.file(
        "a.py",
        "crop_size = (512, 1024)\nmodel = dict(type='X', ws=[1.0, 0.1], n=None, t=True, s='a\"b\\'c', e={'a.b': (1,)}, lr=6e-05, big=1e16)\n",
    );
    let cfg = config::resolve(&p, &[]).unwrap();
    let rhai = d.file("back.rhai", &dump::to_rhai(&cfg));
    assert_same(&resolve(&rhai), &Value::Dict(cfg.clone()));
    let py = d.file("back.py", &dump::to_python(&cfg).unwrap());
    assert_same(&resolve(&py), &Value::Dict(cfg));
}

#[test]
fn cfg_options_follow_merge_from_dict() {
    let d = Dir::new();
    let p = d.file(
        "a.py",
        "train_pipeline = [dict(type='Load'), dict(type='RandomFlip', prob=0.5)]\ntrain_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))\n",
    );
    let opts: Vec<String> = [
        "train_dataloader.batch_size=8",
        "train_pipeline.1.prob=0.9",
        "crop=(256,256)",
        "new.key=[1,2]",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let cfg = Value::Dict(config::resolve(&p, &opts).unwrap());
    assert_eq!(
        cfg.get_path("train_dataloader.batch_size"),
        Some(&Value::Int(8))
    );
    assert_eq!(
        cfg.get_path("train_pipeline.1.prob"),
        Some(&Value::Float(0.9))
    );
    assert_eq!(
        cfg.get_path("crop"),
        Some(&Value::Tuple(vec![Value::Int(256), Value::Int(256)]))
    );
    assert_eq!(
        cfg.get_path("new.key"),
        Some(&Value::List(vec![Value::Int(1), Value::Int(2)]))
    );
    let e = config::resolve(&p, &["train_pipeline.7.prob=1".to_string()]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::CfgOption);
}

#[test]
fn reserved_top_level_keys_are_refused() {
    let d = Dir::new();
    let p = d.file("a.py", "filename = 'x'\n");
    assert_eq!(
        config::resolve(&p, &[]).unwrap_err().kind,
        ErrorKind::Reserved
    );
}

#[test]
fn a_tuple_base_list_is_refused_like_mmengine() {
    let d = Dir::new();
    d.file("b.py", "x = 1\n");
    let p = d.file("a.py", "_base_ = ('./b.py',)\n");
    assert!(config::resolve(&p, &[]).is_err());
}

#[test]
fn undefined_name_is_a_name_error_at_its_line() {
    let d = Dir::new();
    let p = d.file("a.py", "a = 1\nb = dict(x=undefined_thing)\n");
    let e = config::resolve(&p, &[]).unwrap_err();
    assert!(
        e.message
            .contains("NameError: name 'undefined_thing' is not defined"),
        "{}",
        e.message
    );
    assert_eq!(e.location.as_ref().unwrap().line, 2);
}

/// New-style (`with read_base():`) configs written after MMSeg main's
/// `mmseg/configs/` (SegFormer B0/B1, PSPNet R50/R18 with attribute
/// assignment and `del`, Mask2Former R50 with MMDetection's classes)
/// resolve to what mmengine 0.10.7 with MMSeg 1.2.2 installed gives
/// (`tests/fixtures/new_style_resolved.json`, made by
/// `scripts/new-style-oracle.py`: each imported class as the name MMSeg's
/// registries find it by).
#[test]
fn new_style_configs_resolve_as_mmengine_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("new_style_resolved.json")).unwrap(),
    )
    .unwrap();
    let configs = fixture["configs"].as_object().unwrap();
    assert!(
        configs.len() >= 5,
        "the fixture lists {} configs",
        configs.len()
    );
    for (rel, want) in configs {
        let got = resolve(&root.join("new_style").join(rel));
        let want = dump::from_json(want);
        assert!(
            got.same_as(&want),
            "{rel}: difference: {:?}",
            got.first_difference(&want, "")
        );
    }
}

fn resolve_error(p: &Path) -> config::ConfigError {
    match config::resolve(p, &[]) {
        Ok(cfg) => panic!("{} resolved: {cfg:?}", p.display()),
        Err(e) => e,
    }
}

#[test]
fn new_style_semantics_and_refusals() {
    let d = Dir::new();
    d.file(
        "base.py",
        "from mmseg.models import EncoderDecoder\nmodel = dict(type=EncoderDecoder, a=dict(x=1, y=dict(z=2)))\nplain = 3\n",
    );
    // A ConfigDict's update merges dicts recursively; a plain dict's replaces.
    let p = d.file(
        "child.py",
        "from mmengine.config import read_base\nwith read_base():\n    from .base import *\n\
         model.update(a=dict(y=dict(w=3)))\nmine = dict(a=dict(b=1))\nmine.update(a=dict(c=2))\n\
         model.a.x = 5\ndel plain\n",
    );
    let got = resolve(&p);
    let want = expect(
        r#"{"model": {"type": "EncoderDecoder", "a": {"x": 5, "y": {"z": 2, "w": 3}}},
            "mine": {"a": {"c": 2}}}"#,
    );
    assert_same(&got, &want);

    let cases: [(&str, &str, &str); 6] = [
        ("with_open.py", "with open('x') as f:\n    pass\n", "Only `read_base`"),
        (
            "stdlib.py",
            "from mmengine.config import read_base\nwith read_base():\n    from .base import *\nfrom math import pi\n",
            "importing the standard library (`math`)",
        ),
        (
            "installed.py",
            "from mmengine.config import read_base\nwith read_base():\n    from mmseg.configs._base_.default_runtime import *\n",
            "is in an installed package",
        ),
        (
            "missing.py",
            "from mmengine.config import read_base\nwith read_base():\n    from .nowhere import *\n",
            "not found",
        ),
        (
            "attr_on_plain.py",
            "from mmseg.models import EncoderDecoder\nm = dict(type=EncoderDecoder)\nm.backbone = 1\n",
            "AttributeError: 'dict' object has no attribute 'backbone'",
        ),
        (
            "alias.py",
            "from mmengine.config import read_base\nwith read_base():\n    from .base import *\n\
             other = model\nmodel.a.x = 7\n",
            "another name also refers to",
        ),
    ];
    for (name, text, says) in cases {
        let e = resolve_error(&d.file(name, text));
        let shown = e.to_string();
        assert!(shown.contains(says), "{name}: {shown}");
        assert!(e.location.is_some(), "{name}: no location: {shown}");
    }
    // Old style inheriting new style: MMEngine refuses the mix too.
    let p = d.file("old.py", "_base_ = ['./child.py']\n");
    assert!(resolve_error(&p).to_string().contains("must match"));
}
