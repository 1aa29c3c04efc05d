"""Fault-probe cases 80-99 (issue 46, round three): the user's code and files.

Run by scripts/fault-probe with the others; each `case_N(tmp)` returns what
it saw or raises `Verdict` (failed) or `Skip`.
"""

from fault_probe import (B0, README, STEM, Skip, Verdict, check, refused, run,  # noqa: F401
                         search_args, write)

import os  # noqa: E402
import subprocess  # noqa: E402

EVIL = "import os\nos.system('touch {marker}')\n"


def evil_config(tmp, head_type="EvilHead"):
    marker = os.path.join(tmp, "PWNED")
    write(tmp, "evil_mod.py", EVIL.format(marker=marker))
    cfg = write(tmp, "evil.py", f"_base_ = ['{B0}']\n"
                                "custom_imports = dict(imports=['evil_mod'], allow_failed_imports=False)\n"
                                f"model = dict(decode_head=dict(type='{head_type}'))\n")
    return cfg, marker


def case_80(tmp):
    """Issue 46 #7: a config whose custom_imports would run code, with a type
    segtune does not build: refused by every command, nothing of the user's
    run, the way to opt in said."""
    cfg, marker = evil_config(tmp)
    env = dict(os.environ, PYTHONPATH=tmp)
    for args in (["estimate", cfg, "--vram", "4G"],
                 ["explain", cfg, "--vram", "4G"],
                 ["trial", cfg, "--crop", "64x64", "--batch-size", "1"],
                 search_args(cfg, os.path.join(tmp, "o80"), "--vram", "4G")):
        r = refused(args, "unknown decode head type `EvilHead`", env=env)
        check("--python-worker" in r.err and "`evil_mod`" in r.err, f"{args[0]}: no opt-in named: {r.err[-300:]}")
    check(not os.path.exists(marker), "the user's module ran")
    r = run(["inspect", cfg], env=env)
    check(r.code == 0 and "supported: no" in r.out and "--python-worker" in r.out, f"inspect: {r.out[-200:]}")
    check(not os.path.exists(marker), "inspect ran the user's module")
    return "estimate, explain, trial, search refuse naming evil_mod and --python-worker; inspect: supported: no + help; nothing ran"


def case_81(tmp):
    """Issue 46 #8: --out holding the user's own search.json and
    report/report.html: refused before any trial, both left as they were."""
    out = os.path.join(tmp, "mine")
    os.makedirs(os.path.join(out, "report"))
    mine = write(out, "search.json", '{"my": "notes"}\n')
    page = write(os.path.join(out, "report"), "report.html", "<!doctype html><title>my results</title>\n")
    r = refused(search_args(README, out, "--vram", "4G"), "search.json exists and segtune did not write it")
    check(open(mine).read() == '{"my": "notes"}\n', "search.json changed")
    os.remove(mine)
    r = refused(search_args(README, out, "--vram", "4G"), "report.html exists and segtune did not write it")
    check(open(page).read().startswith("<!doctype html><title>my results"), "report.html changed")
    check(not os.path.exists(os.path.join(out, "trials.jsonl")), "trials ran")
    os.remove(page)
    write(out, "trials.jsonl", "epoch,loss\n1,0.3\n")
    refused(search_args(README, out, "--vram", "4G"), "trials.jsonl exists and segtune did not write it")
    return "search.json, report/report.html and a foreign trials.jsonl each refused by name, untouched"


def case_82(tmp):
    """Issue 46, unclear: custom_imports of a module that does not exist:
    MMSeg stops with ImportError; segtune says it did not import it."""
    cfg = write(tmp, "noimp.py", f"_base_ = ['{B0}']\n"
                                 "custom_imports = dict(imports=['no_such_module'], allow_failed_imports=False)\n")
    r = run(["inspect", cfg])
    check(r.code == 0 and "supported: yes" in r.out, f"inspect: exit {r.code}")
    check("`no_such_module`" in r.out and "not imported" in r.out and "ImportError" in r.out,
          f"no note: {r.out[:400]}")
    r = run(["estimate", cfg, "--vram", "4G", "--batch-size", "1", "--crop", "64x64", "--json"])
    check(r.code == 0 and "no_such_module" in r.out, f"estimate: exit {r.code}: {r.first_line()}")
    return "inspect and estimate say custom_imports `no_such_module` was not imported (MMSeg would stop)"


