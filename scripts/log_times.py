#!/usr/bin/env python3
"""Steady-state step times from MMEngine / MMSegmentation 1.x training logs.

Stdlib only (Python 3.11). Three modes:

  log_times.py LOG [LOG ...]
      one TSV row per log (header first): the medians of `time` and
      `data_time` over the steady `Iter(train)` lines, the log's setup
      (GPU, torch, CUDA, cuDNN, cudnn_benchmark, optimizer wrapper / amp,
      batch, crop) and notes.

  log_times.py --extract RUNS.tsv --mirror /work/.mirror --logdir /tmp/logs
      for each `url` (a pinned GitHub blob URL) in RUNS.tsv, `git show`
      commit:path from the mirror <mirror>/<owner>+<repo>/repo into
      <logdir>/<log_name(url)> (falls back to the newest commit that has
      the path, and says so on stderr). A Jupyter notebook's url ends in
      `#run-K`: the K-th training run its cell outputs printed (see
      notebook_runs) is written instead of the notebook.

  log_times.py --fixture RUNS.tsv --logdir /tmp/logs
      re-derives tests/fixtures/mmseg_log_times.tsv: RUNS.tsv has at least
      the columns url, family, config, cfg_options (and optionally use, of
      which only `not built` / `no config` are kept, and src_note); the
      figures, setup and `use` come from the log <logdir>/<log_name(url)>.

  log_times.py --readme-fps GITDIR COMMIT PREFIX URLBASE [CONFIGDIR]
      MMSegmentation's published inference speeds: every table row with a
      numeric `Inf time (fps)` in PREFIX/configs/*/README.md at COMMIT of
      the git dir GITDIR, one TSV row each (config, family, crop, inf_fps,
      device, readme, notes); URLBASE + path names the README. With
      CONFIGDIR (the 1.2.2 config tree) a row whose config is not there
      says so in notes.

Steady lines: every `Iter(train)` (or `Epoch(train)`) line but the first
one logged (warm-up, cudnn benchmark) and any train line that directly
follows a validation block (`Iter(val)`/`Epoch(val)` lines) or a checkpoint
save (`Saving checkpoint`). MMEngine's `time` is the mean over its
LogProcessor window (10 iterations by default) of the whole iteration,
data loading included; `data_time` is the part spent waiting for the
dataloader, so step = time - data_time is the GPU's (forward, backward,
optimizer step) share.
"""
from __future__ import annotations

import ast
import csv
import hashlib
import os
import re
import statistics
import subprocess
import sys
import urllib.parse

TS = re.compile(r"^(\d{4}/)?\d{2}/\d{2} \d{2}:\d{2}:\d{2} - mmengine - ")
TRAIN_ITER = re.compile(r"Iter\(train\)\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]")
TRAIN_EPOCH = re.compile(
    r"Epoch\(train\)\s*\[\s*(\d+)\s*\]\s*\[\s*(\d+)\s*/\s*(\d+)\s*\]")
VAL = re.compile(r"(Iter|Epoch)\((val|test)\)")
TIME = re.compile(r"(?<![\w.])time: ([0-9.]+)")
DATA_TIME = re.compile(r"data_time: ([0-9.]+)")
GPU_LINE = re.compile(r"^\s*GPU ([0-9,]+): (.+?)\s*$")

COLUMNS = [
    "log", "time_s", "data_time_s", "step_s", "n_lines", "interval",
    "first_iter", "last_iter", "max_iters", "gpu", "gpus", "torch", "cuda",
    "cudnn", "cudnn_benchmark", "optim_wrapper", "amp", "batch", "crop_size",
    "pad_size", "pipeline_crop", "model", "backbone", "decode_head",
    "num_classes", "platform", "notes",
]

FIXTURE_COLUMNS = [
    "url", "family", "config", "cfg_options", "batch", "crop", "gpu", "gpus",
    "torch", "cuda", "cudnn", "amp", "cudnn_benchmark", "time_s",
    "data_time_s", "step_s", "n_lines", "first_iter", "last_iter", "use",
    "notes",
]


