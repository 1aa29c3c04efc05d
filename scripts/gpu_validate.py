#!/usr/bin/env python3
"""The one device check: everything segtune needs to learn from a real GPU,
in one time-boxed run (scripts/gpu-validate.sh runs it; docs/gpu-validation.md
says how to read it).

Parts, in order, each with its own time box, each writing its rows as it
goes to OUT/gpu-validate.md and OUT/gpu-validate.json (rewritten after every
row, atomically), so that a run cut off still returns what it measured:

1. device facts: name, compute capability, cuDNN version, memory, the CUDA
   context measured (cudaMemGetInfo before and after initialisation);
2. predicted vs measured: `segtune estimate` beside a real `segtune-torch
   trial` (peak allocated and reserved, first interval and steady state,
   images/s) for configs across the families, fp32/fp16/bf16, cudnn
   benchmark on and off;
3. the cuDNN workspace table: every convolution shape of a few CNN configs'
   traces run alone with benchmark on and off, its workspace measured as
   the allocator's peak over its inputs and outputs and its algorithm read
   from the kernels it launched; written as
   OUT/cudnn_workspace_sm<XY>_<cudnn>.csv (tests/fixtures/ takes it as is);
4. small cards emulated: `segtune search --device cuda:0 --preset P` end to
   end with real trials under the preset's cap, then the emitted winner run
   for 20 steps under the same cap: it must not run out of memory and its
   steady-state peak must fit.

It ends with a one-screen summary and exits 0 even when a part failed (the
part's row says how). --dry-run runs the same flow on the CPU: the CUDA
stand-in (`--as-cuda`) for trials, two small configs, predicted searches,
and part 3 skipped (cuDNN needs a GPU); tests/gpu_validate.rs checks what
it writes.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (family, config under mmseg-configs/configs, batch, crop, amp, benchmark)
# for part 2 on a GPU: the families the predictor covers, fp32 and fp16
# (bf16 for a few), benchmark on (MMSeg 1.x's default) and off.
GPU_ROWS = [
    ("SegFormer", "segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512", 2, "512x512", "off", "on"),
    ("SegFormer", "segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512", 2, "512x512", "fp16", "on"),
    ("SegFormer", "segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512", 2, "512x512", "bf16", "on"),
    ("SegFormer", "segformer/segformer_mit-b2_8xb2-160k_ade20k-512x512", 2, "512x512", "off", "on"),
    ("SegFormer", "segformer/segformer_mit-b2_8xb2-160k_ade20k-512x512", 2, "512x512", "fp16", "off"),
    ("PSPNet", "pspnet/pspnet_r50-d8_4xb4-80k_ade20k-512x512", 8, "256x256", "off", "on"),
    ("PSPNet", "pspnet/pspnet_r50-d8_4xb4-80k_ade20k-512x512", 8, "256x256", "off", "off"),
    ("PSPNet", "pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024", 2, "512x1024", "fp16", "on"),
    ("DeepLabV3+", "deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024", 2, "512x1024", "off", "on"),
    ("DeepLabV3+", "deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024", 2, "512x1024", "off", "off"),
    ("FCN", "fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024", 2, "512x1024", "off", "on"),
    ("UPerNet", "upernet/upernet_r50_4xb4-80k_ade20k-512x512", 4, "512x512", "off", "on"),
    ("UPerNet", "upernet/upernet_r50_4xb4-80k_ade20k-512x512", 4, "512x512", "bf16", "on"),
    ("OCRNet", "ocrnet/ocrnet_hr18_4xb2-40k_cityscapes-512x1024", 2, "512x1024", "off", "on"),
    ("UNet", "unet/unet-s5-d16_fcn_4xb4-40k_hrf-256x256", 4, "256x256", "off", "on"),
    # The zoo rows nothing explains yet (docs/prediction.md, "What stays
    # under" and "Over"), at their published setups: whether the GPU holds
    # what the trace does settles them.
    ("PoolFormer FPN", "poolformer/fpn_poolformer_s12_8xb4-40k_ade20k-512x512", 4, "512x512", "off", "off"),
    ("MobileNetV2 FCN", "mobilenet_v2/mobilenet-v2-d8_fcn_4xb4-160k_ade20k-512x512", 4, "512x512", "off", "off"),
    ("ConvNeXt", "convnext/convnext-tiny_upernet_8xb2-amp-160k_ade20k-512x512", 2, "512x512", "fp16", "off"),
    ("HRNet", "hrnet/fcn_hr18_4xb2-40k_cityscapes-512x1024", 2, "512x1024", "off", "on"),
    ("Swin UPerNet", "swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512", 2, "512x512", "off", "on"),
    ("Swin UPerNet", "swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512", 2, "512x512", "fp16", "on"),
    ("ViT", "vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512", 2, "512x512", "off", "on"),
    ("SETR", "setr/setr_vit-l_naive_8xb1-160k_ade20k-512x512", 1, "512x512", "fp16", "on"),
    ("ConvNeXt", "convnext/convnext-tiny_upernet_8xb2-amp-160k_ade20k-512x512", 2, "512x512", "fp16", "on"),
    ("K-Net", "knet/knet-s3_r50-d8_fcn_8xb2-adamw-80k_ade20k-512x512", 2, "512x512", "off", "on"),
    ("Mask2Former", "mask2former/mask2former_r50_8xb2-160k_ade20k-512x512", 2, "512x512", "off", "on"),
    ("Mask2Former", "mask2former/mask2former_swin-t_8xb2-160k_ade20k-512x512", 2, "512x512", "off", "on"),
]

# The dry run: two small configs on the CUDA stand-in, and one segtune
# refuses (its row says so and the run goes on).
DRY_ROWS = [
    ("SegFormer", "README", 2, "128x128", "off", "on"),
    ("PSPNet", "pspnet/pspnet_r18-d8_4xb2-80k_cityscapes-512x1024", 2, "64x64", "off", "off"),
    ("SAN", "san/san-vit-b16_voc12aug-640x640", 2, "64x64", "off", "on"),
]

# Part 3's configs (their convolutions' shapes come from segtune's trace).
WORKSPACE_ROWS = [
    ("pspnet/pspnet_r50-d8_4xb4-80k_ade20k-512x512", 8, "256x256", "off"),
    ("upernet/upernet_r50_4xb4-80k_ade20k-512x512", 4, "512x512", "off"),
    ("deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024", 2, "512x1024", "fp16"),
]

# Part 4: (what, config, preset). The README example imports the 3050 Ti.
SEARCH_ROWS = [
    ("README example", "README", "rtx3050ti-laptop"),
    ("PSPNet R-50 recipe", "pspnet/pspnet_r50-d8_4xb4-80k_ade20k-512x512", "rtx3050ti-laptop"),
]
# The dry run's second search is a small CNN (its winner's CPU stand-in
# trial takes seconds; PSPNet R-18's 4x512x1024 took minutes in a debug build).
DRY_SEARCH_ROWS = [
    ("README example", "README", "rtx3050ti-laptop"),
    ("UNet DRIVE recipe", "unet/unet-s5-d16_fcn_4xb4-40k_drive-64x64", "rtx3050ti-laptop"),
]

SECTIONS = {
    "device": ["fact", "value", "how"],
    "predicted_vs_measured": [
        "family", "config", "batch", "crop", "amp", "benchmark", "status",
        "pred_least_mib", "pred_alloc_mib", "pred_low_mib", "pred_high_mib", "pred_first_mib", "pred_resv_mib",
        "meas_alloc_mib", "meas_first_mib", "meas_resv_mib", "alloc_error_pct", "pred_img_s", "meas_img_s", "note",
    ],
    "cudnn_workspace": ["config", "convolutions", "rows", "file", "status", "note"],
    "small_cards": ["what", "preset", "status", "winner", "trials", "winner_peak_mib", "budget_mib", "fits", "note"],
}


class Report:
    """The rows so far, rewritten to OUT after each one."""

    def __init__(self, out):
        self.out = out
        self.data = {name: [] for name in SECTIONS}
        self.data["summary"] = {}
        os.makedirs(out, exist_ok=True)
        self.flush()

    def row(self, section, **cells):
        self.data[section].append({k: cells.get(k, "") for k in SECTIONS[section]})
        self.flush()

    def flush(self):
        def atomic(path, text):
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, path)

        atomic(os.path.join(self.out, "gpu-validate.json"), json.dumps(self.data, indent=1))
        lines = ["# segtune gpu-validate", ""]
        for name, columns in SECTIONS.items():
            lines += [f"## {name}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            for r in self.data[name]:
                lines.append("| " + " | ".join(str(r[c]) for c in columns) + " |")
            lines.append("")
        if self.data["summary"]:
            lines += ["## summary", "", "```", self.data["summary"].get("text", ""), "```", ""]
        atomic(os.path.join(self.out, "gpu-validate.md"), "\n".join(lines))


def run(cmd, timeout, env=None):
    """(returncode, stdout, stderr); a timeout is returncode 124."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return 124, e.stdout or "", f"timed out after {timeout} s"