def case_83(tmp):
    """Issue 46 #5 (outputs): an atlas whose --out holds the user's atlas.csv,
    and `segtune report` over the user's report page: refused, untouched."""
    out = os.path.join(tmp, "atlas")
    os.makedirs(out)
    mine = write(out, "atlas.csv", "my,table\n1,2\n")
    refused(["atlas", README, "--vram", "4G", "--out", out, "--quiet"], "atlas.csv exists and segtune did not write it")
    check(open(mine).read() == "my,table\n1,2\n", "atlas.csv changed")
    check(not os.path.exists(os.path.join(out, "searches")), "searches ran")
    sdir = os.path.join(tmp, "s")
    r = run(search_args(README, sdir, "--vram", "4G"))
    check(r.code == 0, f"search: {r.first_line()}")
    os.makedirs(os.path.join(sdir, "report"), exist_ok=True)
    page = write(os.path.join(sdir, "report"), "report.html", "<html>my page</html>\n")
    refused(["report", sdir], "report.html exists and segtune did not write it")
    check(open(page).read() == "<html>my page</html>\n", "report.html changed")
    return "atlas and report refuse to replace the user's atlas.csv / report.html"


def case_84(tmp):
    """Issue 46 #4 (asked): search --python-worker of a config with the user's
    own backbone finds a winner; its written config loads in mmengine (the
    module importable) and MMSeg builds it."""
    python = os.environ.get("SEGTUNE_MMSEG_PYTHON")
    if not python or not os.path.isfile(python):
        raise Skip("SEGTUNE_MMSEG_PYTHON (MMSeg 1.2.2, scripts/test-env.sh) is not set")
    write(tmp, "my_backbone.py", "from mmseg.registry import MODELS\n"
                                 "from mmseg.models.backbones import MixVisionTransformer\n\n\n"
                                 "@MODELS.register_module()\nclass MyMiT(MixVisionTransformer):\n    pass\n")
    cfg = write(tmp, "mine.py", f"_base_ = ['{B0}']\n"
                                "custom_imports = dict(imports=['my_backbone'], allow_failed_imports=False)\n"
                                "model = dict(backbone=dict(type='MyMiT'))\n")
    env = dict(os.environ, PYTHONPATH=tmp)
    out = os.path.join(tmp, "o84")
    r = run(search_args(cfg, out, "--vram", "4G", "--python-worker", "--python", python, "--json"),
            env=env, timeout=600)
    check(r.code == 0, f"exit {r.code}: {r.err[-400:]}")
    result = r.json()
    winner = result["winner"]["candidate"]
    written = result["emitted"][0]
    worker = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src", "worker",
                          "python_worker.py")
    load = ("import importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('w', {worker!r})\n"
            "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w); w.stub_mmcv_ext()\n"
            "from mmengine.config import Config\n"
            f"cfg = Config.fromfile({written!r})\n"
            "from mmseg.utils import register_all_modules; register_all_modules()\n"
            "from mmseg.registry import MODELS\n"
            "print(type(MODELS.build(cfg.model).backbone).__name__, cfg.train_dataloader.batch_size)\n")
    p = subprocess.run([python, "-c", load], capture_output=True, text=True, env=env, timeout=300)
    check(p.returncode == 0, f"mmengine cannot load {written}: {p.stderr[-300:]}")
    check(p.stdout.split() == ["MyMiT", str(winner["batch_size"])], f"loaded: {p.stdout!r}")
    return (f"winner batch {winner['batch_size']} x {winner['crop'][0]}x{winner['crop'][1]} {winner['amp']} in "
            f"{r.seconds:.0f} s; the written config loads and builds MyMiT")
