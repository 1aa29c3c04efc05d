# Sourced by scripts/setup, scripts/setup-tests and scripts/build-wheel: a
# venv made once (its packages named in .segtune-ready), with what it
# installs said on stderr. pip's download cache is not used (nothing outside
# the cache dir).

# make_venv DIR CHECK PACKAGE...: a venv in DIR, made by $PYTHON, where
# python -c CHECK passes.
make_venv() {
  _segtune_venv "$PYTHON" "" "$@"
}

# make_venv_over TORCH_PYTHON DIR CHECK PACKAGE...: a venv in DIR made by
# TORCH_PYTHON with that interpreter's torch on its path (a .pth file: no
# second torch) and PACKAGE... installed in it.
make_venv_over() {
  local torch_python=$1
  shift
  _segtune_venv "$torch_python" "$torch_python" "$@"
}

# _segtune_venv MAKER TORCH_PYTHON DIR CHECK PACKAGE...: TORCH_PYTHON empty
# for a venv of its own.
_segtune_venv() {
  local maker=$1 torch_python=$2 dir=$3 check=$4
  shift 4
  if [ "$(cat "$dir/.segtune-ready" 2>/dev/null)" = "$*" ]; then
    return 0
  fi
  local over=""
  [ -z "$torch_python" ] || over=" over $torch_python's torch"
  echo "segtune setup: installing $* into $dir$over (once)" >&2
  mkdir -p "$(dirname "$dir")"
  [ -x "$dir/bin/pip" ] || "$maker" -m venv "$dir"
  if [ -n "$torch_python" ]; then
    local purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
    "$torch_python" -c "$purelib" > "$("$dir/bin/python" -c "$purelib")/segtune-torch.pth"
  fi
  "$dir/bin/pip" install --quiet --no-cache-dir "$@" >&2
  "$dir/bin/python" -c "$check"
  echo "$*" > "$dir/.segtune-ready"
}
