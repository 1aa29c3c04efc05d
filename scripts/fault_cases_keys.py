"""Fault-probe cases 60-79 (issue 46, round three): what is reused: the journal, the trace cache, the atlas's rows.

Run by scripts/fault-probe with the others; each `case_N(tmp)` returns what
it saw or raises `Verdict` (failed) or `Skip`.
"""

from fault_probe import (B0, README, STEM, Skip, Verdict, check, refused, run,  # noqa: F401
                         search_args, write)

import fcntl
import gzip
import json
import glob
import os
import shutil
import subprocess
import time

VRAM = ["--vram", "4G"]


def searched(config, out, *extra):
    """A search that must succeed: its JSON."""
    r = run(search_args(config, out, "--json", *extra))
    check(r.code == 0, f"search {' '.join(extra)}: exit {r.code}: {r.first_line()}")
    return r.json()


def table(result):
    """The winner and the ranked table, the parts a re-run must repeat."""
    rows = [(o["candidate"], o["record"]["status"], o["record"]["device_bytes"]) for o in result["feasible"]]
    return result["winner"]["candidate"] if result["winner"] else None, rows


def reruns_and_says(tmp, first, then, want):
    """A search with `first`, then `then` into one --out: re-run (nothing
    from the journal), the note naming `want`, the table a fresh `then`'s."""
    out = os.path.join(tmp, "one")
    searched(B0, out, *first)
    again = searched(B0, out, *then)
    fresh = searched(B0, os.path.join(tmp, "fresh"), *then)
    stale = again.get("journal_not_reused", {})
    check(again["trials_resumed"] == 0, f"{again['trials_resumed']} trials reused from the journal")
    check(want in (stale.get("differences") or ""), f"the note does not name {want!r}: {stale}")
    check(table(again) == table(fresh), "the re-run's table differs from a fresh search's")
    r = run(search_args(B0, out, *then))
    check("recorded with other inputs" not in r.err + r.out, "a third run with the same inputs still notes others")
    return f"{stale['other_inputs']} rows not reused ({stale['differences']}); equals a fresh search"


def case_60(tmp):
    return reruns_and_says(tmp, VRAM + ["--compute-capability", "6.1"], VRAM + ["--compute-capability", "8.6"],
                           "compute capability 6.1, now 8.6")


def case_61(tmp):
    return reruns_and_says(tmp, ["--preset", "rtx3050ti-laptop", "--cudnn-benchmark", "on"],
                           ["--preset", "rtx3050ti-laptop", "--cudnn-benchmark", "off"], "cuDNN benchmark on, now off")


def case_62(tmp):
    return reruns_and_says(tmp, ["--preset", "rtx3050ti-laptop", "--torch", "1.13"],
                           ["--preset", "rtx3050ti-laptop", "--torch", "2.11"], "PyTorch 1.13, now 2.11")


def case_63(tmp):
    return reruns_and_says(tmp, ["--preset", "rtx3050ti-laptop", "--gt-segments", "4"],
                           ["--preset", "rtx3050ti-laptop"], "label segments 4, now")


def case_64(tmp):
    out = os.path.join(tmp, "out")
    first = searched(README, out)
    path = os.path.join(out, "trials.jsonl")
    with open(path) as f:
        lines = f.read().splitlines()
    # A hand edit: an out-of-memory verdict made a fit.
    edited = [i for i, l in enumerate(lines) if '"status":"oom"' in l]
    check(edited, "no out-of-memory row to edit")
    lines[edited[0]] = lines[edited[0]].replace('"status":"oom"', '"status":"fits"')
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = run(search_args(README, out, "--json"))
    check(r.code == 0, r.first_line())
    again = r.json()
    stale = again.get("journal_not_reused", {})
    check(stale.get("checksum_failed") == 1, f"checksum failures: {stale}")
    check(again["trials_run"] >= 1, "the edited row was trusted")
    check(table(again) == table(first), "the table changed after the edit")
    text = run(search_args(README, out)).out
    check("failed their checksum" in text, "no note in the report text")
    return f"1 edited row ignored and run again ({again['trials_run']} run, {again['trials_resumed']} reused); noted"


def case_65(tmp):
    out = os.path.join(tmp, "out")
    first = searched(README, out)
    again = searched(README, out)
    check(again["trials_run"] == 0 and again["trials_resumed"] == first["trials_run"],
          f"a re-run with nothing changed ran {again['trials_run']}")
    check("journal_not_reused" not in again, f"a note with nothing changed: {again.get('journal_not_reused')}")
    check(table(again) == table(first), "the table changed")
    return f"{again['trials_resumed']} rows reused, no note"


def entries(cache):
    return sorted(glob.glob(os.path.join(cache, "*", "*.json.gz")))