def mib(b):
    return "" if b is None else round(b / 2**20)


def config_path(shared, name):
    if name == "README":
        return os.path.join(ROOT, "docs/examples/segformer_mit-b0_8xb2-160k_ade20k-512x512.rhai")
    return os.path.join(shared, "mmseg-configs", "configs", name + ".py")


def first_line(text):
    """The message of a failed command: its `error:` line, else its last."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()] or [""]
    line = next((l for l in lines if l.startswith("error")), lines[-1])
    return line[:200].replace("|", "/")


def device_facts(report, args):
    """Part 1. Returns (vram bytes, compute capability, cudnn version)."""
    if args.dry_run:
        facts = [("device", "cpu (dry run: the CUDA stand-in)", "--dry-run"),
                 ("compute_capability", args.compute_capability, "--compute-capability"),
                 ("vram_bytes", str(args.dry_vram), "--dry-vram")]
        for f in facts:
            report.row("device", fact=f[0], value=f[1], how=f[2])
        return args.dry_vram, args.compute_capability, "none"
    code = r"""
import json, torch
torch.cuda.init()
f1, total = torch.cuda.mem_get_info()
x = torch.ones(1, device='cuda')
torch.backends.cudnn.benchmark = True
c = torch.nn.functional.conv2d(torch.ones(1, 8, 8, 8, device='cuda'), torch.ones(8, 8, 3, 3, device='cuda'))
torch.cuda.synchronize()
f2, _ = torch.cuda.mem_get_info()
p = torch.cuda.get_device_properties(0)
print(json.dumps(dict(name=p.name, cc='%d.%d' % (p.major, p.minor), total=total, sms=p.multi_processor_count,
    cudnn=torch.backends.cudnn.version(), torch=torch.__version__,
    context_after_init=total - f1, context_after_first_kernels=total - f2 - torch.cuda.memory_reserved())))
