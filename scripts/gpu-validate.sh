#!/usr/bin/env bash
# The one device check (docs/gpu-validation.md): device facts, predicted vs
# measured for ~24 configs, the cuDNN workspace table, small cards emulated
# under a --vram cap; writes $OUT/gpu-validate.md and .json as it goes (OUT
# defaults to ./gpu-validate-out) and ends with a one-screen summary.
#   scripts/gpu-validate.sh            on the lent GPU machine (binaries
#                                      carried in target/release, the
#                                      configs in ../shared or ./shared)
#   scripts/gpu-validate.sh --dry-run  here, on the CPU: the same flow with
#                                      the CUDA stand-in and two small configs
# Other options: scripts/gpu_validate.py --help. Never calls cargo when the
# binaries exist (the lent machine has no Rust).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ ! -x target/release/segtune ] || [ ! -x target/release/segtune-torch ]; then
  # shellcheck source=scripts/env.sh
  source scripts/env.sh
  cargo build --release --quiet
fi
if [ -n "${SEGTUNE_TORCH_VENV:-}" ]; then export PATH="$SEGTUNE_TORCH_VENV/bin:$PATH"; fi
# On the lent machine: libtorch and the CUDA libraries of its torch install.
if python3 -c "import torch" 2>/dev/null; then
  T=$(python3 -c "import torch, os; print(os.path.dirname(torch.__file__))")
  export LD_LIBRARY_PATH="$T/lib:$T/../nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
fi
exec python3 "$root/scripts/gpu_validate.py" "$@"