# ---------------------------------------------------------------- config --
class _Eval(ast.NodeVisitor):
    """Evaluates the literal subset of Python that MMEngine's Config
    pretty-printer writes (dict(...), lists, tuples, constants, names bound
    earlier in the same text)."""

    def __init__(self):
        self.env: dict = {}

    def ev(self, n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Dict):
            return {self.ev(k): self.ev(v) for k, v in zip(n.keys, n.values)
                    if k is not None}
        if isinstance(n, ast.List):
            return [self.ev(e) for e in n.elts]
        if isinstance(n, ast.Tuple):
            return tuple(self.ev(e) for e in n.elts)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) \
                and n.func.id == "dict":
            return {k.arg: self.ev(k.value) for k in n.keywords if k.arg}
        if isinstance(n, ast.Name):
            return self.env.get(n.id)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            v = self.ev(n.operand)
            return -v if isinstance(v, (int, float)) else None
        if isinstance(n, ast.BinOp):
            a, b = self.ev(n.left), self.ev(n.right)
            try:
                if isinstance(n.op, ast.Mult):
                    return a * b
                if isinstance(n.op, ast.Add):
                    return a + b
                if isinstance(n.op, ast.Sub):
                    return a - b
                if isinstance(n.op, ast.Div):
                    return a / b
                if isinstance(n.op, ast.FloorDiv):
                    return a // b
            except Exception:
                return None
        return None

    def run(self, text: str) -> dict:
        tree = ast.parse(text)
        for st in tree.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 \
                    and isinstance(st.targets[0], ast.Name):
                try:
                    self.env[st.targets[0].id] = self.ev(st.value)
                except Exception:
                    self.env[st.targets[0].id] = None
        return self.env


def config_text(lines: list[str]) -> str:
    """The printed config: the lines after `- INFO - Config:` up to the next
    timestamped mmengine line."""
    out, on = [], False
    for ln in lines:
        if not on:
            if TS.match(ln) and ln.rstrip().endswith("- Config:"):
                on = True
            continue
        if TS.match(ln):
            break
        out.append(ln)
    return "".join(out)


def parse_config(text: str) -> tuple[dict, str]:
    if not text.strip():
        return {}, "no printed config"
    # the printed config can be cut by a stray line; retry on a prefix
    body = text
    for _ in range(50):
        try:
            return _Eval().run(body), ""
        except SyntaxError as e:
            ln = (e.lineno or 1) - 1
            keep = body.splitlines(True)[:max(ln, 0)]
            # drop back to the last top-level statement start
            while keep and (keep[-1].startswith((" ", "\t", ")", "]", "}"))
                            or not keep[-1].strip()):
                keep.pop()
            if keep:
                keep.pop()
            if not keep:
                break
            body = "".join(keep)
    return {}, "printed config did not parse"


def g(d, *keys):
    for k in keys:
        if isinstance(d, dict):
            d = d.get(k)
        elif isinstance(d, (list, tuple)) and isinstance(k, int) \
                and -len(d) <= k < len(d):
            d = d[k]
        else:
            return None
    return d


def hxw(v) -> str:
    if isinstance(v, (list, tuple)) and len(v) == 2 \
            and all(isinstance(x, int) for x in v):
        return f"{v[0]}x{v[1]}"
    if isinstance(v, int):
        return f"{v}x{v}"
    return ""


def pipeline_crop(cfg: dict) -> str:
    pipe = g(cfg, "train_dataloader", "dataset", "pipeline")
    if not isinstance(pipe, list):
        ds = g(cfg, "train_dataloader", "dataset")
        # ConcatDataset / RepeatDataset wrappers
        for key in ("dataset", "datasets"):
            inner = g(ds, key)
            if isinstance(inner, list) and inner:
                inner = inner[0]
            if isinstance(g(inner, "pipeline"), list):
                pipe = g(inner, "pipeline")
                break
    if not isinstance(pipe, list):
        pipe = cfg.get("train_pipeline")
    if not isinstance(pipe, list):
        return ""
    for t in pipe:
        if isinstance(t, dict) and t.get("type") in ("RandomCrop",
                                                      "RandomResizedCrop"):
            return hxw(t.get("crop_size") or t.get("scale"))
    return ""


# ------------------------------------------------------------------- log --
def median(xs):
    return statistics.median(xs) if xs else None


