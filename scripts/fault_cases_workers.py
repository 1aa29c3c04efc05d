"""Fault-probe cases 44-59 (issue 46, round three): launchers and worker teardown.

Run by scripts/fault-probe with the others; each `case_N(tmp)` returns what
it saw or raises `Verdict` (failed) or `Skip`.

The Slurm cases run on the one-node cluster of scripts/slurm-local: the
shared one (SEGTUNE_SLURM_DIR's default) where they only submit jobs, and a
private one (its own directory and ports) for the cases that kill its
controller, so that nobody else's cluster is disturbed.
"""

import os
import shutil
import signal
import subprocess
import time

from fault_probe import (B0, README, ROOT, SEGTUNE, STEM, Skip, Verdict, check, refused,  # noqa: F401
                         run, search_args, write)

SLURM_LOCAL = os.path.join(ROOT, "scripts", "slurm-local")


def slurm_env(private=None):
    """The environment of a search on the local cluster (started here), or
    Skip. `private`: a directory of a cluster of its own (ports 169xx)."""
    if shutil.which("srun") is None:
        raise Skip("srun is not installed")
    env = dict(os.environ)
    if private:
        env.update(SEGTUNE_SLURM_DIR=private, SEGTUNE_SLURMCTLD_PORT="16927",
                   SEGTUNE_SLURMD_PORT="16928")
    p = subprocess.run([SLURM_LOCAL, "start"], capture_output=True, text=True, env=env, timeout=120)
    conf = p.stdout.strip().removeprefix("export SLURM_CONF=")
    if p.returncode != 0 or not conf:
        raise Skip(f"Slurm could not be started: {p.stderr.strip()[:120]}")
    env["SLURM_CONF"] = conf
    return env


def slurm_search(out, *extra):
    return search_args(B0, out, "--preset", "rtx3050ti", "--launcher", "slurm", "--partition", "segtune",
                       "--cpus-per-trial", "1", *extra)


