#!/usr/bin/env python3
"""Predicted vs published memory for every MMSeg 1.2.2 metafile row.

Run through scripts/calibrate-metafile (which builds segtune and sets
SEGTUNE_BIN and SEGTUNE_SHARED). Each row is predicted for the setup it was
measured on (docs/prediction.md, "The model zoo's metafiles"):

- 0.x rows (trained 2020 to mid 2022 on MMSeg 0.x, mmcv 1.x's runner):
  --torch 1.9 (PyTorch 1.10 came out on 2021-10-21, after most of them; the
  ReLU6 of MobileNetV2's 2020 rows holds what 1.9 holds, see TORCH_0X),
  --mmcv 1.4.4 for the rows logged before mmcv 1.4.5 came out (2022-02-12:
  mmcv's own HSwish until then), --cudnn-benchmark off (MMSeg 0.x's
  docs/model_zoo.md), the row's GPUs and their count;
- 1.x rows (trained from 2022-08 on MMEngine): --torch 1.13 (but see
  STACKS_1X), the config's own env_cfg.cudnn_benchmark, the row's GPUs
  (A100 80 GB where the metafile prints a memory figure in place of the
  GPU's name).

The published figure is MiB/1024 of max_memory_allocated. mmcv 1.x's
logger (0.x rows) never resets the peak, so a 0.x figure is the run's
all-time peak: it is compared with the predicted first-interval figure (the
larger of the first step's peak and the steady state's). MMEngine's logger
(1.x rows) resets it at each line: compared with the likeliest steady-state
figure. Writes one CSV row per metafile row (--out) and prints
the summary: rows predicted, median |error|, share within 5%, rows more than
5% under.
"""

import argparse
import concurrent.futures
import csv
import json
import os
import re
import statistics
import subprocess
import sys

GIB = float(1 << 30)

# name in "Training Resources" -> (--vram, --compute-capability)
GPUS = {
    "V100": ("32G", "7.0"),
    "A100": ("80G", "8.0"),
    "TITAN Xp": ("12G", "6.1"),
    "1080 Ti": ("11G", "6.1"),
}

# Rows whose metafile gives no date but that were trained on MMSeg 1.x.
UNDATED_1X = {"san"}

# The PyTorch of the 0.x rows: none can be told from its metafile, and
# PyTorch 1.10 (2021-10-21) is newer than every row up to then. Two
# behaviours of the releases segtune models differ between 1.9 and 1.10
# (docs/prediction.md, "PyTorch releases"): MobileNetV2's ReLU6 (its 2020
# rows: +14 to +32% with 1.10's copy of each ReLU6's input, -0.2 to +3.2%
# without) and autocast's GELU (fp32 up to 1.9: the 2022 fp16 rows of
# ConvNeXt and BEiT are closer with it); no 0.x row is closer with 1.10.
TORCH_0X = "1.9"
# mmcv 1.4.5 (2022-02-12) replaced mmcv's own HSwish with nn.Hardswish
# (open-mmlab/mmcv#1709); a row logged before that ran the old one.
MMCV_1_4_5_RELEASED = "20220212"

# 1.x rows whose logs show another PyTorch than 1.13, by the dates of their
# logs, with the evidence: (first date, last date, arguments, why).
STACKS_1X = [
    (
        "20230209",
        "20230227",
        ["--torch", "1.9"],
        "the runs of 2023-02-09 to 2023-02-27 (SegNeXt x4, MobileNetV2 FCN, OCRNet HR18s) hold "
        "what PyTorch <= 1.9 holds in two independent mechanisms and 1.13 in neither: SegNeXt's "
        "log_softmax input (16 x 150 x 512 x 512, kept up to 1.10: -12.5 to -6.6% with 1.13, -1.3 "
        "to +0.6% with 1.9) and MobileNetV2's ReLU6 (+29% with 1.13, +0.5% with 1.9); the runs "
        "before (MaskFormer, Mask2Former, 2022-10 to 2022-12) and after (Mapillary 2023-03-01, "
        "DDRNet 2023-04) are within 4% with 1.13 and 5 to 16% over with 1.9",
    ),
]

