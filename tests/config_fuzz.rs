//! Fuzz target over the config evaluator: generated Python and Rhai
//! programs, mutations of the real MMSeg configs (with their `_base_`
//! files), `--cfg-options` items and raw bytes, each loaded the way
//! `segtune resolve` loads a file.
//!
//! Each input runs under a memory cap (the evaluating thread's allocations
//! fail past [`MEMORY_CAP`], which aborts the process) and a time cap
//! ([`TIME_CAP`]; a watchdog ends the process if one input runs past
//! [`WATCHDOG`]). A panic, an abort or an input over a cap is a failure;
//! the input being evaluated is always on disk in `target/config-fuzz/`, so
//! a crash leaves its reproducer behind.
//!
//! `cargo test --test config_fuzz` runs 600 inputs; `scripts/fuzz-config`
//! runs 100 000 (`SEGTUNE_FUZZ_INPUTS`, `SEGTUNE_FUZZ_SEED`; a deadline in
//! seconds: `SEGTUNE_FUZZ_SECONDS`).

use segtune::config::{self, eval_meter};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;

const MEMORY_CAP: usize = 1 << 30;
/// The cap of the release build that `scripts/fuzz-config` runs; a debug
/// build (`cargo test`) evaluates Rhai about ten times slower.
const TIME_CAP: Duration = Duration::from_secs(if cfg!(debug_assertions) { 20 } else { 2 });
const WATCHDOG: Duration = Duration::from_secs(60);

/// splitmix64: deterministic, seedable, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "7",
    "255",
    "1000",
    "1000000",
    "100000000",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999",
    "0.5",
    "1e308",
    "1e-320",
    "-0.0",
    "float('inf')",
    "float('nan')",
    "True",
    "None",
];
const STRINGS: &[&str] = &[
    "''",
    "'a'",
    "'type'",
    "'_delete_'",
    "'{{_base_.x}}'",
    "'%s'",
    "'{}'",
    "'\\n'",
    "'é'",
    "'\\x00'",
    "'a' * 1000",
    "\"\"\"x\"\"\"",
    "f'{1}'",
    "r'\\d'",
    "b'x'",
];
const NAMES: &[&str] = &["x", "y", "crop", "model", "norm_cfg", "d", "l", "t", "s"];
const BINOPS: &[&str] = &[
    "+", "-", "*", "/", "//", "%", "**", "<", "<=", "==", "!=", " and ", " or ", " in ",
    " not in ", " is ", "&", "|", "^", "<<", ">>",
];
const CALLS: &[&str] = &[
    "len",
    "int",
    "float",
    "str",
    "bool",
    "abs",
    "min",
    "max",
    "sum",
    "list",
    "tuple",
    "dict",
    "range",
    "sorted",
    "reversed",
    "enumerate",
    "zip",
    "round",
    "any",
    "all",
    "set",
    "type",
    "isinstance",
    "repr",
];
const METHODS: &[&str] = &[
    ".copy()",
    ".get('a')",
    ".items()",
    ".keys()",
    ".values()",
    ".update(a=1)",
    ".format(1)",
    ".split(',')",
    ".join(['a'])",
    ".replace('a', 'b')",
    ".upper()",
    ".append(1)",
    ".extend([1])",
    ".pop()",
    ".index(1)",
    ".count(1)",
    ".startswith('a')",
    ".strip()",
    ".setdefault('k', 2)",
];

