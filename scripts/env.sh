# Sourced by scripts/segtune (and, through scripts/test-env.sh, by the test
# suite and the dev scripts): runs scripts/setup (the torch venv only), then
# exports what the build needs:
#   LIBTORCH_USE_PYTORCH=1 + the torch venv's python first on PATH: tch links
#   the libtorch inside torch==2.11.0.
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
unset _segtune_cache _segtune_torch
