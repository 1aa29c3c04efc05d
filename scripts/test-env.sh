# Sourced by scripts/test and the dev scripts (benchmarks, sweeps, probes):
# scripts/env.sh (the torch venv, the build's variables), then
# scripts/setup-tests (the test-only parts), then exports where they are:
#   SEGTUNE_MMENGINE_PYTHON: the python with mmengine-lite for the tests.
#   SEGTUNE_TRANSFORMERS_PYTHON: the python with transformers (over the
#   torch venv's torch) for the tests.
#   SEGTUNE_MMSEG_PYTHON: the python with MMSegmentation over the torch venv
#   (the Python worker's tests run MMSeg's own training step in it).
#   SEGTUNE_TORCH_PYTHON: the torch venv's python, which has no MMSeg.
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
"$_segtune_root/scripts/setup-tests"
_segtune_cache="${SEGTUNE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/segtune}"
_segtune_torch="${SEGTUNE_TORCH_VENV:-$_segtune_cache/torch-2.11.0}"
export SEGTUNE_MMENGINE_PYTHON="$_segtune_cache/mmengine-0.10.7/bin/python"
export SEGTUNE_MMSEG_PYTHON="$_segtune_cache/mmseg-1.2.2/bin/python"
export SEGTUNE_TRANSFORMERS_PYTHON="$_segtune_cache/transformers-5.24.0/bin/python"
export SEGTUNE_TORCH_PYTHON="$_segtune_torch/bin/python"
unset _segtune_cache _segtune_torch