# Rows measured otherwise than their era's default, with the evidence.
OVERRIDES = {
    # configs/convnext/README.md L59 (MMSeg 1.2.2): "The memory of
    # ConvNeXt-XL ... is collected when `cudnn_benchmark=True`".
    "convnext-xlarge_upernet_8xb2-amp-160k_ade20k-640x640": ["--cudnn-benchmark", "on"],
}


# Rows whose published figure is the zoo's own error, with the evidence
# (docs/prediction.md, "The model zoo's metafiles"). Keyed by (config,
# published GiB): a config may have two rows. "published" replaces the
# figure, "args" predicts what the row's run really was; either way the
# row is counted apart from the rest.
ZOO_ERRORS = {
    ("mask2former_swin-t_8xb2-160k_ade20k-512x512", 3826.0): {
        "published": 3826 / 1024,
        "why": "the metafile copies the README's MiB (3826) as GB; every other row divides by 1024",
    },
    ("mask2former_swin-s_8xb2-160k_ade20k-512x512", 3.74): {
        "published": 5034 / 1024,
        "why": "the README says 5034 (MiB); 3.74 is the Swin-T row's 3826 MiB / 1024",
    },
    ("mask2former_swin-b-in1k-384x384-pre_8xb2-160k_ade20k-640x640", 5.66): {
        "args": ["--batch-size", "1"],
        "why": "README 5795 MiB: below the 512x512 Swin-S row's share per pixel; equals one image per GPU",
    },
    ("mask2former_swin-b-in22k-384x384-pre_8xb2-160k_ade20k-640x640", 5.66): {
        "args": ["--batch-size", "1"],
        "why": "README 5795 MiB, as the in1k row: one image per GPU",
    },
    ("mask2former_swin-l-in22k-384x384-pre_8xb2-160k_ade20k-640x640", 8.86): {
        "args": ["--batch-size", "1"],
        "why": "README 9077 MiB: one image per GPU",
    },
    ("fastfcn_r50-d32_jpu_aspp_4xb2-80k_cityscapes-512x1024", 9.79): {
        "args": ["--batch-size", "4"],
        "why": "its weights are fastfcn_r50-d32_jpu_aspp_4x4_...: 4 images per GPU (the 4x2 row says 5.67)",
    },
    ("fastfcn_r50-d32_jpu_psp_4xb2-80k_cityscapes-512x1024", 9.94): {
        "args": ["--batch-size", "4"],
        "why": "its weights are ..._jpu_psp_4x4_...: 4 images per GPU (the 4x2 row says 5.67)",
    },
    ("fastfcn_r50-d32_jpu_enc_4xb2-80k_cityscapes-512x1024", 15.45): {
        "args": ["--batch-size", "4"],
        "why": "its weights are ..._jpu_enc_4x4_...: 4 images per GPU (the 4x2 row says 8.15)",
    },
    ("fpn_r101_4xb4-160k_ade20k-512x512", 5.9): {
        "args": ["--cfg-options", "model.backbone.depth=101"],
        "why": "the 1.x config assigns `model` twice, dropping depth=101: MMEngine resolves a ResNet-50 (shared resolved/ JSON); the figure is the 0.x R-101 run's",
    },
    ("deeplabv3plus_r101-d16-mg124_4xb2-80k_cityscapes-512x1024", 9.9): {
        "published": 5.8,
        "why": "the same training run (log 20200908_005644) as the 40k row, which says 5.8",
    },
    ("emanet_r50-d8_4xb2-80k_cityscapes-769x769", 8.9): {
        "published": 6.2,
        "why": "swapped with the R-101 512x1024 row: each predicted figure matches the other row's",
    },
    ("emanet_r101-d8_4xb2-80k_cityscapes-512x1024", 6.2): {
        "published": 8.9,
        "why": "swapped with the R-50 769x769 row",
    },
    ("twins_pcpvt-l_uperhead_8xb2-160k_ade20k-512x512", 8.41): {
        "published": 7.82,
        "why": "a second row of the same config (and the pcpvt-b FPN row's figure); the first says 7.82",
    },
    ("knet-s3_swin-l_upernet_8xb2-adamw-80k_ade20k-640x640", 13.54): {
        "published": None,
        "why": "13.54 for 640x640, against 13.5 for the same model at 512x512 (1.56x fewer pixels): no correction known",
    },
    # PSPNet/DeepLabV3 pairs of one backbone, crop, batch and GPUs: the
    # published ratio is 1.000 where the backbone makes the peak (Cityscapes,
    # VOC: predicted 0.999) and 0.955-0.968 where 150 or 60 classes' logits
    # do (ADE20K, Pascal Context: predicted 0.951-0.966, each row within
    # 0.5%). COCO-Stuff (171 classes, ADE20K's crop and batch) publishes
    # 1.000 for all four pairs, with DeepLabV3 predicted within 2.2%.
    ("pspnet_r50-d8_4xb4-20k_coco-stuff10k-512x512", 9.6): {
        "published": None,
        "why": "DeepLabV3's COCO-Stuff figure to the decimal (9.6) in all four pairs; every other dataset's PSPNet/DeepLabV3 ratio is predicted within 0.5% (ADE20K 0.955 published, 0.951 predicted) and COCO-Stuff's would be 0.953",
    },
    ("pspnet_r50-d8_4xb4-80k_coco-stuff164k-512x512", 9.6): {
        "published": None,
        "why": "DeepLabV3's COCO-Stuff figure (9.6) to the decimal, as the 20k row",
    },
    ("pspnet_r101-d8_4xb4-20k_coco-stuff10k-512x512", 13.2): {
        "published": None,
        "why": "DeepLabV3's COCO-Stuff figure (13.2) to the decimal; ADE20K's R-101 pair is 0.968 published, 0.964 predicted, COCO-Stuff's 0.966 predicted",
    },
    ("pspnet_r101-d8_4xb4-80k_coco-stuff164k-512x512", 13.2): {
        "published": None,
        "why": "DeepLabV3's COCO-Stuff figure (13.2) to the decimal, as the 20k row",
    },
    # UNet rows of one model and crop measured twice (CE in 2020-12, CE +
    # Dice in 2021-12): the Dice loss on 2 classes adds under 5 MiB of
    # tensors (4x2x64x64 or 4x2x256x256), yet the published pairs differ by
    # -15% to +8%, both ways; segtune predicts each pair's two rows equal.
    ("unet-s5-d16_fcn_4xb4-40k_drive-64x64", 0.68): {
        "published": None,
        "why": "the same model and crop with the CE + Dice loss (a strictly larger step) publishes 0.582 (predicted -0.7%); 0.68 is 17% above it",
    },
    ("unet-s5-d16_pspnet_4xb4-ce-1.0-dice-3.0-40k_hrf-256x256", 2.798): {
        "published": None,
        "why": "the same model and crop with CE alone publishes 2.588 (predicted -0.1%); the Dice loss adds under 5 MiB, the figure 210 MiB; its FCN and DeepLabV3 siblings differ by +3.9% and +0.1%",
    },
}

