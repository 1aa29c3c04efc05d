# Sourced by scripts/segtune and scripts/test: runs scripts/setup, then
# exports what the build and the tests need.
#   LIBTORCH_USE_PYTORCH=1 + the torch venv's python first on PATH: tch links
#   the libtorch inside torch==2.11.0.
#   SEGTUNE_MMENGINE_PYTHON: the python with mmengine-lite for the tests.
#   SEGTUNE_TRANSFORMERS_PYTHON: the python with transformers for the tests
#   (the torch venv; unset when SEGTUNE_TORCH_VENV names another install).
#   SEGTUNE_MMSEG_PYTHON: the python with MMSegmentation over the torch venv
#   (the Python worker's tests run MMSeg's own training step in it).
#   SEGTUNE_TORCH_PYTHON: the torch venv's python, which has no MMSeg.
#   SEGTUNE_PYTHON: the user's python3, whose torch release segtune predicts
#   for by default.
_segtune_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$_segtune_root/scripts/setup"
_segtune_cache="${SEGTUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/segtune}"
_segtune_torch="${SEGTUNE_TORCH_VENV:-$_segtune_cache/torch-2.11.0}"
export LIBTORCH_USE_PYTORCH=1
# The user's own python3, asked for its torch release before the venv's
# python comes first on PATH (segtune predicts for that release).
if [ -z "${SEGTUNE_PYTHON:-}" ]; then
  SEGTUNE_PYTHON="$(command -v python3 || true)"
  export SEGTUNE_PYTHON
fi
export PATH="$_segtune_torch/bin:$PATH"
export SEGTUNE_MMENGINE_PYTHON="$_segtune_cache/mmengine-0.10.7/bin/python"
export SEGTUNE_MMSEG_PYTHON="$_segtune_cache/mmseg-1.2.2/bin/python"
export SEGTUNE_TORCH_PYTHON="$_segtune_torch/bin/python"
if [ -z "${SEGTUNE_TORCH_VENV:-}" ]; then
  export SEGTUNE_TRANSFORMERS_PYTHON="$_segtune_torch/bin/python"
fi
unset _segtune_cache _segtune_torch
