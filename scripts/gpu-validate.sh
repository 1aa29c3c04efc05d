#!/usr/bin/env bash
# On a CUDA machine with torch 2.11 installed: run `segtune trial` on the GPU
# for the SegFormer calibration rows (ADE20K 512x512, batch 2, fp32) and print
# segtune's prediction (made from a CPU trace, no GPU) next to the measured
# peak allocated and reserved memory. About 3 minutes on one modern GPU.
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
printf '%-44s %11s %11s %11s %11s %11s\n' config pred_alloc meas_alloc pred_resv meas_resv published
for b in b0 b1 b2 b3 b4 b5; do
  config=$(find "$shared/mmseg-configs/configs/segformer" -name "segformer_mit-${b}_8xb2-160k_ade20k-512x512.py")
  measured=$(target/release/segtune-torch trial "$config" --batch-size 2 --crop 512x512 --device cuda:0 --warmup 1 --steps 2 --json)
  predicted=$(target/release/segtune estimate "$config" --vram "$total" --compute-capability "$cc" --json)
  published=$(grep ",segformer_mit-${b}_8xb2-160k_ade20k-512x512$" "$shared/calibration/mmseg_zoo_memory.csv" | cut -d, -f10)
  python3 - "$(basename "$config" .py)" "$measured" "$predicted" "$published" <<'PY'
import json, sys
name, m, p, pub = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
g = lambda b: f"{b / 1024**3:.3f}G" if b is not None else "-"
print(f"{name:<44} {g(p['predicted_peak_allocated_bytes']):>11} {g(m.get('cuda_peak_allocated_bytes')):>11} "
      f"{g(p['predicted_peak_reserved_bytes']):>11} {g(m.get('cuda_peak_reserved_bytes')):>11} {pub:>10}G  {m['status']}")
PY
done