# PoolFormer's runs trained in fp32 (log 2022-05): MMSeg 0.x's
# fpn_poolformer_s12_8x4_512x512_40k_ade20k.py, which the others inherit,
# has optimizer_config = dict() and no fp16; the 1.x configs add
# AmpOptimWrapper (their 0.x lines kept as comments).
for _size, _published in [("s12", 4.17), ("s24", 5.47), ("m36", 8.59), ("m48", 10.48)]:
    ZOO_ERRORS[(f"fpn_poolformer_{_size}_8xb4-40k_ade20k-512x512", _published)] = {
        "args": ["--amp", "off"],
        "why": "trained in fp32 (log 2022-05, MMSeg 0.x's fpn_poolformer_*_8x4_512x512_40k_ade20k.py: "
        "optimizer_config = dict(), no fp16); the 1.x config adds AmpOptimWrapper (its 0.x lines kept as comments)",
    }


def rows_path():
    cache = os.environ.get("SEGTUNE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "segtune"
    )
    return os.path.join(cache, "mmsegmentation-1.2.2", "metafile_rows.json")


def log_date(row):
    """YYYYMMDD of the row's training log (or weights), or None."""
    dates = re.findall(r"(20[12]\d{5})_\d{6}", (row.get("training_log") or "") + (row.get("weights") or ""))
    return dates[0] if dates else None