def parse_log(path: str) -> dict:
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    notes: list[str] = []
    r = {c: "" for c in COLUMNS}
    r["log"] = path

    # --- environment dump
    gpu_names, listed = [], 0
    world = None
    launcher = None
    distributed = None
    for ln in lines[:400]:
        m = GPU_LINE.match(ln)
        if m and ("NVIDIA" in m.group(2) or "Tesla" in m.group(2)
                  or "GeForce" in m.group(2) or "Quadro" in m.group(2)
                  or re.match(r"[A-Z]", m.group(2))):
            ids = m.group(1).split(",")
            listed += len(ids)
            gpu_names.append(m.group(2))
        if "PyTorch:" in ln and not r["torch"]:
            r["torch"] = ln.split("PyTorch:")[1].strip().split()[0]
        m2 = re.search(r"- CUDA Runtime ([0-9.]+)", ln)
        if m2 and not r["cuda"]:
            r["cuda"] = m2.group(1)
        m2 = re.search(r"- CuDNN ([0-9.]+)", ln)
        if m2 and not r["cudnn"]:
            r["cudnn"] = m2.group(1)
            # PyTorch >= 2.3 prints cuDNN 9.x.y (version 9xy00) as "9x.y"
            # (and 9.x.y as "9x.y.z"-like "90.5.1", "91.0.2")
            mm = re.fullmatch(r"(\d{2,})\.(\d+)(\.\d+)?", r["cudnn"])
            if mm and int(mm.group(1)) >= 10:
                x, y = int(mm.group(1)), int(mm.group(2))
                r["cudnn"] = f"{x // 10}.{(x % 10) * 10 + y}" + \
                    (mm.group(3) or "")
                notes.append(f"env prints CuDNN {mm.group(0)} (cuDNN "
                             f"{r['cudnn']})")
        m2 = re.search(r"sys\.platform: (\S+)", ln)
        if m2 and not r["platform"]:
            r["platform"] = m2.group(1)
        m2 = re.search(r"GPU number: (\d+)", ln)
        if m2:
            world = int(m2.group(1))
        m2 = re.search(r"world_size[:=]\s*(\d+)", ln)
        if m2 and world is None:
            world = int(m2.group(1))
        m2 = re.search(r"Distributed launcher: (\S+)", ln)
        if m2:
            launcher = m2.group(1)
        m2 = re.search(r"Distributed training: (\S+)", ln)
        if m2:
            distributed = m2.group(1) == "True"
        m2 = re.search(r"^\s*cudnn_benchmark: (\S+)", ln)
        if m2 and not r["cudnn_benchmark"]:
            r["cudnn_benchmark"] = m2.group(1)
    if gpu_names:
        name = gpu_names[0]
        r["gpu"] = name[len("NVIDIA "):] if name.startswith("NVIDIA ") \
            else name
        if len(set(gpu_names)) > 1:
            notes.append("env lists several GPU kinds: " +
                         ", ".join(sorted(set(gpu_names))))
    if world is not None:
        gpus = world
    elif distributed is False or launcher == "none":
        gpus = 1
    elif distributed or (launcher and launcher != "none"):
        gpus = max(listed, 1)
        notes.append("GPU count from the env's GPU list (no GPU number)")
    else:
        gpus = 1 if listed <= 1 else listed
        if listed > 1:
            notes.append("no launcher/world size printed; GPUs counted "
                         "from the env's GPU list")
    r["gpus"] = str(gpus)
    if gpus == 1 and listed > 1:
        notes.append(f"env lists {listed} GPUs, non-distributed run")

    # --- config
    cfg, cerr = parse_config(config_text(lines))
    if cerr:
        notes.append(cerr)
    env_cfg = cfg.get("env_cfg")
    if isinstance(env_cfg, dict) and "cudnn_benchmark" in env_cfg:
        r["cudnn_benchmark"] = str(env_cfg["cudnn_benchmark"])
    if not r["cudnn_benchmark"]:
        r["cudnn_benchmark"] = "unknown"
    ow = cfg.get("optim_wrapper")
    if not isinstance(ow, dict):
        m = re.search(r"optim_wrapper = dict\((.*?)\n\S", "".join(lines),
                      re.S)
        ow = {}
        if m:
            t = re.findall(r"type='(\w*OptimWrapper)'", m.group(1))
            if t:
                ow["type"] = t[-1]
            if "bfloat16" in m.group(1):
                ow["dtype"] = "bfloat16"
    owt = ow.get("type", "") if isinstance(ow, dict) else ""
    r["optim_wrapper"] = owt
    if owt == "AmpOptimWrapper":
        dt = str(ow.get("dtype") or "")
        r["amp"] = "bf16" if "bfloat16" in dt or dt == "bf16" else "fp16"
    elif owt:
        r["amp"] = "off"
    else:
        r["amp"] = "unknown"
    bs = g(cfg, "train_dataloader", "batch_size")
    r["batch"] = str(bs) if isinstance(bs, int) else ""
    r["crop_size"] = hxw(cfg.get("crop_size"))
    pad = g(cfg, "model", "data_preprocessor", "size") or \
        g(cfg, "data_preprocessor", "size")
    r["pad_size"] = hxw(pad)
    if not pad and (g(cfg, "model", "data_preprocessor", "size_divisor") or
                    g(cfg, "data_preprocessor", "size_divisor")):
        r["pad_size"] = "div" + str(
            g(cfg, "model", "data_preprocessor", "size_divisor") or
            g(cfg, "data_preprocessor", "size_divisor"))
    r["pipeline_crop"] = pipeline_crop(cfg)
    r["model"] = str(g(cfg, "model", "type") or "")
    bb = g(cfg, "model", "backbone") or {}
    bbs = str(g(bb, "type") or "")
    for k in ("depth", "arch", "embed_dims"):
        if g(bb, k) is not None:
            bbs += f"/{k}={g(bb, k)}"
            break
    r["backbone"] = bbs
    dh = g(cfg, "model", "decode_head")
    if isinstance(dh, list):  # cascade heads
        r["decode_head"] = "+".join(str(g(h, "type")) for h in dh)
        r["num_classes"] = str(g(dh, -1, "num_classes") or "")
    else:
        r["decode_head"] = str(g(dh, "type") or "")
        nc = g(dh, "num_classes")
        r["num_classes"] = "" if nc is None else str(nc)
    interval_cfg = g(cfg, "default_hooks", "logger", "interval")
    if cfg.get("resume") is True or cfg.get("load_from"):
        if cfg.get("resume") is True:
            notes.append("config resume=True")
        else:
            notes.append("load_from set (fine-tune from a checkpoint)")

    # --- train lines
    rec = []  # (iter, max, time, data_time, after_event)
    after_event = False
    restarts = 0
    resumed_log = False
    prev_it = None
    max_iters = None
    for ln in lines:
        if "Iter(train)" in ln or "Epoch(train)" in ln:
            m = TRAIN_ITER.search(ln)
            if m:
                it, mx = int(m.group(1)), int(m.group(2))
            else:
                m = TRAIN_EPOCH.search(ln)
                if not m:
                    continue
                ep, i, n = (int(m.group(k)) for k in (1, 2, 3))
                it, mx = (ep - 1) * n + i, None
            t, d = TIME.search(ln), DATA_TIME.search(ln)
            if not t or not d:
                continue
            if prev_it is not None and it <= prev_it:
                restarts += 1
            prev_it = it
            if mx:
                max_iters = mx
            rec.append((it, float(t.group(1)), float(d.group(1)),
                        after_event))
            after_event = False
        elif VAL.search(ln) or "Saving checkpoint" in ln:
            after_event = True
        elif re.search(r"resumed (epoch|from)|Auto resumed", ln):
            resumed_log = True
            after_event = True
    if max_iters is None:
        me = g(cfg, "train_cfg", "max_epochs")
        if me:
            notes.append(f"epoch-based: max_epochs={me}")
        else:
            max_iters = g(cfg, "train_cfg", "max_iters")
    steady = [x for k, x in enumerate(rec) if k > 0 and not x[3]]
    skipped_after = sum(1 for k, x in enumerate(rec) if k > 0 and x[3])
    if len(steady) < 3 and skipped_after >= 3:
        # validation after every logged line: keep those lines (MMEngine
        # averages `time` over its last 10 iterations, so with a log
        # interval above 10 the slow first iteration after a validation
        # has left the window by the next log line)
        steady = rec[1:]
        notes.append(f"every train line follows a val/checkpoint block: "
                     f"kept them ({skipped_after})")
        skipped_after = 0
    times = [x[1] for x in steady]
    dts = [x[2] for x in steady]
    tm, dm = median(times), median(dts)
    r["n_lines"] = str(len(steady))
    if rec:
        r["first_iter"] = str(rec[0][0])
        r["last_iter"] = str(rec[-1][0])
    r["max_iters"] = "" if max_iters is None else str(max_iters)
    diffs = [b[0] - a[0] for a, b in zip(rec, rec[1:]) if b[0] > a[0]]
    if interval_cfg:
        r["interval"] = str(interval_cfg)
    elif diffs:
        r["interval"] = str(statistics.mode(diffs))
    if tm is not None:
        r["time_s"] = f"{tm:.4f}"
        r["data_time_s"] = f"{dm:.4f}"
        # step_s = time_s - data_time_s as printed (4 decimals each)
        r["step_s"] = f"{float(r['time_s']) - float(r['data_time_s']):.4f}"
    # --- remarks
    if not rec:
        notes.append("no Iter(train) lines")
    if len(steady) < 3:
        notes.append(f"few lines: {len(steady)} steady train line(s)")
    try:
        iv = int(r["interval"])
    except ValueError:
        iv = None
    if rec and iv and rec[0][0] > iv:
        notes.append(f"first logged iter {rec[0][0]} > log interval {iv} "
                     "(resumed?)")
    if resumed_log:
        notes.append("log says resumed from a checkpoint")
    if restarts:
        notes.append(f"iteration counter goes back {restarts} time(s) "
                     "(several runs in one file)")
    if skipped_after:
        notes.append(f"{skipped_after} train line(s) after val/checkpoint "
                     "skipped")
    if len(times) >= 5:
        q = statistics.quantiles(times, n=10)
        spread = (q[-1] - q[0]) / tm if tm else 0
        if spread > 0.25:
            notes.append(f"varying times: p10-p90 {q[0]:.4f}-{q[-1]:.4f} "
                         f"({spread:.0%} of median)")
    if tm and dm is not None and dm > 0.3 * tm:
        notes.append(f"data-bound: data_time {dm:.4f} > 0.3 x time {tm:.4f}")
    if r["pipeline_crop"] and r["pad_size"] and \
            not r["pad_size"].startswith("div") and \
            r["pipeline_crop"] != r["pad_size"]:
        notes.append(f"pipeline crop {r['pipeline_crop']} padded to "
                     f"{r['pad_size']}")
    ctext = config_text(lines)
    if gpus == 1 and "SyncBN" in ctext:
        notes.append("SyncBN in config but non-distributed: MMEngine "
                     "reverts SyncBN->BN")
    if not r["gpu"]:
        cuda = re.search(r"CUDA available: (\S+)", "".join(lines[:60]))
        notes.append("no GPU in the env dump" +
                     (f" (CUDA available: {cuda.group(1)})" if cuda else ""))
    r["restarts"] = restarts
    if r["amp"] == "unknown":
        notes.append("optim_wrapper type not found")
    r["notes"] = "; ".join(notes)
    return r