def fake(tmp, name, body):
    path = write(tmp, name, "#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return path


def running(needle):
    """Processes whose command line holds `needle` (not this probe's)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                if ") Z " in f.read():
                    continue
        except OSError:
            continue
        if needle in cmd:
            found.append(f"{pid}: {cmd[:80]}")
    return found


def journal_statuses(out):
    import json
    path = os.path.join(out, "trials.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["record"]["status"] for line in f if line.strip()]


def case_44(tmp):
    """srun exits 2 itself (slurmstepd cannot chdir): no verdict, exit 2 in
    srun's words, nothing reused by a local re-run. A fake srun gives the
    failure a non-root user sees; where the real cluster runs, its
    `--chdir=/nonexistent` is tried too (as root slurmstepd falls back to
    /tmp: then the verdicts must be real ones)."""
    srun = fake(tmp, "srun", "echo \"slurmstepd-vm: error: couldn't chdir to \\`/nonexistent': "
                             "No such file or directory\" >&2\nexit 2")
    out = os.path.join(tmp, "o44")
    env = dict(os.environ, SEGTUNE_SRUN=srun, SEGTUNE_SCANCEL="true", SEGTUNE_SCONTROL="true")
    r = refused(search_args(B0, out, "--preset", "rtx3050ti", "--launcher", "slurm"),
                "couldn't chdir to `/nonexistent'", env=env, timeout=120)
    statuses = journal_statuses(out)
    check(statuses and all(s == "environment" for s in statuses), f"journal statuses {statuses}")
    again = run(search_args(B0, out, "--preset", "rtx3050ti", "--json"), timeout=600)
    check(again.code == 0, f"the local re-run: exit {again.code}: {again.first_line()}")
    resumed = again.json()["trials_resumed"]
    check(resumed == 0, f"the local re-run reused {resumed} trials")
    seen = f"fake srun: exit 2 in {r.seconds:.1f} s ({len(statuses)} environment rows), local re-run reused 0"
    try:
        senv = slurm_env()
    except Skip as e:
        return seen + f"; real srun skipped ({e})"
    out2 = os.path.join(tmp, "o44real")
    real = run(slurm_search(out2, "--srun-args", "--chdir=/nonexistent"), env=senv, timeout=600)
    if real.code == 2:
        check("chdir" in real.err or "nonexistent" in real.err, f"real srun: {real.first_line()}")
        return seen + "; real srun: exit 2 naming the chdir"
    check(real.code == 0, f"real srun: exit {real.code}: {real.first_line()}")
    statuses = journal_statuses(out2)
    check(all(s in ("fits", "oom", "infeasible") for s in statuses), f"real srun: {statuses}")
    return seen + "; real srun (root: slurmstepd went to /tmp): exit 0, real verdicts"


def case_45(tmp):
    """`--srun-args "; touch x"`: srun cannot exec `;`: exit 2 saying so,
    nothing touched, no verdict kept."""
    env = slurm_env()
    out = os.path.join(tmp, "o45")
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        r = refused(slurm_search(out, "--srun-args", "; touch x"), "execve", env=env, timeout=300)
    finally:
        os.chdir(cwd)
    check(not os.path.exists(os.path.join(tmp, "x")), "x was touched")
    statuses = journal_statuses(out)
    check(all(s == "environment" for s in statuses), f"journal statuses {statuses}")
    return f"exit 2 in {r.seconds:.1f} s: {r.first_line()[:110]}"


def case_46(tmp):
    """`--srun-args --bogus-flag`: srun's own complaint is the message."""
    env = slurm_env()
    out = os.path.join(tmp, "o46")
    r = refused(slurm_search(out, "--srun-args", "--bogus-flag"), "unrecognized option '--bogus-flag'",
                env=env, timeout=300)
    return f"exit 2 in {r.seconds:.1f} s naming srun's complaint"


def grandchild_python(tmp, tag):
    """A `--python` that starts a grandchild keeping the pipes open; its
    sleeps told apart by a length of their own."""
    marker = f"sleep {tag}"
    return fake(tmp, f"python{tag}", f"{marker} &\nexec {marker}"), marker


def case_47(tmp):
    """A Python worker whose grandchild holds the pipe (it hung 956 s):
    stopped at --trace-timeout 5 (+10 s at most), nothing left running."""
    python, marker = grandchild_python(tmp, 470000 + os.getpid() % 1000)
    r = refused(["estimate", B0, "--vram", "4G", "--python-worker", "--python", python, "--trace-timeout", "5"],
                "within 5 s", timeout=60)
    check(r.seconds < 15, f"took {r.seconds:.1f} s")
    time.sleep(0.3)
    left = running(marker)
    check(not left, f"left running: {left}")
    return f"exit 2 in {r.seconds:.1f} s, no process left"


def case_48(tmp):
    """The deadline the user gave is the deadline (it was 305 s for 5)."""
    marker = f"sleep {480000 + os.getpid() % 1000}"
    python = fake(tmp, "python48", f"exec {marker}")
    r = refused(["estimate", B0, "--vram", "4G", "--python-worker", "--python", python, "--trace-timeout", "5"],
                "within 5 s", timeout=60)
    check("305" not in r.err, f"the allowance was added: {r.first_line()}")
    check(r.seconds < 15, f"took {r.seconds:.1f} s")
    return f"exit 2 in {r.seconds:.1f} s: {r.first_line()[:90]}"


def case_49(tmp):
    """SIGTERM to an estimate whose Python worker has a grandchild: exit
    143 within seconds, worker and grandchild gone."""
    python, marker = grandchild_python(tmp, 490000 + os.getpid() % 1000)
    p = subprocess.Popen([SEGTUNE, "estimate", B0, "--vram", "4G", "--python-worker", "--python", python,
                          "--trace-timeout", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.time()
    while len(running(marker)) < 2:
        check(time.time() - started < 60 and p.poll() is None, "the worker did not start")
        time.sleep(0.05)
    sent = time.time()
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    took = time.time() - sent
    time.sleep(0.3)
    check(p.returncode == 143, f"exit {p.returncode}")
    check(took < 5, f"took {took:.1f} s")
    left = running(marker)
    check(not left, f"left running: {left}")
    return f"exit 143 in {took:.1f} s, worker and grandchild gone"


def case_50(tmp):
    """A trial past its --timeout on the native worker: the message names
    that deadline, no worker left."""
    r = refused(["trial", B0, "--batch-size", "2", "--crop", "512x512", "--steps", "50", "--timeout", "2"],
                "within 2 s", timeout=60)
    check(r.seconds < 12, f"took {r.seconds:.1f} s")
    time.sleep(0.3)
    left = [p for p in running("segtune-torch run") + running("st-run") if B0 in p or "st-run" in p]
    check(not left, f"left running: {left}")
    return f"exit 2 in {r.seconds:.1f} s: {r.first_line()[:80]}"


def kill_controller(env):
    with open(os.path.join(env["SEGTUNE_SLURM_DIR"], "slurmctld.pid")) as f:
        os.kill(int(f.read().strip()), signal.SIGTERM)


def leftover_jobs(env, prefix):
    """After the controller is back: the search's jobs Slurm still keeps."""
    subprocess.run([SLURM_LOCAL, "start"], capture_output=True, env=env, timeout=120)
    p = subprocess.run(["squeue", "-h", "-o", "%j %T"], capture_output=True, text=True, env=env, timeout=30)
    return [line.split()[0] for line in p.stdout.splitlines() if line.startswith(prefix)]


def cancel_and_stop(env, names):
    for name in names:
        subprocess.run(["scancel", f"--name={name}"], env=env, timeout=30)
    subprocess.run([SLURM_LOCAL, "stop"], env=env, timeout=30)
    time.sleep(1)
    shutil.rmtree(env["SEGTUNE_SLURM_DIR"], ignore_errors=True)


def controller_case(tmp, signal_after=None):
    # munged (user munge) must reach its directory: not under the probe's
    # 0700 temporary directory.
    private = f"/tmp/segtune-probe-slurm-{os.getpid()}"
    os.makedirs(private, mode=0o755, exist_ok=True)
    os.chmod(private, 0o755)
    env = slurm_env(private=private)
    out = os.path.join(tmp, "out")
    cmd = [SEGTUNE] + slurm_search(out, "--max-parallel", "3")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    names = []
    try:
        time.sleep(3)
        kill_controller(env)
        killed = time.time()
        if signal_after is not None:
            time.sleep(signal_after)
            sent = time.time()
            p.send_signal(signal.SIGTERM)
        try:
            _, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            p.kill()
            raise Verdict("no end within 180 s of the controller's death")
        err = err.decode(errors="replace")
        took = time.time() - (killed if signal_after is None else sent)
        prefix = "segtune-"
        named = {w.removeprefix("--name=") for line in err.splitlines() if "scancel --name=" in line
                 for w in line.split() if w.startswith("--name=")}
        names = leftover_jobs(env, prefix)
        unnamed = [n for n in names if n not in named]
        check(not unnamed, f"jobs left in Slurm and not named: {unnamed}; stderr: {err[-300:]}")
        return p.returncode, took, err, named, names
    finally:
        cancel_and_stop(env, names)


def case_51(tmp):
    """slurmctld killed 3 s into a Slurm search (it stalled silently): exit
    2 in bounded time, every job Slurm keeps named with its scancel."""
    code, took, err, named, left = controller_case(tmp)
    check(code == 2, f"exit {code}: {err.strip().splitlines()[-1:]}")
    check("does not answer" in err, f"no word of the controller: {err[-200:]}")
    check(took < 90, f"took {took:.1f} s")
    return f"exit 2 {took:.1f} s after the kill; {len(named)} scancel commands printed, {len(left)} jobs kept"


def case_52(tmp):
    """SIGTERM after slurmctld died (it took 54 s, jobs left unsaid): exit
    143 within seconds, the jobs it could not cancel named."""
    code, took, err, named, left = controller_case(tmp, signal_after=4)
    check(code == 143, f"exit {code}: {err.strip().splitlines()[-1:]}")
    check(took < 10, f"took {took:.1f} s")
    return f"exit 143 {took:.1f} s after SIGTERM; {len(named)} scancel commands printed, {len(left)} jobs kept"