def case_66(tmp):
    cache = os.path.join(tmp, "cache")
    first = searched(README, os.path.join(tmp, "a"), "--trace-cache", cache)
    found = entries(cache)
    check(len(found) >= 2, f"{len(found)} traces cached")
    # The smallest trace (the smallest batch) copied over every other key's file.
    small = min(found, key=os.path.getsize)
    for e in found:
        if e != small:
            shutil.copyfile(small, e)
    again = searched(README, os.path.join(tmp, "b"), "--trace-cache", cache)
    check(table(again) == table(first), f"winner {table(again)[0]} after the copy, {table(first)[0]} before")
    # Each entry traced again and overwritten: its header names its own key.
    wrong = [e for e in found if header(e)["key"] != os.path.basename(e)[:-len(".json.gz")]]
    check(not wrong, f"{len(wrong)} entries still hold another key's trace")
    return f"{len(found) - 1} copied-over entries re-traced and overwritten; winner kept ({table(first)[0]['batch_size']})"


def header(entry):
    with gzip.open(entry) as f:
        return json.loads(f.readline())


def case_67(tmp):
    cache = os.path.join(tmp, "cache")
    first = searched(README, os.path.join(tmp, "a"), "--trace-cache", cache)
    for e in entries(cache):
        write(os.path.dirname(e), os.path.basename(e)[:-len(".json.gz")] + ".failed",
              "the traced meta step failed (infeasible): planted\n")
    stamps = {e: os.stat(e).st_mtime_ns for e in entries(cache)}
    again = searched(README, os.path.join(tmp, "b"), "--trace-cache", cache)
    check(table(again) == table(first), "a planted .failed marker beat a valid trace")
    retraced = [e for e, t in stamps.items() if os.stat(e).st_mtime_ns != t]
    check(not retraced, f"{len(retraced)} traced again with valid traces present")
    return f"{len(stamps)} valid traces win over .failed markers beside them (none re-traced)"


def case_68(tmp):
    cache = os.path.join(tmp, "cache")
    first = searched(README, os.path.join(tmp, "a"), "--trace-cache", cache)
    found = entries(cache)
    for e in found:
        os.remove(e)
        os.symlink("/etc/passwd", e[:-len(".json.gz")] + ".failed")
    out = os.path.join(tmp, "b")
    again = searched(README, out, "--trace-cache", cache)
    for name in ["trials.jsonl", "search.json"]:
        with open(os.path.join(out, name)) as f:
            check("root:" not in f.read(), f"/etc/passwd copied into {name}")
    check(table(again) == table(first), "the table changed")
    # A directory and a pipe in an entry's place are not read either.
    for i, e in enumerate(entries(cache)):
        os.remove(e)
        (os.mkdir if i % 2 else os.mkfifo)(e)
    third = searched(README, os.path.join(tmp, "c"), "--trace-cache", cache)
    check(table(third) == table(first), "the table changed with odd entries")
    return f"{len(found)} symlinked .failed markers ignored (re-traced); directories and pipes too"


def case_69(tmp):
    cache = write(tmp, "cache-file", "not a directory\n")
    r = refused(search_args(README, os.path.join(tmp, "out"), "--trace-cache", cache), "--trace-cache")
    check(cache in r.err and "a file" in r.err, r.first_line())
    r = refused(["atlas", README, "--preset", "rtx3050ti", "--quiet", "--out", os.path.join(tmp, "atlas"),
                 "--trace-cache", cache], "--trace-cache")
    return "search and atlas: exit 2: " + r.first_line()[:100]


def atlas(tmp, out, *extra, prefix=None, code=0):
    r = run(["atlas", README, "--preset", "rtx3050ti", "--preset", "rtx2070", "--quiet", "--json", "--out", out]
            + list(extra), prefix=prefix)
    if code is not None:
        check(r.code == code, f"atlas: exit {r.code}: {r.first_line()}")
    return r


def case_70(tmp):
    out = os.path.join(tmp, "atlas")
    os.makedirs(out)
    garbage = bytes((i * 7919) % 251 for i in range(4096))
    with open(os.path.join(out, "rows.jsonl"), "wb") as f:
        f.write(garbage)
    r = atlas(tmp, out)
    check("damaged" in r.err and "kept aside" in r.err, f"no note on stderr: {r.first_line()}")
    check(r.json().get("notes"), "no note in atlas.json")
    aside = glob.glob(os.path.join(out, "rows.jsonl.damaged-*"))
    check(len(aside) == 1, f"kept aside: {aside}")
    with open(aside[0], "rb") as f:
        check(f.read() == garbage, "the damaged copy is not the file as it was")
    again = atlas(tmp, out)
    check("damaged" not in again.err, "the fresh cache is noted damaged")
    check(again.json()["rows_reused"] == 2, f"reused {again.json()['rows_reused']}")
    return "noted on stderr and in atlas.json, kept aside whole, fresh cache reused next time"