"""
    rc, out, err = run([sys.executable, "-c", code], 120)
    if rc != 0:
        report.row("device", fact="error", value=first_line(err), how="python3 torch")
        return None, None, None
    d = json.loads(out)
    for k, v in d.items():
        report.row("device", fact=k, value=v, how="torch.cuda (mem_get_info: total less free)")
    return d["total"], d["cc"], str(d["cudnn"])


def predicted_vs_measured(report, args, shared, vram, cc, deadline):
    """Part 2."""
    rows = DRY_ROWS if args.dry_run else GPU_ROWS
    for family, name, batch, crop, amp, bench in rows:
        if time.time() > deadline:
            report.row("predicted_vs_measured", family=family, config=name, status="skipped", note="part's time box spent")
            continue
        cfg = config_path(shared, name)
        common = ["--batch-size", str(batch), "--crop", crop, "--amp", amp, "--cudnn-benchmark", bench]
        rc, out, err = run([args.segtune, "estimate", cfg, "--json", "--vram", str(vram),
                            "--compute-capability", cc] + common, 300)
        if rc != 0:
            report.row("predicted_vs_measured", family=family, config=name, batch=batch, crop=crop, amp=amp,
                       benchmark=bench, status="estimate failed", note=first_line(err))
            continue
        e = json.loads(out)
        device = ["--as-cuda"] if args.dry_run else ["--device", "cuda:0"]
        steps = ["--warmup", "1", "--steps", "3"]
        rc, out, err = run([args.worker, "trial", cfg, "--json"] + device + steps + common, args.trial_timeout)
        try:
            m = json.loads(out)
        except ValueError:
            m = {"status": "crash" if rc not in (0, 1, 124) else ("timeout" if rc == 124 else "error"),
                 "message": first_line(err)}
        if args.dry_run:
            alloc, first, resv = m.get("peak_bytes"), None, None
        else:
            alloc = m.get("cuda_peak_allocated_bytes")
            first = m.get("cuda_first_step_peak_allocated_bytes")
            resv = m.get("cuda_peak_reserved_bytes")
        pred = e["predicted_peak_allocated_bytes"]
        err_pct = round(100.0 * (pred - alloc) / alloc, 1) if alloc else ""
        report.row("predicted_vs_measured", family=family, config=name, batch=batch, crop=crop, amp=amp,
                   benchmark=bench, status=m.get("status"),
                   pred_least_mib=mib(e.get("predicted_min_peak_allocated_bytes")), pred_alloc_mib=mib(pred),
                   pred_low_mib=mib(e.get("predicted_peak_allocated_low_bytes")),
                   pred_high_mib=mib(e.get("predicted_peak_allocated_high_bytes")),
                   pred_first_mib=mib(e.get("predicted_first_interval_peak_allocated_bytes")),
                   pred_resv_mib=mib(e.get("predicted_peak_reserved_bytes")),
                   meas_alloc_mib=mib(alloc), meas_first_mib=mib(first), meas_resv_mib=mib(resv),
                   alloc_error_pct=err_pct, meas_img_s=m.get("images_per_s") or "",
                   note=("CPU stand-in: counted tensors, not CUDA's" if args.dry_run else "")
                   + (" " + str(m.get("message", ""))[:120] if m.get("status") != "ok" else ""))


WORKSPACE_CODE = r"""
import json, sys, torch
from torch.profiler import profile, ProfilerActivity
shapes, bench_flags, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
FAMILIES = [('fft', 'tile', 'FFT_TILING'), ('fft', '', 'FFT'), ('winograd', 'nonfused', 'WINOGRAD_NONFUSED'),
            ('winograd', '', 'WINOGRAD'), ('implicit_convolve', '', 'IMPLICIT_GEMM'), ('precomputed', '', 'IMPLICIT_PRECOMP_GEMM'),
            ('gemm', '', 'IMPLICIT_PRECOMP_GEMM')]
