#!/usr/bin/env python3
"""The fault and hostile-input cases: the 43 of ../shared/fault-cases.md and
issue 46's (round three), run again.

Run through scripts/fault-probe (which builds the release binaries and sets
SEGTUNE_BIN and SEGTUNE_SHARED). Each case injects its fault for real (a
signal to the search or its worker, an address-space cap, /dev/full, a full
tmpfs where this user may mount one, hostile configs and values) and prints
one line: its number, `held`, `FAILED` or `skipped`, and what was seen.
Exit code 1 if any case failed.

A case "holds" as ../shared/fault-cases.md defines it: exit 2 (or 0 where
that is right) with a clear message, stdout clean, nothing lost, nothing
left running. Usage: scripts/fault-probe [CASE_NUMBER ...]
"""

import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("SEGTUNE_BIN", os.path.join(os.path.dirname(__file__), "..", "target", "release"))
SEGTUNE = os.path.join(BIN, "segtune")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("SEGTUNE_SHARED", os.path.join(ROOT, "..", "shared"))
README = os.path.join(ROOT, "docs", "examples", "segformer_mit-b0_8xb2-160k_ade20k-512x512.rhai")
B0 = os.path.join(SHARED, "mmseg-configs", "configs", "segformer", "segformer_mit-b0_8xb2-160k_ade20k-512x512.py")
STEM = "segformer_mit-b0_8xb2-160k_ade20k-512x512"


class Verdict(Exception):
    pass


def check(ok, what):
    if not ok:
        raise Verdict(what)


class Run:
    def __init__(self, code, out, err, seconds):
        self.code, self.out, self.err, self.seconds = code, out, err, seconds

    def json(self):
        return json.loads(self.out)

    def first_line(self):
        return (self.err.strip().splitlines() or [""])[0][:160]