fn py_expr(r: &mut Rng, depth: usize) -> String {
    if depth == 0 || r.chance(25) {
        return match r.below(3) {
            0 => r.pick(NUMBERS).to_string(),
            1 => r.pick(STRINGS).to_string(),
            _ => r.pick(NAMES).to_string(),
        };
    }
    let d = depth - 1;
    match r.below(16) {
        0 => format!("({}{}{})", py_expr(r, d), r.pick(BINOPS), py_expr(r, d)),
        1 => {
            let n = r.below(4);
            let items: Vec<String> = (0..n).map(|_| py_expr(r, d)).collect();
            format!("[{}]", items.join(", "))
        }
        2 => {
            let n = r.below(3);
            let items: Vec<String> = (0..n).map(|_| py_expr(r, d)).collect();
            format!("({},)", items.join(", "))
        }
        3 => {
            let n = r.below(3);
            let items: Vec<String> = (0..n)
                .map(|i| format!("{}{i}={}", r.pick(NAMES), py_expr(r, d)))
                .collect();
            format!("dict({})", items.join(", "))
        }
        4 => format!(
            "{{{}: {}, **{}}}",
            py_expr(r, d),
            py_expr(r, d),
            py_expr(r, d)
        ),
        5 => format!("[v for v in {} if v]", py_expr(r, d)),
        6 => format!("{{str(k): v for k, v in enumerate({})}}", py_expr(r, d)),
        7 => format!("{}({})", r.pick(CALLS), py_expr(r, d)),
        8 => format!("{}{}", py_expr(r, d), r.pick(METHODS)),
        9 => format!("{}[{}]", py_expr(r, d), py_expr(r, d)),
        10 => format!(
            "{}[{}:{}:{}]",
            py_expr(r, d),
            py_expr(r, d),
            py_expr(r, d),
            py_expr(r, d)
        ),
        11 => format!(
            "({} if {} else {})",
            py_expr(r, d),
            py_expr(r, d),
            py_expr(r, d)
        ),
        12 => format!("f'<{{{}}}>'", py_expr(r, d)),
        13 => format!("[{}] * {}", py_expr(r, d), r.pick(NUMBERS)),
        14 => format!("(lambda a: a)({})", py_expr(r, d)),
        _ => format!("{}.{}", py_expr(r, d), r.pick(NAMES)),
    }
}

