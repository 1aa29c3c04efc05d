#!/usr/bin/env bash
# On a CUDA machine with torch 2.11 installed: run `segtune trial` on the GPU
# for the SegFormer calibration rows (ADE20K 512x512, batch 2, fp32; then B0
# and B2 with fp16 and B0 with bf16 AMP, which check the CUDA autocast rules
# the traces follow) and print segtune's prediction (made from a CPU trace,
# no GPU) next to the measured peak allocated and reserved memory. The
# published column is MMSeg's figure, measured on the 2021 stack with 8-GPU
# DDP: `scripts/calibrate-estimate` predicts that setup. About 4 minutes on
# one modern GPU.
#
# Uses the torch of $SEGTUNE_TORCH_VENV (or the `python3` on PATH) through
# LIBTORCH_USE_PYTORCH=1; builds segtune if target/release lacks it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ -n "${SEGTUNE_TORCH_VENV:-}" ]; then export PATH="$SEGTUNE_TORCH_VENV/bin:$PATH"; fi
export LIBTORCH_USE_PYTORCH=1
python3 -c "import torch; assert torch.__version__.startswith('2.11'), torch.__version__; assert torch.cuda.is_available()"
[ -x target/release/segtune-torch ] || cargo build --release --quiet
shared="${SEGTUNE_SHARED:-$root/../shared}"
cc=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
total=$(python3 -c "import torch; print(torch.cuda.mem_get_info()[1])")
printf '%-44s %5s %11s %11s %11s %11s %10s\n' config amp pred_alloc meas_alloc pred_resv meas_resv published
for row in "b0 off" "b1 off" "b2 off" "b3 off" "b4 off" "b5 off" "b0 fp16" "b2 fp16" "b0 bf16"; do
  read -r b amp <<<"$row"
  config=$(find "$shared/mmseg-configs/configs/segformer" -name "segformer_mit-${b}_8xb2-160k_ade20k-512x512.py")
  measured=$(target/release/segtune-torch trial "$config" --batch-size 2 --crop 512x512 --amp "$amp" --device cuda:0 --warmup 1 --steps 2 --json || true)
  predicted=$(target/release/segtune estimate "$config" --amp "$amp" --vram "$total" --compute-capability "$cc" --json)
  published=-
  if [ "$amp" = off ]; then
    published=$(grep ",segformer_mit-${b}_8xb2-160k_ade20k-512x512$" "$shared/calibration/mmseg_zoo_memory.csv" | cut -d, -f10)G
  fi
  python3 - "$(basename "$config" .py)" "$amp" "$measured" "$predicted" "$published" <<'PY'
import json, sys
name, amp, m, p, pub = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
g = lambda b: f"{b / 1024**3:.3f}G" if b is not None else "-"
print(f"{name:<44} {amp:>5} {g(p['predicted_peak_allocated_bytes']):>11} {g(m.get('cuda_peak_allocated_bytes')):>11} "
      f"{g(p['predicted_peak_reserved_bytes']):>11} {g(m.get('cuda_peak_reserved_bytes')):>11} {pub:>10}  {m['status']}")
PY
done
