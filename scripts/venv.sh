# Sourced by scripts/setup and scripts/setup-tests: make_venv, a venv made
# once (its packages named in .segtune-ready), with what it installs said on
# stderr. pip's download cache is not used (nothing outside the cache dir).

# make_venv DIR CHECK PACKAGE...: a venv in DIR where python -c CHECK passes.
make_venv() {
  local dir=$1 check=$2
  shift 2
  if [ "$(cat "$dir/.segtune-ready" 2>/dev/null)" = "$*" ]; then
    return 0
  fi
  echo "segtune setup: installing $* into $dir (once)" >&2
  mkdir -p "$(dirname "$dir")"
  [ -x "$dir/bin/pip" ] || "$PYTHON" -m venv "$dir"
  "$dir/bin/pip" install --quiet --no-cache-dir "$@" >&2
  "$dir/bin/python" -c "$check"
  echo "$*" > "$dir/.segtune-ready"
}

# make_venv_over TORCH_PYTHON DIR CHECK PACKAGE...: a venv in DIR made by
# TORCH_PYTHON with that interpreter's torch on its path (a .pth file: no
# second torch) and PACKAGE... installed in it.
make_venv_over() {
  local torch_python=$1 dir=$2 check=$3
  shift 3
  if [ "$(cat "$dir/.segtune-ready" 2>/dev/null)" = "$*" ]; then
    return 0
  fi
  echo "segtune setup: installing $* into $dir over $torch_python's torch (once)" >&2
  mkdir -p "$(dirname "$dir")"
  [ -x "$dir/bin/pip" ] || "$torch_python" -m venv "$dir"
  local purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
  "$torch_python" -c "$purelib" > "$("$dir/bin/python" -c "$purelib")/segtune-torch.pth"
  "$dir/bin/pip" install --quiet --no-cache-dir "$@" >&2
  "$dir/bin/python" -c "$check"
  echo "$*" > "$dir/.segtune-ready"
}