def run(args, timeout=300, stdout=None, env=None, prefix=None):
    cmd = (prefix or []) + [SEGTUNE] + [str(a) for a in args]
    started = time.time()
    try:
        p = subprocess.run(cmd, stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise Verdict(f"no answer within {timeout} s: {' '.join(cmd[-6:])}")
    out = p.stdout.decode(errors="replace") if p.stdout is not None else ""
    return Run(p.returncode, out, p.stderr.decode(errors="replace"), time.time() - started)


def refused(args, want, timeout=120, **kw):
    """Exit 2, nothing on stdout, `want` (a string or any of a tuple) on stderr."""
    r = run(args, timeout=timeout, **kw)
    wants = want if isinstance(want, tuple) else (want,)
    check(r.code == 2, f"exit {r.code} for {args[:3]}: {r.first_line()}")
    check(r.out == "", f"stdout not empty for {args[:3]}")
    check(any(w in r.err for w in wants), f"{args[:3]}: expected {want!r}, got: {r.first_line()}")
    check("panicked" not in r.err and "frame #" not in r.err, f"{args[:3]}: a panic or backtrace: {r.first_line()}")
    return r


def search_args(config, out, *extra):
    return ["search", config, "--device", "cpu", "--quiet", "--out", out] + list(extra)


def write(dir, name, text):
    path = os.path.join(dir, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def children_of(pid, what=None):
    args = ["pgrep", "-P", str(pid)] + (["-f", what] if what else [])
    p = subprocess.run(args, capture_output=True, text=True)
    return [int(x) for x in p.stdout.split()]


def workers_of(pid, what="segtune-torch run"):
    """The workers running a request for `pid`: spawned (`segtune-torch
    run`, its children) or forked by one of its fork servers (the
    servers' children, named st-<command>)."""
    found = children_of(pid, what)
    if what == "segtune-torch run":
        for server in children_of(pid, "segtune-torch serve"):
            found += children_of(server)
    return found


def wait_for_worker(proc, timeout=60):
    started = time.time()
    while time.time() - started < timeout:
        w = workers_of(proc.pid)
        if w:
            return w[0]
        if proc.poll() is not None:
            raise Verdict("the command ended before a worker started")
        time.sleep(0.02)
    raise Verdict("no worker started")


def kill_a_worker(proc, sig, timeout=60):
    """Sends `sig` to one of `proc`'s workers; a worker that ended before
    the signal reached it (a meta trace takes a second) gives way to the
    next one."""
    started = time.time()
    while time.time() - started < timeout:
        try:
            os.kill(wait_for_worker(proc, timeout), sig)
            return
        except ProcessLookupError:
            time.sleep(0.01)
    raise Verdict("no worker lived long enough to be signalled")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z " not in f.read()
    except OSError:
        return False


def can_mount_tmpfs(dir, size):
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", dir],
                          stderr=subprocess.DEVNULL).returncode == 0


def umount(dir):
    subprocess.run(["umount", dir], stderr=subprocess.DEVNULL)


UNDISTURBED = {}


def undisturbed_winner(tmp):
    if "winner" not in UNDISTURBED:
        out = os.path.join(tmp, "undisturbed")
        r = run(search_args(README, out, "--json"))
        check(r.code == 0, f"the undisturbed search failed: {r.first_line()}")
        UNDISTURBED["winner"] = r.json()["winner"]["candidate"]
        UNDISTURBED["out"] = out
    return UNDISTURBED["winner"]


# ---------------------------------------------------------------- the cases

def case_1(tmp):
    os.symlink("loop_b.py", os.path.join(tmp, "loop_a.py"))
    os.symlink("loop_a.py", os.path.join(tmp, "loop_b.py"))
    os.mkdir(os.path.join(tmp, "adir.py"))
    os.symlink("/dev/zero", os.path.join(tmp, "zero.py"))
    os.mkfifo(os.path.join(tmp, "fifo.py"))
    seen = []
    for base, want in [("loop_a.py", "symbolic link"), ("adir.py", "directory"), ("zero.py", "device"),
                       ("fifo.py", "FIFO"), ("missing.py", "does not exist")]:
        cfg = write(tmp, f"uses_{base}", f"_base_ = ['{base}']\nx = 1\n")
        r = refused(["resolve", cfg], want, timeout=20)
        check(":1" in r.err, f"{base}: no file:line: {r.first_line()}")
        seen.append(want)
    return "exit 2 saying: " + ", ".join(seen)


def case_2(tmp):
    write(tmp, "cyc_a.py", "_base_ = ['cyc_b.py']\na = 1\n")
    write(tmp, "cyc_b.py", "_base_ = ['cyc_a.py']\nb = 1\n")
    r = refused(["resolve", os.path.join(tmp, "cyc_a.py")], "cycle")
    check("cyc_b.py" in r.err, "the cycle is not named")
    big = write(tmp, "big.py", "x = '" + "a" * (5 << 20) + "'\n")
    refused(["resolve", write(tmp, "uses_big.py", "_base_ = ['big.py']\n")], "MiB")
    for i in range(30):
        write(tmp, f"d{i}.py", f"_base_ = ['d{i + 1}.py']\nk{i} = {i}\n" if i < 29 else "k29 = 29\n")
    r = run(["resolve", os.path.join(tmp, "d0.py")], timeout=20)
    check(r.code == 0, f"a 30-deep chain: exit {r.code}")
    return f"cycle named, 5 MiB base refused, 30-deep chain in {r.seconds:.2f} s"


def case_3(tmp):
    deep = write(tmp, "deep.py", "x = " + "dict(a=" * 100000 + "1" + ")" * 100000 + "\n")
    refused(["resolve", deep], "nested more than")
    for name, text in [("braces.py", "x = " + "{'a': " * 100000 + "1" + "}" * 100000 + "\n"),
                       ("lists.py", "x = " + "[" * 100000 + "]" * 100000 + "\n")]:
        refused(["resolve", write(tmp, name, text)], "nested more than")
    refused(["resolve", write(tmp, "long.py", "x = '" + "a" * 10 ** 7 + "'\n")], "MiB")
    return "exit 2: nesting limit, file-size limit"


def case_4(tmp):
    r = run(["resolve", write(tmp, "l99.py", "x = " + "[" * 99 + "1" + "]" * 99 + "\n")], timeout=30)
    check(r.code == 0 or ("nested" in r.err and "complexity" not in r.err),
          f"a 99-deep list: exit {r.code}: {r.first_line()}")
    r2 = refused(["resolve", write(tmp, "l101.py", "x = " + "[" * 101 + "1" + "]" * 101 + "\n")], "nested")
    return f"99 deep: exit {r.code}; 101 deep: {r2.first_line()[:80]}"


def case_5(tmp):
    texts = {
        "bom.py": "\ufeffx = 1\n",
        "crlf.py": "x = 1\r\ny = 2\r\n",
        "cr.py": "x = 1\ry = 2\r",
        "uni.py": "größe = 1\n",
    }
    codes = []
    for name, text in texts.items():
        r = run(["resolve", write(tmp, name, text)])
        check(r.code in (0, 2) and "panicked" not in r.err, f"{name}: exit {r.code}: {r.first_line()}")
        codes.append(f"{name} {r.code}")
    path = os.path.join(tmp, "bad.py")
    with open(path, "wb") as f:
        f.write(b"x = '\xff\xfe'\n")
    refused(["resolve", path], ("UTF-8", "utf-8"))
    return ", ".join(codes) + ", invalid UTF-8 2"


def case_6(tmp):
    write(tmp, "base6.py", "a = 1\n")
    refused(["resolve", write(tmp, "nope.py", "_base_ = ['base6.py']\nb = {{_base_.nope}}\n")], "nope")
    return "a missing `{{_base_.x}}` named"


def case_7(tmp):
    for name, text in [("loop.rhai", "loop { }"), ("while.rhai", "let i = 0; while true { i += 1; }"),
                       ("rec.rhai", "fn f(x) { f(x + 1) } let y = f(0);"),
                       ("dbl.rhai", "let s = \"ab\"; loop { s += s; }"),
                       ("push.rhai", "let a = []; loop { a.push(1); }")]:
        r = refused(["resolve", write(tmp, name, text)], ("limit", "exceeded", "stack"), timeout=30)
        check(r.seconds < 20, f"{name}: {r.seconds:.1f} s")
    return "every loop stopped by a limit within 20 s"


def case_8(tmp):
    refused(["resolve", write(tmp, "imp_missing.rhai", 'import "no_such_preset" as g;\nlet x = 1;')], "not found")
    refused(["resolve", write(tmp, "imp_etc.rhai", 'import "../../etc/passwd" as g;\nlet x = 1;')], "not found")
    return "exit 2: module not found"


def case_9(tmp):
    write(tmp, "self_imp.rhai", 'import "self_imp" as me;\nlet x = 1;')
    refused(["resolve", os.path.join(tmp, "self_imp.rhai")], "cycle", timeout=30)
    write(tmp, "mut_a.rhai", 'import "mut_b" as b;\nlet x = 1;')
    write(tmp, "mut_b.rhai", 'import "mut_a" as a;\nlet y = 1;')
    refused(["resolve", os.path.join(tmp, "mut_a.rhai")], "cycle", timeout=30)
    write(tmp, "via_a.rhai", 'import "via_m" as m;\nlet w = 1;')
    write(tmp, "via_m.rhai", 'let _base_ = ["via_c.py"];\nlet v = 1;')
    write(tmp, "via_c.py", "_base_ = ['via_a.rhai']\nz = 1\n")
    refused(["resolve", os.path.join(tmp, "via_a.rhai")], "cycle", timeout=30)
    return "self, mutual and via-.py imports: exit 2 naming the cycle"


def case_10(tmp):
    for i, text in enumerate(["f = lambda x: x\n", "y = (x := 1)\n", "def f():\n    pass\n", "class A:\n    pass\n",
                              "try:\n    x = 1\nexcept Exception:\n    pass\n", "x = 1\ndel x\n", "import os\n",
                              "x = __import__('os')\n", "x = open('/etc/passwd')\n",
                              "from mmengine.config import read_base\nwith read_base():\n    pass\n"]):
        # The last: mmengine's own words for a `with read_base()` body.
        refused(["resolve", write(tmp, f"c{i}.py", text)],
                ("unsupported", "not supported", "Unsupported", "Illegal syntax"))
    return "10 constructs refused by name; nothing executed"


def case_11(tmp):
    r = run(["resolve", write(tmp, "fs.py", "n = 3\ns = f'{n + 1:03d}'\nl = [i * 2 for i in range(n)]\n"),
             "--format", "json"])
    check(r.code == 0, r.first_line())
    v = r.json()
    check(v["s"] == "004" and v["l"] == [0, 2, 4], f"values: {v}")
    return "exit 0, f-string and comprehension values right"


def case_12(tmp):
    text = "s = 'a'*10**5\nx = [s]*10\ny = [x]*10\nz = [y]*10\nw = [z]*10\n"
    r = refused(["resolve", write(tmp, "shared.py", text)], "limit", timeout=30)
    r2 = refused(["resolve", write(tmp, "shared10.py", text + "v = [w]*10\n")], "limit", timeout=30)
    return f"exit 2 in {r.seconds:.2f} s and {r2.seconds:.2f} s (10x)"


def case_13(tmp):
    for text in ["segtune = dict(preset='nope')\n", "segtune = dict(vram='4X')\n", "segtune = dict(margin=2)\n",
                 "segtune = dict(gpus=0)\n", "segtune = dict(bogus=1)\n", "segtune = 3\n"]:
        cfg = write(tmp, "sd.py", f"_base_ = ['{B0}']\n" + text)
        refused(search_args(cfg, os.path.join(tmp, "o13")), ("segtune", "preset", "vram"))
    return "6 bad `segtune` dicts refused"


def case_14(tmp):
    for v in ["0", "-1G", "1e30", "4XB", "nanG", "0x10", "18446744073709551616"]:
        refused(["estimate", README, "--vram", v, "--crop", "64x64", "--batch-size", "1"], "vram")
    r = run(["estimate", README, "--vram", "1K", "--crop", "64x64", "--batch-size", "1", "--json"])
    check(r.code in (0, 2), f"--vram 1K: exit {r.code}")
    return "7 bad --vram refused; 1K answered"


def case_15(tmp):
    for args in [["trial", README, "--batch-size", "0"], ["trial", README, "--crop", "0x0"],
                 ["trial", README, "--crop", "1x1"], ["trial", README, "--crop", "100000x100000"],
                 ["estimate", README, "--vram", "4G", "--gpus", "0"], ["search", README, "--margin", "2"],
                 ["search", README, "--margin", "nan"], ["trial", README, "--steps", "0"],
                 ["trial", README, "--accum", "0"], ["estimate", README, "--vram", "4G", "--torch", "3.0"]]:
        refused(args, ("must", "not", "invalid", "between", "at least", "release"))
    return "10 zero or out-of-range values refused"


def case_16(tmp):
    for args in [["estimate", README, "--vram", "4G", "--crop", "-64x64"], ["search", README, "--margin", "-0.5"]]:
        r = refused(args, ("must", "not", "between"))
        check("unexpected argument" not in r.err, r.first_line())
    return "refused by value"


def case_17(tmp):
    refused(["search", README, "--gpus", "9223372036854775807"], "4096")
    refused(["estimate", README, "--vram", "4G", "--gpus", "100000"], "4096")
    return "--gpus bounded to 4096"


def case_18(tmp):
    refused(["estimate", README, "--vram", "4G", "--preset", "rtx3090"], ("cannot be used", "conflict"))
    refused(["estimate", README, "--vram", "4G", "--vram", "8G"], ("more than once", "cannot be used"))
    refused(["search", README, "--hf", tmp], ("cannot be used", "conflict"))
    return "conflicting flags refused"


def case_19(tmp):
    for opt in ["a..b=1", "=1", ".a=1", "model.backbone.depth=abc"]:
        r = run(["resolve", README, "--cfg-options", opt])
        check(r.code in (0, 2) and "panicked" not in r.err, f"{opt}: exit {r.code}")
    refused(["estimate", README, "--vram", "4G", "--cfg-options", "model.decode_head.num_classes=abc"], "num_classes")
    return "resolve as mmengine; estimate refuses a bad value"


def case_20(tmp):
    for opt, key in [("model.decode_head.num_classes=-5", "num_classes"), ("model.decode_head.channels=-1", "channels"),
                     ("model.backbone.embed_dims=0", "embed_dims"), ("model.backbone.embed_dims=-32", "embed_dims")]:
        r = refused(["trial", README, "--crop", "64x64", "--batch-size", "1", "--cfg-options", opt], key)
        check("without a report" not in r.err and "101" not in r.err, r.first_line())
    return "each names its key; no worker panic"


def case_21(tmp):
    opts = [f"k{i}={i}" for i in range(10000)]
    r = run(["resolve", README, "--cfg-options"] + opts, timeout=60)
    check(r.code == 0, f"10k options: exit {r.code}")
    refused(["resolve", README, "--cfg-options", ".".join(["a"] * 5000) + "=1"], ("nested", "levels", "deep"))
    return f"10k options in {r.seconds:.1f} s; a 5000-level key refused"


def case_22(tmp):
    with open("/dev/full", "w") as full:
        r = run(["resolve", README], stdout=full)
    check(r.code == 2 and "cannot write to stdout" in r.err, f"/dev/full: exit {r.code}: {r.first_line()}")
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    if not can_mount_tmpfs(mnt, "4k"):
        return "/dev/full: exit 2 (no tmpfs here)"
    try:
        with open(os.path.join(mnt, "out.py"), "w") as f:
            r = run(["resolve", README], stdout=f)
    finally:
        umount(mnt)
    check(r.code == 2, f"full tmpfs: exit {r.code}")
    return "/dev/full and a full 4 KiB tmpfs: exit 2 naming stdout"


def case_23(tmp):
    expected = undisturbed_winner(tmp)
    out = os.path.join(tmp, "o23")
    p = subprocess.Popen([SEGTUNE] + search_args(README, out, "--json"), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    started = time.time()
    while time.time() - started < 60:
        try:
            if sum(1 for _ in open(os.path.join(out, "trials.jsonl"))) >= 3:
                break
        except OSError:
            pass
        time.sleep(0.05)
    p.kill()
    p.wait()
    r = run(search_args(README, out, "--json"))
    check(r.code == 0, r.first_line())
    v = r.json()
    check(v["trials_resumed"] >= 3, f"resumed {v['trials_resumed']}")
    check(v["winner"]["candidate"] == expected, "another winner")
    a = open(os.path.join(out, f"{STEM}_segtune.rhai")).read().split("\n", 1)[1]
    b = open(os.path.join(UNDISTURBED["out"], f"{STEM}_segtune.rhai")).read().split("\n", 1)[1]
    check(a == b, "the emitted config differs")
    return f"{v['trials_resumed']} from the journal + {v['trials_run']} run; same winner and config"


def case_24(tmp):
    expected = undisturbed_winner(tmp)
    out = os.path.join(tmp, "o24")
    p = subprocess.Popen([SEGTUNE] + search_args(README, out, "--json"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    kill_a_worker(p, signal.SIGKILL)
    stdout, stderr = p.communicate(timeout=300)
    check(p.returncode == 0, stderr.decode()[:160])
    v = json.loads(stdout)
    check(v["winner"]["candidate"] == expected, "another winner")
    statuses = [json.loads(l)["record"]["status"] for l in open(os.path.join(out, "trials.jsonl"))]
    check("crash" not in statuses, f"a crash kept: {statuses}")
    return "the killed trace was tried again; same winner"


def case_25(tmp):
    expected = undisturbed_winner(tmp)
    out = os.path.join(tmp, "o25")
    r = run(search_args(README, out), prefix=["sh", "-c", 'ulimit -v 8000000 && exec "$0" "$@"'])
    check(r.code == 2 and "no candidate could be judged" in r.err, f"exit {r.code}: {r.first_line()}")
    r2 = run(search_args(README, out, "--json"))
    check(r2.code == 0, r2.first_line())
    v = r2.json()
    check(v["trials_resumed"] == 0 and v["winner"]["candidate"] == expected, "reused or another winner")
    return f"capped: exit 2 in {r.seconds:.1f} s; re-run: {v['trials_run']} run, 0 reused, same winner"


def case_26(tmp):
    out = os.path.join(tmp, "o26")
    run(search_args(README, out))
    path = os.path.join(out, "trials.jsonl")
    lines = open(path).read().splitlines(True)
    with open(path, "w") as f:
        f.writelines(lines[:4])
        f.write(lines[4][: len(lines[4]) // 2])
    r = run(search_args(README, out, "--json"))
    check(r.code == 0, r.first_line())
    v = r.json()
    check(v["journal_skipped_lines"] == 1 and v["trials_resumed"] == 4, f"skipped {v['journal_skipped_lines']}")
    return f"resumed {v['trials_resumed']}, skipped 1 torn line, ran {v['trials_run']}"


def case_27(tmp):
    out = os.path.join(tmp, "o27")
    p = subprocess.Popen([SEGTUNE] + search_args(README, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_worker(p)
    refused(search_args(README, out), "another segtune search")
    refused(["report", out], ("another segtune search", "search.json"))
    p.wait()
    return "the second search and the report refused, naming the lock"


def case_28(tmp):
    ro = os.path.join(tmp, "ro")
    os.mkdir(ro)
    if subprocess.run(["mount", "--bind", ro, ro], stderr=subprocess.DEVNULL).returncode != 0:
        raise Skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", ro], check=True, stderr=subprocess.DEVNULL)
        r = refused(search_args(README, os.path.join(ro, "out")), ("Read-only", "read-only"))
    finally:
        umount(ro)
    return f"exit 2 in {r.seconds:.1f} s, before any trial"


def case_29(tmp):
    f = write(tmp, "afile", "mine")
    for out in [f, "/dev/null", os.path.join(f, "sub")]:
        refused(search_args(README, out), "--out must be a directory")
    check(open(f).read() == "mine", "the file changed")
    return "a file, /dev/null, under a file: --out must be a directory"


def case_30(tmp):
    for kind in ["dir", "fifo", "foreign", "passwd"]:
        out = os.path.join(tmp, f"o30{kind}")
        os.mkdir(out)
        j = os.path.join(out, "trials.jsonl")
        if kind == "dir":
            os.mkdir(j)
        elif kind == "fifo":
            os.mkfifo(j)
        elif kind == "foreign":
            write(out, "trials.jsonl", "not a journal\n" * 10)
        else:
            os.symlink("/etc/passwd", j)
        before = open("/etc/passwd").read()
        refused(search_args(README, out), ("not a regular file", "not a segtune journal"), timeout=30)
        check(open("/etc/passwd").read() == before, "/etc/passwd changed")
    return "directory, FIFO, foreign text, a link to /etc/passwd: refused, untouched"


def case_31(tmp):
    mnt = os.path.join(tmp, "m31")
    os.mkdir(mnt)
    if not can_mount_tmpfs(mnt, "64k"):
        raise Skip("cannot mount a tmpfs here")
    try:
        filler = os.path.join(mnt, "filler")
        with open(filler, "wb") as f:
            f.write(b"x" * (60 << 10))
        out = os.path.join(mnt, "out")
        r = run(search_args(README, out))
        check(r.code == 2 and ("No space" in r.err or "space" in r.err), f"exit {r.code}: {r.first_line()}")
        leftovers = [n for n in os.listdir(out) if "tmp" in n] if os.path.isdir(out) else []
        check(not leftovers, f"temporary files left: {leftovers}")
        os.remove(filler)
        r2 = run(search_args(README, out, "--json"))
        check(r2.code == 0, f"resume after freeing: {r2.first_line()}")
    finally:
        umount(mnt)
    return f"exit 2 ({r.first_line()[:60]}...); resumed after freeing space"


def case_32(tmp):
    base = UNDISTURBED.get("out") or (undisturbed_winner(tmp) and UNDISTURBED["out"])
    mnt = os.path.join(tmp, "m32")
    os.mkdir(mnt)
    if not can_mount_tmpfs(mnt, "1m"):
        raise Skip("cannot mount a tmpfs here")
    try:
        out = os.path.join(mnt, "out")
        shutil.copytree(base, out)
        saved = open(os.path.join(out, "search.json")).read()
        stat = os.statvfs(mnt)
        with open(os.path.join(mnt, "filler"), "wb") as f:
            f.write(b"x" * max(0, stat.f_bavail * stat.f_frsize - (8 << 10)))
        r = run(search_args(README, out, "--margin", "0.1"))
        check(r.code == 2, f"exit {r.code}")
        check(open(os.path.join(out, "search.json")).read() == saved, "search.json changed")
        leftovers = [n for n in os.listdir(out) if n.startswith(".") and "tmp" in n or n.endswith(".tmp")]
        check(not leftovers, f"temporary files left: {leftovers}")
    finally:
        umount(mnt)
    return "exit 2; the old search.json intact; no temporary file left"


def case_33(tmp):
    seen = []
    for sig, code in [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]:
        p = subprocess.Popen([SEGTUNE] + search_args(README, os.path.join(tmp, f"o33{code}")),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        w = wait_for_worker(p)
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        time.sleep(0.3)
        check(p.returncode == code, f"{sig.name}: exit {p.returncode}")
        check(b"finished trials are in the journal" in err, f"{sig.name}: {err[:100]}")
        check(not alive(w), f"{sig.name}: worker {w} still runs")
        seen.append(f"{sig.name} {code}")
    return ", ".join(seen) + "; workers reaped"


def case_34(tmp):
    expected = undisturbed_winner(tmp)
    p = subprocess.Popen([SEGTUNE] + search_args(README, os.path.join(tmp, "o34"), "--json", "--trace-timeout", "5"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    started = time.time()
    os.kill(wait_for_worker(p), signal.SIGSTOP)
    stdout, stderr = p.communicate(timeout=300)
    check(p.returncode == 0, stderr.decode()[:160])
    check(json.loads(stdout)["winner"]["candidate"] == expected, "another winner")
    return f"the stopped worker timed out and was tried again; done in {time.time() - started:.1f} s"


def case_35(tmp):
    out = os.path.join(tmp, "o35")
    os.mkdir(out)
    mine = write(out, f"{STEM}_segtune.rhai", "// my own file\nlet x = 1;\n")
    refused(search_args(README, out), "segtune did not write it", timeout=30)
    check(open(mine).read() == "// my own file\nlet x = 1;\n", "the user's file changed")
    check(not os.path.exists(os.path.join(out, "trials.jsonl")), "trials ran")
    return "refused before any trial; the file untouched"


def case_36(tmp):
    src = os.path.join(tmp, "in36")
    shutil.copytree(os.path.dirname(README), src)
    config = os.path.join(src, os.path.basename(README))
    before = open(config).read()
    out = os.path.join(tmp, "o36")
    os.mkdir(out)
    os.symlink(config, os.path.join(out, f"{STEM}_segtune.rhai"))
    r = run(search_args(config, out))
    check(r.code in (0, 2), f"exit {r.code}")
    check(open(config).read() == before, "the input changed")
    return f"exit {r.code}; the input unchanged"


def case_37(tmp):
    d = os.path.join(tmp, "hf37")
    os.mkdir(d)
    write(d, "config.json", json.dumps({"model_type": "segformer"}))
    r = run(["search", "--hf", d, "--vram", "4G", "--out", d, "--quiet"])
    check(r.code == 2 and r.seconds < 30, f"exit {r.code} after {r.seconds:.0f} s")
    check(sorted(os.listdir(d)) == ["config.json"], "written into the model directory")
    return f"exit 2 in {r.seconds:.1f} s: {r.first_line()[:70]}"


def case_38(tmp):
    out = UNDISTURBED.get("out") or (undisturbed_winner(tmp) and UNDISTURBED["out"])
    left = [n for n in os.listdir(out) if "tmp" in n]
    check(not left, f"temporary files left: {left}")
    r = run(["resolve", os.path.join(out, f"{STEM}_segtune_resolved.py")])
    check(r.code == 0, "the emitted config does not resolve")
    return "no temporary file left; the emitted configs resolve"


def case_39(tmp):
    out = os.path.join(tmp, "o39")
    run(search_args(README, out))
    run(["report", out])
    r = run(search_args(README, out, "--margin", "0.1"))
    check("shows the search saved here before this one" in r.out, "no note on the stale report")
    return "the stale report page is named"


def case_40(tmp):
    refused(["trial", README, "--batch-size", "1000000000", "--crop", "512x512"], "the input batch alone")
    return "refused before it grows"


def case_41(tmp):
    p = subprocess.Popen([SEGTUNE, "trial", README, "--crop", "256x256", "--batch-size", "2", "--steps", "50"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    w = wait_for_worker(p)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    time.sleep(0.3)
    check(p.returncode == 143, f"exit {p.returncode}")
    check(not alive(w), "the worker still runs")
    return "exit 143; the worker gone"


def case_42(tmp):
    cfg = write(tmp, "odd.py", "model = dict(type='EncoderDecoder', backbone=dict(type='NoSuchNet'), "
                               "decode_head=dict(type='FCNHead', num_classes=2))\n"
                               "train_dataloader = dict(batch_size=2)\ncrop_size = (512, 512)\n")
    out = os.path.join(tmp, "o42")
    refused(search_args(cfg, out, "--vram", "4G"), "unknown backbone type `NoSuchNet`")
    check(not os.path.exists(os.path.join(out, "trials.jsonl")), "trials ran")
    return "refused before any trial"


def case_43(tmp):
    cfg = write(tmp, "odd43.py", "model = dict(type='EncoderDecoder', backbone=dict(type='NoSuchNet'), "
                                 "decode_head=dict(type='FCNHead', num_classes=2))\n")
    refused(["estimate", cfg, "--vram", "4G", "--crop", "64x64", "--batch-size", "1"], "NoSuchNet")
    refused(["trial", cfg, "--crop", "64x64", "--batch-size", "1"], "NoSuchNet")
    return "estimate and trial refuse it by name"


class Skip(Exception):
    pass


# Round three's cases (issue 46) live in modules of their own beside this
# one, each a range of numbers: fault_cases_workers.py (44-59: launchers and
# teardown), fault_cases_keys.py (60-79: journal, trace cache, atlas rows),
# fault_cases_user.py (80-99: the user's code and files). They import their
# helpers from here.
ROUND_THREE = ["fault_cases_workers", "fault_cases_keys", "fault_cases_user"]


def all_cases():
    import importlib
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # One copy of this module: the cases raise the Verdict main() catches.
    sys.modules.setdefault("fault_probe", sys.modules[__name__])
    found = {n: globals()[f"case_{n}"] for n in range(1, 44)}
    for name in ROUND_THREE:
        module = importlib.import_module(name)
        for attr in dir(module):
            if attr.startswith("case_") and attr[5:].isdigit():
                found[int(attr[5:])] = getattr(module, attr)
    return sorted(found.items())


def main():
    wanted = {int(a) for a in sys.argv[1:]}
    cases = [(n, case) for n, case in all_cases() if not wanted or n in wanted]
    failed = 0
    tmp_root = tempfile.mkdtemp(prefix="segtune-fault-probe-")
    try:
        for n, case in cases:
            tmp = os.path.join(tmp_root, f"case{n}")
            os.mkdir(tmp)
            started = time.time()
            try:
                verdict, detail = "held", case(tmp)
            except Verdict as e:
                verdict, detail = "FAILED", str(e)
                failed += 1
            except Skip as e:
                verdict, detail = "skipped", str(e)
            except Exception as e:  # the probe's own error is a failure too
                verdict, detail = "FAILED", f"probe error: {e!r}"
                failed += 1
            print(f"{n:2d} {verdict:7s} {time.time() - started:6.1f}s  {detail}", flush=True)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    print(f"{len(cases) - failed} of {len(cases)} cases held or skipped, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