def setup_of(row):
    """(era, gpus, vram, cc) of a metafile row."""
    date = log_date(row)
    if date:
        era = "1.x" if date >= "20220801" else "0.x"
    else:
        era = "1.x" if row["method"] in UNDATED_1X else "0.x"
    m = re.match(r"(\d+)x (.+) GPUS", row.get("training_resources") or "")
    gpus, name = (int(m.group(1)), m.group(2)) if m else (1, "V100")
    vram, cc = GPUS.get(name, GPUS["A100"] if era == "1.x" else GPUS["V100"])
    return era, gpus, vram, cc


def stack_args(row, era):
    """The --torch/--mmcv of the row's run (see TORCH_0X and STACKS_1X)."""
    date = log_date(row)
    if era == "0.x":
        mmcv = ["--mmcv", "1.4.4"] if date and date < MMCV_1_4_5_RELEASED else []
        return ["--torch", TORCH_0X] + mmcv
    for first, last, args, _why in STACKS_1X:
        if date and first <= date <= last:
            return args
    return ["--torch", "1.13"]


def command_of(row, shared, binary):
    era, gpus, vram, cc = setup_of(row)
    config = os.path.join(shared, "mmseg-configs", row["config_path"])
    if not os.path.exists(config):
        # Two metafile rows double their name's first letter
        # (ddeeplabv3plus_..., eemanet_...): the config is the one without.
        head, name = os.path.split(config)
        if len(name) > 1 and name[0] == name[1] and os.path.exists(os.path.join(head, name[1:])):
            config = os.path.join(head, name[1:])
    cmd = [binary, "estimate", config, "--json", "--vram", vram, "--compute-capability", cc]
    if gpus > 1:
        cmd += ["--gpus", str(gpus)]
    override = OVERRIDES.get(row["config"], [])
    cmd += stack_args(row, era)
    if era == "0.x":
        cmd += override or ["--cudnn-benchmark", "off"]
    else:
        cmd += override
    return era, cmd


def predict(row, shared, binary, timeout):
    era, cmd = command_of(row, shared, binary)
    published = float(row["memory_gb"])
    zoo_error = ZOO_ERRORS.get((row["config"], published))
    if zoo_error:
        cmd += zoo_error.get("args", [])
        if zoo_error.get("published"):
            published = zoo_error["published"]
    out = {
        "config": row["config"],
        "method": row["method"],
        "dataset": row.get("dataset", ""),
        "era": era,
        "published_gib": published,
        "metafile_gib": float(row["memory_gb"]),
        "zoo_error": zoo_error["why"] if zoo_error else "",
        "command": " ".join(cmd[1:]).replace(shared, "../shared"),
    }
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        out["status"] = "timeout"
        return out
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [""])[0]
        out["status"] = "not predicted: " + last[:160]
        return out
    e = json.loads(p.stdout)
    out["status"] = "ok"
    for key, name in [
        ("predicted_min_peak_allocated_bytes", "least_gib"),
        ("predicted_peak_allocated_bytes", "likely_gib"),
        ("predicted_peak_allocated_low_bytes", "low_gib"),
        ("predicted_peak_allocated_high_bytes", "high_gib"),
        ("predicted_first_interval_peak_allocated_bytes", "first_gib"),
    ]:
        if key in e:
            out[name] = round(e[key] / GIB, 4)
    # The figure the row's logger reported (see the module doc).
    out["compared"] = "first" if era == "0.x" else "likely"
    out["predicted_gib"] = out["first_gib"] if era == "0.x" else out["likely_gib"]
    out["error_pct"] = round(100.0 * (out["predicted_gib"] - published) / published, 2)
    return out


def summary(results):
    lines = summary_of(results, "every row (the zoo's own errors corrected as ZOO_ERRORS says)")
    clean = [r for r in results if not r.get("zoo_error")]
    lines += summary_of(clean, "rows without a known zoo error")
    return lines