def case_71(tmp):
    out = os.path.join(tmp, "atlas")
    atlas(tmp, out)
    for d in glob.glob(os.path.join(out, "searches", "*", "*", "rtx2070")):
        shutil.rmtree(d)
    again = atlas(tmp, out).json()
    check(again["rows_reused"] == 1, f"reused {again['rows_reused']} with a search folder deleted")
    check(glob.glob(os.path.join(out, "searches", "*", "*", "rtx2070", "trials.jsonl")), "the folder is not back")
    return "the row whose folder was deleted searched again (1 of 2 reused)"


def case_72(tmp):
    out = os.path.join(tmp, "atlas")
    os.makedirs(out)
    with open(os.path.join(out, ".segtune-atlas.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        r = atlas(tmp, out, code=None)
        check(r.code == 2, f"exit {r.code} beside a running atlas")
        check("another segtune atlas" in r.err and "another --out" in r.err, r.first_line())
        check(r.seconds < 10, f"{r.seconds:.1f} s to refuse")
        check(r.out == "", "stdout not empty")
    # Two real atlases at once: one runs, the other is refused.
    procs = [subprocess.Popen([SEGTUNE_BIN(), "atlas", README, "--preset", "rtx3050ti", "--quiet", "--json",
                               "--out", os.path.join(tmp, "both")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    codes = sorted(p.wait(timeout=300) for p in procs)
    check(codes == [0, 2], f"two atlases on one --out: exits {codes}")
    return "exit 2 at once naming the other atlas; of two at once, one ran"


def SEGTUNE_BIN():
    from fault_probe import SEGTUNE
    return SEGTUNE


def case_73(tmp):
    out = os.path.join(tmp, "atlas")
    first = atlas(tmp, out).json()
    search = glob.glob(os.path.join(out, "searches", "*", "*", "rtx2070"))[0]
    shutil.rmtree(os.path.join(out, "searches"))
    os.remove(os.path.join(out, "rows.jsonl"))
    os.makedirs(search)
    with open(os.path.join(search, ".segtune.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        locked = atlas(tmp, out).json()
    failed = [r for r in locked["rows"] if r["status"] == "failed"]
    check(failed and "another segtune search" in failed[0]["reason"], f"rows: {[r['status'] for r in locked['rows']]}")
    again = atlas(tmp, out).json()
    check(again["rows_reused"] == 1, f"reused {again['rows_reused']}: the locked row was kept")
    check([r["status"] for r in again["rows"]] == [r["status"] for r in first["rows"]], "statuses differ")
    return "a row failed by a held search lock is searched again once the lock is gone"


def case_74(tmp):
    out = os.path.join(tmp, "atlas")
    capped = atlas(tmp, out, prefix=["sh", "-c", 'ulimit -v 3000000 && exec "$0" "$@"'], code=None)
    saw = f"capped: exit {capped.code}"
    # Every row a failure of the host: no answer, exit 2 saying so.
    check(capped.code == 2 and "no row could be judged" in capped.err,
          f"capped: exit {capped.code}: {capped.first_line()}")
    healthy = atlas(tmp, out).json()
    fits = sum(r["status"] == "fits" for r in healthy["rows"])
    reused_failed = sum(r["status"] == "failed" for r in healthy["rows"])
    check(reused_failed == 0, f"{reused_failed} failed rows reused after the cap")
    check(fits == 2, f"{fits} fit after the cap")
    return f"{saw}; healthy re-run: {healthy['rows_reused']} reused, {fits} fit"


def case_75(tmp):
    out = os.path.join(tmp, "atlas")
    # Without fork servers, so that the inspection's worker shows its argv.
    env = dict(os.environ, SEGTUNE_FORK_SERVER="0")
    proc = subprocess.Popen([SEGTUNE_BIN(), "atlas", README, "--preset", "rtx3050ti", "--preset", "rtx2070",
                             "--quiet", "--json", "--out", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    killed = 0
    started = time.time()
    while proc.poll() is None and time.time() - started < 120 and killed == 0:
        p = subprocess.run(["pgrep", "-f", "segtune-torch inspect"], capture_output=True, text=True)
        for pid in p.stdout.split():
            try:
                os.kill(int(pid), 9)
                killed += 1
            except OSError:
                pass
        time.sleep(0.01)
    stdout, _ = proc.communicate(timeout=300)
    if killed == 0:
        raise Skip("the inspection ended before it could be killed")
    first = json.loads(stdout) if proc.returncode == 0 else None
    statuses = [r["status"] for r in first["rows"]] if first else f"exit {proc.returncode}"
    healthy = atlas(tmp, out).json()
    check(all(r["status"] == "fits" for r in healthy["rows"]), f"after the kill: {healthy['rows']}")
    reused = healthy["rows_reused"]
    failed_before = sum(s == "failed" for s in statuses) if first else 0
    check(reused <= 2 - failed_before, f"{reused} reused, {failed_before} had failed")
    return f"inspection SIGKILLed: rows {statuses}; re-run: {reused} reused, all fit"