NAMES = {'forward': 'CUDNN_CONVOLUTION_FWD_ALGO_', 'backward_data': 'CUDNN_CONVOLUTION_BWD_DATA_ALGO_',
         'backward_filter': 'CUDNN_CONVOLUTION_BWD_FILTER_ALGO_'}
BWD = {'FFT_TILING': 'FFT_TILING', 'FFT': 'FFT', 'WINOGRAD_NONFUSED': 'WINOGRAD_NONFUSED', 'WINOGRAD': 'WINOGRAD',
       'IMPLICIT_GEMM': '0', 'IMPLICIT_PRECOMP_GEMM': '1'}
def algo_of(names, direction):
    text = ' '.join(names).lower()
    for a, b, fam in FAMILIES:
        if a in text and b in text:
            if direction == 'forward':
                return NAMES[direction] + fam
            tail = BWD[fam] if not (direction == 'backward_filter' and fam == 'WINOGRAD') else None
            if direction == 'backward_filter' and fam == 'FFT_TILING':
                tail = 'FFT'
            return NAMES[direction] + tail if tail else None
    return None
rows = []
for s in shapes:
    dt = {'f32': torch.float32, 'f16': torch.float16, 'bf16': torch.bfloat16}[s['dtype']]
    for bench in bench_flags:
        torch.backends.cudnn.benchmark = bench
        torch.cuda.empty_cache()
        x = torch.randn(s['n'], s['c'], s['h'], s['w'], device='cuda', dtype=dt, requires_grad=True)
        w = torch.randn(s['k'], s['c'] // s['groups'], s['r'], s['s'], device='cuda', dtype=dt, requires_grad=True)
        conv = lambda: torch.nn.functional.conv2d(x, w, None, s['stride'], s['pad'], s['dilation'], s['groups'])
        y = conv(); g = torch.ones_like(y); torch.autograd.grad(y, (x, w), g); torch.cuda.synchronize()  # warm: searches done
        for direction in ('forward', 'backward_data', 'backward_filter'):
            torch.cuda.synchronize(); base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                if direction == 'forward':
                    y = conv()
                    held = y.numel() * y.element_size()
                else:
                    y = conv(); torch.cuda.synchronize(); base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
                    wrt = x if direction == 'backward_data' else w
                    (gr,) = torch.autograd.grad(y, (wrt,), g, retain_graph=True)
                    held = gr.numel() * gr.element_size()
                torch.cuda.synchronize()
            ws = max(0, torch.cuda.max_memory_allocated() - base - held)
            names = [e.name for e in prof.key_averages() if e.device_type.name == 'CUDA' or 'cuda' in str(e.device_type).lower()]
            algo = algo_of(names, direction)
            rows.append(dict(direction=direction, **{k: s[k] for k in ('n', 'c', 'h', 'w', 'k', 'r', 's', 'groups', 'dtype')},
                             stride=s['stride'], pad=s['pad'], dilation=s['dilation'], benchmark=int(bench),
                             algo=algo or 'UNMAPPED', workspace_bytes=ws, kernels=';'.join(names)[:300]))
json.dump(rows, open(out, 'w'))
"""


def conv_shapes(args, shared, name, batch, crop, amp, tmp):
    """The distinct convolution shapes of a config's traced step."""
    trace = os.path.join(tmp, "trace.txt")
    rc, out, err = run([args.worker, "trial", config_path(shared, name), "--batch-size", str(batch), "--crop", crop,
                        "--amp", amp, "--op-trace", "meta", "--trace-out", trace, "--json", "--steps", "1",
                        "--warmup", "0"], 300)
    shapes = {}
    if rc != 0 or not os.path.exists(trace):
        return None, first_line(err)
    for line in open(trace):
        if not line.startswith("k ") or " aten::convolution " not in line:
            continue
        parts = line.split()
        x, wt = parts[5], parts[6]
        m1 = re.match(r"t:(\w+):(\d+)x(\d+)x(\d+)x(\d+)", x)
        m2 = re.match(r"t:\w+:(\d+)x(\d+)x(\d+)x(\d+)", wt)
        if not (m1 and m2):
            continue
        ints = lambda t: [int(v) for v in t.split(":")[1].split(",")] if t.startswith("l:") else []
        stride, pad, dil = ints(parts[8]), ints(parts[9]), ints(parts[10])
        groups = int(parts[13].split(":")[1]) if parts[13].startswith("i:") else 1
        dtype = {"f32": "f32", "bf16": "f16" if amp == "fp16" else "bf16", "f16": "f16"}.get(m1.group(1), "f32")
        s = dict(n=int(m1.group(2)), c=int(m1.group(3)), h=int(m1.group(4)), w=int(m1.group(5)),
                 k=int(m2.group(1)), r=int(m2.group(3)), s=int(m2.group(4)), stride=stride or [1, 1],
                 pad=pad or [0, 0], dilation=dil or [1, 1], groups=groups, dtype=dtype)
        shapes[json.dumps(s, sort_keys=True)] = s
    return list(shapes.values()), ""


def cudnn_workspace(report, args, shared, cc, cudnn, deadline):
    """Part 3."""
    if args.dry_run:
        report.row("cudnn_workspace", config="-", status="skipped", note="dry run: cuDNN needs a GPU")
        return
    header = ("direction,n,c,h,w,k,r,s,stride_h,stride_w,pad_h,pad_w,dilation_h,dilation_w,groups,dtype,layout,"
              "benchmark,algo,workspace_bytes")
    path = os.path.join(args.out, f"cudnn_workspace_sm{cc.replace('.', '')}_{cudnn}.csv")
    unmapped = os.path.join(args.out, "cudnn_workspace_unmapped.json")
    lines, odd = [header], []
    tmp = os.path.join(args.out, "tmp")
    os.makedirs(tmp, exist_ok=True)
    for name, batch, crop, amp in WORKSPACE_ROWS:
        if time.time() > deadline:
            report.row("cudnn_workspace", config=name, status="skipped", note="part's time box spent")
            continue
        shapes, why = conv_shapes(args, shared, name, batch, crop, amp, tmp)
        if shapes is None:
            report.row("cudnn_workspace", config=name, status="trace failed", note=why)
            continue
        res = os.path.join(tmp, "ws.json")
        left = max(30, int(deadline - time.time()))
        rc, out, err = run([sys.executable, "-c", WORKSPACE_CODE, json.dumps(shapes), "[true, false]", res], left)
        if rc != 0:
            report.row("cudnn_workspace", config=name, convolutions=len(shapes), status="failed", note=first_line(err))
            continue
        rows = json.load(open(res))
        n = 0
        for r in rows:
            if r["algo"] == "UNMAPPED":
                odd.append(r)
                continue
            lines.append(",".join(str(v) for v in [
                r["direction"], r["n"], r["c"], r["h"], r["w"], r["k"], r["r"], r["s"], r["stride"][0], r["stride"][1],
                r["pad"][0], r["pad"][1], r["dilation"][0], r["dilation"][1], r["groups"], r["dtype"], "nchw",
                r["benchmark"], r["algo"], r["workspace_bytes"]]))
            n += 1
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        json.dump(odd, open(unmapped, "w"), indent=1)
        report.row("cudnn_workspace", config=name, convolutions=len(shapes), rows=n, file=os.path.basename(path),
                   status="ok", note=f"{len(odd)} rows whose kernels name no algorithm family so far")


def small_cards(report, args, shared, deadline):
    """Part 4."""
    for what, name, preset in DRY_SEARCH_ROWS if args.dry_run else SEARCH_ROWS:
        if time.time() > deadline:
            report.row("small_cards", what=what, preset=preset, status="skipped", note="part's time box spent")
            continue
        cfg = config_path(shared, name)
        out_dir = os.path.join(args.out, "search-" + re.sub(r"\W+", "-", what).strip("-").lower())
        device = [] if args.dry_run else ["--device", "cuda:0"]
        left = max(60, int(deadline - time.time()))
        rc, out, err = run([args.segtune, "search", cfg, "--preset", preset, "--out", out_dir, "--json", "--quiet"]
                           + device, left)
        if rc != 0:
            report.row("small_cards", what=what, preset=preset, status=f"search failed ({rc})", note=first_line(err))
            continue
        r = json.loads(out)
        feasible = r.get("feasible") or []
        if not feasible:
            report.row("small_cards", what=what, preset=preset, status="no candidate fits", trials=len(r.get("infeasible", [])))
            continue
        c = feasible[0]["candidate"]
        winner = f"b{c['batch_size']} {c['crop'][0]}x{c['crop'][1]} {c['amp']} accum {c['accumulation']}"
        budget = r["budget"]["usable_bytes"]
        # The winner for 20 steps under the same cap (the CPU stand-in in a dry run).
        dev = ["--as-cuda"] if args.dry_run else ["--device", "cuda:0"]
        steps = ["--steps", "3", "--warmup", "1"] if args.dry_run else ["--steps", "20", "--warmup", "1"]
        rc, out, err = run([args.worker, "trial", cfg, "--json", "--batch-size", str(c["batch_size"]),
                            "--crop", f"{c['crop'][0]}x{c['crop'][1]}", "--amp", c["amp"], "--accum", str(c["accumulation"]),
                            "--vram", str(budget)] + dev + steps, args.trial_timeout * 4)
        try:
            m = json.loads(out)
        except ValueError:
            m = {"status": "crash", "message": first_line(err)}
        peak = m.get("peak_bytes") if args.dry_run else m.get("cuda_peak_reserved_bytes")
        fits = m.get("status") == "ok" and peak is not None and peak <= budget
        report.row("small_cards", what=what, preset=preset, status=m.get("status"), winner=winner,
                   trials=len(feasible) + len(r.get("infeasible", [])), winner_peak_mib=mib(peak),
                   budget_mib=mib(budget), fits="yes" if fits else "no",
                   note=("predicted search; the stand-in's counted tensors" if args.dry_run else "")
                   + (" " + str(m.get("message", ""))[:120] if m.get("status") != "ok" else ""))


def summary(report):
    rows = [r for r in report.data["predicted_vs_measured"] if r["alloc_error_pct"] != ""]
    lines = []
    groups = {}
    for r in rows:
        groups.setdefault((r["family"], r["amp"]), []).append(float(r["alloc_error_pct"]))
    for (fam, amp), e in sorted(groups.items()):
        lines.append(f"{fam:14} {amp:5} n={len(e):2} median {statistics.median(e):+6.1f}%  max |err| {max(map(abs, e)):5.1f}%")
    facts = {r["fact"]: r["value"] for r in report.data["device"]}
    if "context_after_first_kernels" in facts:
        lines.append(f"CUDA context (measured): {mib(facts['context_after_first_kernels'])} MiB")
    for r in report.data["small_cards"]:
        lines.append(f"{r['what']} on {r['preset']}: {r['status']} {r['winner']} fits={r['fits']}")
    for r in report.data["cudnn_workspace"]:
        lines.append(f"workspace table {r['config']}: {r['status']} {r['rows']} rows")
    failed = sum(1 for sec in SECTIONS for r in report.data[sec] if r.get("status") not in ("ok", "", None))
    lines.append(f"parts' rows not ok: {failed}")
    report.data["summary"] = {"text": "\n".join(lines)}
    report.flush()
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(ROOT, "gpu-validate-out")))
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release"))
    ap.add_argument("--shared", default=os.environ.get("SEGTUNE_SHARED", os.path.join(ROOT, "..", "shared")))
    ap.add_argument("--compute-capability", default="8.6", help="dry run: the card to predict for")
    ap.add_argument("--dry-vram", type=int, default=8 << 30, help="dry run: its memory (bytes)")
    ap.add_argument("--trial-timeout", type=int, default=120)
    ap.add_argument("--budget", type=int, default=480, help="seconds for the whole run")
    args = ap.parse_args()
    args.segtune = os.path.join(args.bin, "segtune")
    args.worker = os.path.join(args.bin, "segtune-torch")
    if not os.path.isdir(args.shared) and os.path.isdir(os.path.join(ROOT, "shared")):
        args.shared = os.path.join(ROOT, "shared")
    report = Report(args.out)
    start = time.time()
    # Time boxes: the share of the budget each part may use, in order.
    boxes = {"device": 0.04, "predicted": 0.50, "workspace": 0.20, "cards": 0.26}
    end = start
    def box(name):
        nonlocal end
        end = max(end, time.time()) + boxes[name] * args.budget
        return end
    vram, cc, cudnn = device_facts(report, args)
    box("device")
    if vram is None:
        summary(report)
        return 0
    predicted_vs_measured(report, args, args.shared, vram, cc, box("predicted"))
    cudnn_workspace(report, args, args.shared, cc, cudnn, box("workspace"))
    small_cards(report, args, args.shared, box("cards"))
    summary(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