fn python_program(r: &mut Rng) -> String {
    let mut out = String::from("x = [1, 2.5, 'a']\ncrop = (512, 512)\nd = dict(a=1, b=[2])\n");
    for _ in 0..1 + r.below(6) {
        let line = match r.below(8) {
            0 => format!("{}[{}] = {}", r.pick(NAMES), py_expr(r, 1), py_expr(r, 3)),
            1 => format!("{} += {}", r.pick(NAMES), py_expr(r, 3)),
            2 => format!("{}.{} = {}", r.pick(NAMES), r.pick(NAMES), py_expr(r, 3)),
            3 => format!(
                "if {}:\n    {} = {}",
                py_expr(r, 2),
                r.pick(NAMES),
                py_expr(r, 2)
            ),
            4 => format!("for i in {}:\n    {} = i", py_expr(r, 2), r.pick(NAMES)),
            5 => format!("{}, {} = {}", r.pick(NAMES), r.pick(NAMES), py_expr(r, 3)),
            6 => format!("import {}", r.pick(&["os", "math", "mmseg", "copy"])),
            _ => format!("{} = {}", r.pick(NAMES), py_expr(r, 4)),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

const RHAI_STATEMENTS: &[&str] = &[
    "let a = []; for i in 0..N { a.push(i); }",
    "let s = \"ab\"; for i in 0..N { s += s; }",
    "let a = [1]; for i in 0..N { a += a; }",
    "let a = []; a.pad(N, [1, 2, 3]);",
    "let s = \"x\"; s.pad(N, \"abc\");",
    "let s = \"a b\"; for i in 0..20 { s += s; } let c = s.split(\" \");",
    "let s = \"ab\"; for i in 0..20 { s += s; } let c = s.to_chars();",
    "let m = #{}; for i in 0..N { m[`k${i}`] = i; }",
    "fn f(x) { f(x + 1) } f(0);",
    "fn g(x) { if x > 0 { g(x - 1) + 1 } else { 0 } } let y = g(N);",
    "let c = |x| x + 1; let y = c.call(2);",
    "let c = |x| x + 1;",
    "while true { }",
    "loop { let z = [0; 3]; }",
    "let i = 0; while i < N { i += 1; }",
    "let t = tuple([1, 2]); let u = t[5];",
    "let d = #{a: 1, b: [1, 2]}; d.b.push(d);",
    "throw \"boom\";",
    "let x = 1 / 0;",
    "let x = 9223372036854775807 + 1;",
    "let x = \"a\" * N;",
    "import \"nope\" as n;",
    "let x = eval(\"1 + 1\");",
    "let crop = [512, 512]; let model = #{type: \"EncoderDecoder\"};",
    "let x = parse_json(\"{\\\"a\\\": [1, 2]}\");",
    "debug(N); print(N);",
];

fn rhai_program(r: &mut Rng) -> String {
    let mut out = String::new();
    for _ in 0..1 + r.below(4) {
        let n = r.pick(&["0", "3", "100", "100000", "10000000", "-5", "4294967296"]);
        out.push_str(&r.pick(RHAI_STATEMENTS).replace('N', n));
        out.push('\n');
    }
    out
}

const INSERTS: &[&str] = &[
    "[",
    "]",
    "(",
    ")",
    "{",
    "}",
    ":",
    ",",
    "=",
    "*",
    "**",
    "_base_",
    "{{_base_.x}}",
    "{{ _base_.model }}",
    "_delete_=True",
    " * 100000000",
    "lambda",
    "\n",
    "\t",
    "    ",
    "\"\"\"",
    "'",
    "\\",
    "#",
    "\u{feff}",
    "\u{0}",
    "é",
    "def f():\n",
    "import os\n",
    "del model\n",
    "9999999999999999999999",
    ".",
    "..",
    "@",
    ";",
    "if",
    "else",
    "not",
    "__import__('os')",
];

fn mutate(r: &mut Rng, text: &str) -> String {
    let mut bytes = text.as_bytes().to_vec();
    for _ in 0..1 + r.below(4) {
        let at = r.below(bytes.len() + 1);
        match r.below(5) {
            0 => {
                let s = r.pick(INSERTS).as_bytes();
                bytes.splice(at..at, s.iter().copied());
            }
            1 if !bytes.is_empty() => {
                let end = (at + 1 + r.below(40)).min(bytes.len());
                bytes.drain(at.min(end)..end);
            }
            2 if !bytes.is_empty() => {
                let at = at.min(bytes.len() - 1);
                bytes[at] = r.next() as u8;
            }
            3 => {
                let e = py_expr(r, 2);
                bytes.splice(at..at, e.into_bytes());
            }
            _ => {
                let start = r.below(bytes.len() + 1);
                let end = (start + r.below(200)).min(bytes.len());
                let chunk = bytes[start..end].to_vec();
                bytes.splice(at..at, chunk);
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn random_text(r: &mut Rng) -> String {
    (0..r.below(120))
        .map(|_| match r.below(4) {
            0 => char::from_u32(r.below(0x3000) as u32).unwrap_or('?'),
            _ => (b' ' + r.below(95) as u8) as char,
        })
        .collect()
}

const CFG_OPTIONS: &[&str] = &[
    "model.decode_head.num_classes=3",
    "a.b.c=[1,(2,3)]",
    "x=",
    "=1",
    "train_dataloader.batch_size=-1",
    "model.backbone={{_base_.x}}",
    "optim_wrapper.optimizer.lr=1e999",
    "a=[[[[[[[[[[1]]]]]]]]]]",
    "model.type=None",
    "k='\\''",
    "a.0.b=1",
    "model.decode_head=dict(type='X')",
];

/// A scratch tree whose `configs/<family>/` sit beside a link to the
/// corpus's `_base_`, so that mutated configs resolve their bases.
struct Scratch {
    dir: PathBuf,
    corpus: Vec<(PathBuf, String)>,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("config-fuzz");
        std::fs::create_dir_all(dir.join("configs/family")).unwrap();
        let mut corpus = Vec::new();
        if let Some(shared) = common::require_shared("config_fuzz") {
            let root = shared.join("mmseg-configs/configs");
            let link = dir.join("configs/_base_");
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(root.join("_base_"), &link).unwrap();
            }
            for path in common::configs_under(&root).into_iter().step_by(7) {
                let text = std::fs::read_to_string(&path).unwrap();
                corpus.push((path, text));
            }
        }
        Scratch { dir, corpus }
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.join("configs/family").join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

#[derive(Default)]
struct Tally {
    inputs: usize,
    by_kind: [usize; 5],
    loaded: usize,
    refused: usize,
    limit_errors: usize,
    panics: Vec<PathBuf>,
    slow: Vec<(PathBuf, Duration)>,
    slowest: Duration,
    largest_peak: usize,
}

static STARTED_MS: AtomicU64 = AtomicU64::new(0);

fn now_ms(origin: Instant) -> u64 {
    origin.elapsed().as_millis() as u64 + 1
}

fn watchdog(origin: Instant, current: PathBuf) {
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(200));
        let started = STARTED_MS.load(Ordering::Relaxed);
        if started != 0 && now_ms(origin) - started > WATCHDOG.as_millis() as u64 {
            eprintln!(
                "config fuzz: HANG: an input ran past {} s; it is {}",
                WATCHDOG.as_secs(),
                current.display()
            );
            std::process::exit(3);
        }
    });
}

fn main() {
    let inputs: usize = std::env::var("SEGTUNE_FUZZ_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    // A deadline (seconds) stops the run early; the report says how many ran.
    let deadline = std::env::var("SEGTUNE_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    let seed: u64 = std::env::var("SEGTUNE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20261201);
    // libtest's arguments (`--test-threads`, filters) do not apply here.
    if std::env::args().any(|a| a == "--list") {
        println!("config_fuzz: test");
        return;
    }
    eval_meter::set_hard_cap(MEMORY_CAP);
    std::panic::set_hook(Box::new(|info| eprintln!("config fuzz: PANIC: {info}")));
    let scratch = Scratch::new();
    let origin = Instant::now();
    watchdog(origin, scratch.dir.join("configs/family"));
    let mut r = Rng(seed);
    let mut t = Tally::default();
    for i in 0..inputs {
        if deadline.is_some_and(|d| origin.elapsed() > d) {
            println!("config fuzz: deadline reached after {i} of {inputs} inputs");
            break;
        }
        let kind = if scratch.corpus.is_empty() {
            r.below(4)
        } else {
            r.below(5)
        };
        let (name, text, options): (&str, String, Vec<String>) = match kind {
            0 => ("gen.py", python_program(&mut r), vec![]),
            1 => ("gen.rhai", rhai_program(&mut r), vec![]),
            2 => (
                if r.chance(50) {
                    "bytes.py"
                } else {
                    "bytes.rhai"
                },
                random_text(&mut r),
                vec![],
            ),
            3 => {
                let opts = (0..1 + r.below(3))
                    .map(|_| {
                        let option = *r.pick(CFG_OPTIONS);
                        mutate(&mut r, option)
                    })
                    .collect();
                (
                    "opts.py",
                    "model = dict(decode_head=dict(num_classes=19))\nx = 1\n".into(),
                    opts,
                )
            }
            _ => {
                let (_, original) = &scratch.corpus[r.below(scratch.corpus.len())];
                ("mutant.py", mutate(&mut r, original), vec![])
            }
        };
        let path = scratch.file(name, &text);
        std::fs::write(
            scratch.dir.join("current.txt"),
            format!("{}\n{options:?}\n", path.display()),
        )
        .unwrap();
        STARTED_MS.store(now_ms(origin), Ordering::Relaxed);
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(|| config::resolve(&path, &options));
        let took = started.elapsed();
        STARTED_MS.store(0, Ordering::Relaxed);
        t.inputs += 1;
        t.by_kind[kind] += 1;
        t.slowest = t.slowest.max(took);
        t.largest_peak = t.largest_peak.max(eval_meter::last_peak_bytes());
        let keep = |what: &str| {
            let p = scratch.dir.join(format!("{what}-{i}-{name}"));
            std::fs::write(&p, format!("{text}\n# --cfg-options {options:?}\n")).unwrap();
            p
        };
        match outcome {
            Ok(Ok(_)) => t.loaded += 1,
            Ok(Err(e)) => {
                t.refused += 1;
                if e.to_string().contains("limit") || e.to_string().contains("budget") {
                    t.limit_errors += 1;
                }
            }
            Err(_) => {
                let p = keep("panic");
                t.panics.push(p);
            }
        }
        if took > TIME_CAP {
            let p = keep("slow");
            t.slow.push((p, took));
        }
    }
    let seconds = origin.elapsed().as_secs_f64();
    println!(
        "config fuzz (seed {seed}): {} inputs in {seconds:.1} s ({:.2} ms each): {} generated Python, \
         {} generated Rhai, {} random text, {} --cfg-options, {} mutated MMSeg configs",
        t.inputs,
        1000.0 * seconds / t.inputs.max(1) as f64,
        t.by_kind[0],
        t.by_kind[1],
        t.by_kind[2],
        t.by_kind[3],
        t.by_kind[4]
    );
    println!(
        "  {} loaded, {} refused with an error ({} of them limit errors); {} panics, 0 aborts, \
         {} over {} s; slowest {:.0} ms; largest evaluation peak {:.1} MiB (cap {} MiB)",
        t.loaded,
        t.refused,
        t.limit_errors,
        t.panics.len(),
        t.slow.len(),
        TIME_CAP.as_secs(),
        t.slowest.as_secs_f64() * 1000.0,
        t.largest_peak as f64 / (1 << 20) as f64,
        MEMORY_CAP >> 20
    );
    for p in &t.panics {
        println!("  panic: {}", p.display());
    }
    for (p, d) in &t.slow {
        println!("  slow ({:.1} s): {}", d.as_secs_f64(), p.display());
    }
    if !t.panics.is_empty() || !t.slow.is_empty() {
        std::process::exit(1);
    }
}