# --------------------------------------------------------------- helpers --
def split_url(url: str):
    url = url.split("#", 1)[0]
    p = url.split("/")
    owner, repo, commit = p[3], p[4], p[6]
    path = urllib.parse.unquote("/".join(p[7:]))
    return owner, repo, commit, path


def log_name(url: str) -> str:
    _, _, _, path = split_url(url)
    return hashlib.sha1(url.encode()).hexdigest()[:10] + "_" + \
        os.path.basename(path)


RUN_START = re.compile(r"^\s*System environment:\s*$")


def notebook_runs(raw: bytes) -> list[str]:
    """The text a Jupyter notebook's cells printed (stream and text/plain
    outputs, in cell order), cut into one piece per MMEngine Runner: each
    piece starts at the timestamped line before a `System environment:`
    line. Only pieces with `Iter(train)` lines are kept."""
    import json
    nb = json.loads(raw.decode("utf-8", errors="replace"))
    parts = []
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []) or []:
            t = o.get("text")
            if t is None:
                t = (o.get("data") or {}).get("text/plain")
            if t is None:
                continue
            parts.append("".join(t) if isinstance(t, list) else str(t))
    lines = "".join(p if p.endswith("\n") else p + "\n"
                    for p in parts).splitlines(True)
    starts = [max(i - 1, 0) for i, ln in enumerate(lines)
              if RUN_START.match(ln)]
    if not starts:
        starts = [0]
    runs = []
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        piece = "".join(lines[a:b])
        if "Iter(train)" in piece or "Epoch(train)" in piece:
            runs.append(piece)
    return runs