def summary_of(results, what):
    ok = [r for r in results if r["status"] == "ok"]
    errors = [abs(r["error_pct"]) for r in ok]
    lines = [f"{what}: {len(ok)} of {len(results)} rows predicted"]
    if errors:
        within = sum(e <= 5 for e in errors)
        under = [r for r in ok if r["error_pct"] < -5]
        over = [r for r in ok if r["error_pct"] > 5]
        lines.append(
            f"median |error| {statistics.median(errors):.2f}%, {within} within 5% "
            f"({100.0 * within / len(ok):.0f}%), {len(under)} more than 5% under, {len(over)} more than 5% over"
        )
    return lines


def markdown(results):
    """Per method: rows predicted, median, min and max error; then every
    predicted row more than 5% off."""
    ok = [r for r in results if r["status"] == "ok"]
    methods = sorted({r["method"] for r in results})
    out = ["| method | rows | predicted | median error | min | max | within 5% |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for m in methods:
        rows = [r for r in results if r["method"] == m]
        e = [r["error_pct"] for r in ok if r["method"] == m]
        if e:
            out.append(f"| {m} | {len(rows)} | {len(e)} | {statistics.median(e):+.1f}% | {min(e):+.1f}% | "
                       f"{max(e):+.1f}% | {sum(abs(x) <= 5 for x in e)} |")
        else:
            why = rows[0]["status"].replace("not predicted: error: ", "")[:70].replace("|", "/")
            out.append(f"| {m} | {len(rows)} | 0 | - | - | - | - ({why}) |")
    out += ["", "Every row more than 5% off, and every row with a known zoo error:", "",
            "| config | era | metafile GiB | compared with | predicted GiB | error | zoo's own error |",
            "|---|---|---:|---:|---:|---:|---|"]
    for r in sorted(ok, key=lambda r: r["error_pct"]):
        if abs(r["error_pct"]) > 5 or r.get("zoo_error"):
            out.append(f"| {r['config']} | {r['era']} | {r['metafile_gib']} | {float(r['published_gib']):.3f} | "
                       f"{r['predicted_gib']:.3f} | {r['error_pct']:+.1f}% | {r.get('zoo_error') or ''} |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("filter", nargs="?", default="", help="regex on the config name")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", help="CSV to write")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--markdown", help="write the per-method table (docs/prediction.md) here")
    ap.add_argument("--from-csv", help="summarise an earlier --out CSV instead of predicting")
    args = ap.parse_args()
    if args.from_csv:
        results = []
        for r in csv.DictReader(open(args.from_csv)):
            for k in ("metafile_gib", "published_gib", "predicted_gib", "least_gib", "likely_gib", "low_gib", "high_gib",
                      "first_gib", "error_pct"):
                r[k] = float(r[k]) if r.get(k) not in (None, "") else None
            results.append(r)
        if args.markdown:
            open(args.markdown, "w").write(markdown(results))
        for line in summary(results):
            print(line)
        return 0
    binary = os.environ["SEGTUNE_BIN"]
    shared = os.path.abspath(os.environ["SEGTUNE_SHARED"])
    rows = [r for r in json.load(open(rows_path())) if re.search(args.filter, r["config"])]
    results = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(predict, r, shared, binary, args.timeout) for r in rows]
        for f in futures:
            r = f.result()
            results.append(r)
            shown = (
                f"{r['predicted_gib']:.3f} GiB ({r['error_pct']:+.1f}%, {r['compared']}) least {r['least_gib']:.3f} steady {r['likely_gib']:.3f} range {r['low_gib']:.2f}-{r['high_gib']:.2f}"
                if r["status"] == "ok"
                else r["status"]
            )
            print(f"{r['config']} [{r['era']}]: published {r['published_gib']} GiB, predicted {shown}", flush=True)
    if args.out:
        keys = ["config", "method", "dataset", "era", "metafile_gib", "published_gib", "zoo_error",
                "compared", "predicted_gib",
                "least_gib", "likely_gib", "low_gib", "high_gib", "first_gib", "error_pct", "status",
                "command"]
        tmp = args.out + ".tmp"
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, keys)
            w.writeheader()
            for r in results:
                w.writerow({k: r.get(k, "") for k in keys})
        os.replace(tmp, args.out)
    if args.markdown:
        open(args.markdown, "w").write(markdown(results))
    for line in summary(results):
        print(line)


if __name__ == "__main__":
    sys.exit(main())