def read_runs(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        body = [ln for ln in f if not ln.startswith("#")]
    return list(csv.DictReader(body, delimiter="\t"))


def extract(runs_tsv: str, mirror: str, logdir: str) -> None:
    os.makedirs(logdir, exist_ok=True)
    for row in read_runs(runs_tsv):
        owner, repo, commit, path = split_url(row["url"])
        d = os.path.join(mirror, f"{owner}+{repo}", "repo")
        out = os.path.join(logdir, log_name(row["url"]))
        p = subprocess.run(["git", "-C", d, "show", f"{commit}:{path}"],
                           capture_output=True)
        if p.returncode != 0:
            hs = subprocess.run(
                ["git", "-C", d, "log", "--all", "--format=%H", "--", path],
                capture_output=True, text=True).stdout.split()
            if not hs:
                print(f"MISSING {row['url']}", file=sys.stderr)
                continue
            p = subprocess.run(["git", "-C", d, "show", f"{hs[0]}:{path}"],
                               capture_output=True)
            print(f"{row['url']}: commit absent, took newest {hs[0]}",
                  file=sys.stderr)
        data = p.stdout
        if path.lower().endswith(".ipynb"):
            m = re.search(r"#run-(\d+)$", row["url"])
            k = int(m.group(1)) if m else 1
            runs = notebook_runs(data)
            if k > len(runs):
                print(f"{row['url']}: notebook has {len(runs)} run(s)",
                      file=sys.stderr)
                continue
            data = runs[k - 1].encode()
        with open(out, "wb") as f:
            f.write(data)


def fixture(runs_tsv: str, logdir: str) -> None:
    runs = read_runs(runs_tsv)
    rows = []
    for run in runs:
        lp = os.path.join(logdir, log_name(run["url"]))
        if not os.path.exists(lp):
            print(f"no log for {run['url']} at {lp}", file=sys.stderr)
            continue
        r = parse_log(lp)
        crop = r["pad_size"] if r["pad_size"] and \
            not r["pad_size"].startswith("div") else r["crop_size"]
        if r["pad_size"].startswith("div") and r["crop_size"]:
            d = int(r["pad_size"][3:])
            h, w = (int(x) for x in r["crop_size"].split("x"))
            crop = f"{-(-h // d) * d}x{-(-w // d) * d}"
        # hand-written remarks ("src: ...") survive a regeneration from
        # the fixture itself
        src = run.get("src_note") or "; ".join(
            seg for seg in (run.get("notes") or "").split("; ")
            if seg.startswith("src: "))
        if src and not src.startswith("src: "):
            src = "src: " + src
        notes = [n for n in (src, r["notes"]) if n]
        if split_url(run["url"])[3].lower().endswith(".ipynb"):
            notes.append("log text taken from the notebook's cell outputs")
        if r["platform"]:
            notes.append(f"platform={r['platform']}")
        notes.append(f"first_iter={r['first_iter']}/{r['max_iters']} "
                     f"interval={r['interval']}")
        hint = (run.get("use") or "").strip()
        t = float(r["time_s"]) if r["time_s"] else None
        d = float(r["data_time_s"]) if r["data_time_s"] else None
        if hint in ("not built", "no config"):
            use = hint
        elif not r["gpu"]:
            use = "no gpu"
        elif r.get("restarts", 0) > 3:
            use = "mixed"
        elif not run.get("config"):
            use = "no config"
        elif r["gpus"] != "1":
            use = "multi-gpu"
        elif t is None or int(r["n_lines"]) < 3:
            use = "few lines"
        elif d > 0.3 * t:
            use = "data-bound"
        else:
            use = "yes"
        rows.append({
            "url": run["url"], "family": run.get("family", ""),
            "config": run.get("config", ""),
            "cfg_options": run.get("cfg_options", ""),
            "batch": r["batch"], "crop": crop, "gpu": r["gpu"],
            "gpus": r["gpus"], "torch": r["torch"], "cuda": r["cuda"],
            "cudnn": r["cudnn"], "amp": r["amp"],
            "cudnn_benchmark": r["cudnn_benchmark"],
            "time_s": r["time_s"], "data_time_s": r["data_time_s"],
            "step_s": r["step_s"], "n_lines": r["n_lines"],
            "first_iter": r["first_iter"], "last_iter": r["last_iter"],
            "use": use, "notes": "; ".join(notes),
        })
    # repeats: same card, config, cfg_options, batch, crop, amp, gpus and
    # time_s within 1% of the first such run's
    seen: dict = {}
    for row in rows:
        if row["use"] not in ("yes", "data-bound", "multi-gpu"):
            continue
        key = (row["gpu"], row["config"], row["cfg_options"], row["batch"],
               row["crop"], row["amp"], row["gpus"])
        t = float(row["time_s"])
        for t0 in seen.get(key, []):
            if abs(t - t0) <= 0.01 * t0:
                row["notes"] = (row["notes"] + "; " if row["notes"] else "") \
                    + f"repeat of a run with time {t0:.4f}"
                row["use"] = "repeat"
                break
        else:
            seen.setdefault(key, []).append(t)
    w = csv.writer(sys.stdout, delimiter="\t", lineterminator="\n")
    w.writerow(FIXTURE_COLUMNS)
    for row in rows:
        w.writerow([row[c] for c in FIXTURE_COLUMNS])


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|"):
        line = line[:-1]
    # `\|` inside a cell (model \| log links) is not a separator
    parts = re.split(r"(?<!\\)\|", line)
    return [c.strip() for c in parts]


def readme_fps(gitdir: str, commit: str, prefix: str, urlbase: str,
               configdir: str | None) -> None:
    names = subprocess.run(
        ["git", "-C", gitdir, "ls-tree", "-r", "--name-only", commit],
        capture_output=True, text=True, check=True).stdout.split("\n")
    pat = re.compile(re.escape(prefix.rstrip("/") + "/") +
                     r"configs/([^/]+)/README\.md$")
    have = set()
    if configdir:
        for root, _, files in os.walk(configdir):
            have.update(f[:-3] for f in files if f.endswith(".py"))
    w = csv.writer(sys.stdout, delimiter="\t", lineterminator="\n")
    w.writerow(["config", "family", "crop", "inf_fps", "device", "readme",
                "notes"])
    for name in sorted(n for n in names if pat.search(n)):
        family = pat.search(name).group(1)
        text = subprocess.run(["git", "-C", gitdir, "show",
                               f"{commit}:{name}"], capture_output=True,
                              text=True).stdout
        url = urlbase + urllib.parse.quote(name)
        section, head = "", None
        for ln in text.splitlines():
            if ln.startswith("#"):
                section = ln.lstrip("#").strip()
                head = None
                continue
            if not ln.lstrip().startswith("|"):
                head = None
                continue
            cells = _cells(ln)
            low = [c.lower() for c in cells]
            if head is None:
                if any("fps" in c for c in low):
                    head = low
                continue
            if all(set(c) <= set("-: ") for c in cells):
                continue

            def col(*keys):
                for k in keys:
                    for i, h in enumerate(head):
                        if k in h and i < len(cells):
                            return cells[i]
                return ""
            fps = col("fps")
            try:
                fps_v = float(fps)
            except ValueError:
                continue
            cfg = ""
            for c in cells:
                m = re.search(r"\[config\]\(([^)]+?\.py)\)", c)
                if m:
                    cfg = os.path.basename(m.group(1))[:-3]
                    break
            crop = col("crop size", "crop")
            notes = [f"section={section}"]
            for k in ("method", "backbone", "lr schd", "mem (gb)"):
                v = col(k)
                if v:
                    notes.append(f"{k}={v}")
            if not cfg:
                notes.append("row links no config")
            elif configdir and cfg not in have:
                import difflib
                # same model tokens (r50, s36, b0, mg124 ...), closest text
                toks = {t for t in re.split(r"[_-]", cfg)
                        if re.fullmatch(r"[a-z]+\d+", t)}
                pool = [h for h in sorted(have)
                        if toks <= set(re.split(r"[_-]", h))]
                near = difflib.get_close_matches(cfg, pool, n=1, cutoff=0.6)
                notes.append("config not in MMSeg 1.2.2 wheel configs" +
                             (f" (nearest: {near[0]})" if near else ""))
            w.writerow([cfg, family, crop, f"{fps_v:g}", col("device"), url,
                        "; ".join(notes)])


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "--extract":
        a = dict(zip(argv[2::2], argv[3::2]))
        extract(argv[1], a.get("--mirror", "/work/.mirror"),
                a.get("--logdir", "/tmp/logs"))
        return 0
    if argv[0] == "--readme-fps":
        readme_fps(argv[1], argv[2], argv[3], argv[4],
                   argv[5] if len(argv) > 5 else None)
        return 0
    if argv[0] == "--fixture":
        a = dict(zip(argv[2::2], argv[3::2]))
        fixture(argv[1], a.get("--logdir", "/tmp/logs"))
        return 0
    w = csv.writer(sys.stdout, delimiter="\t", lineterminator="\n")
    w.writerow(COLUMNS)
    for p in argv:
        r = parse_log(p)
        w.writerow([r[c] for c in COLUMNS])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
