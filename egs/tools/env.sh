# Sourced by every recipe and by tests/run.sh: makes `python` one that has speakerlab and its
# requirements, installing only what is missing. It never touches a Python you did not choose:
#   1. an active virtualenv / conda env ($VIRTUAL_ENV / $CONDA_PREFIX) is used as it is, with the
#      missing requirements installed into it (your CUDA build of torch is kept);
#   2. else <repo>/.venv when it exists;
#   3. else a `python3` on PATH that is itself a virtualenv's and has torch (a container's own
#      environment, e.g. a GPU image's /opt/.../.venv) is used like an active one;
#   4. otherwise <repo>/.venv is created. torch==2.13.0 is pinned there because a bare `torch`
#      requirement would pull the newest build with several GB of CUDA packages.
# Recipes need requirements.txt; tests/run.sh sets SPEAKERLAB_REQUIREMENTS=requirements-test.txt
# (pytest, scipy, onnx, ruff on top). pip runs only for requirements that are missing or too old
# (egs/tools/missing_requirements.py), so a machine that has everything never calls it. Without
# network, SPEAKERLAB_WHEELS=DIR installs them from wheels in DIR (pip --no-index --find-links DIR;
# bench/fetch_gpu_wheels.sh fills one) and speakerlab itself is put on PYTHONPATH instead of being
# installed (an editable install would need setuptools from the network).

SPEAKERLAB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export SPEAKERLAB_ROOT

_sl_log() { echo "[$(date '+%H:%M:%S')] env: $*" >&2; }

if [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]; then
  _sl_python="$(command -v python)"
elif [ ! -x "$SPEAKERLAB_ROOT/.venv/bin/python" ] && command -v python3 >/dev/null \
  && python3 -c "import sys, torch; sys.exit(sys.prefix == sys.base_prefix)" 2>/dev/null; then
  _sl_python="$(command -v python3)"
  _sl_log "using $_sl_python (a virtualenv with torch on PATH)"
  [ -x "$(dirname "$_sl_python")/python" ] || { _sl_log "error: no python next to $_sl_python"; return 2 2>/dev/null || exit 2; }
  export PATH="$(dirname "$_sl_python"):$PATH"
else
  if [ ! -x "$SPEAKERLAB_ROOT/.venv/bin/python" ]; then
    _sl_log "creating $SPEAKERLAB_ROOT/.venv"
    python3 -m venv "$SPEAKERLAB_ROOT/.venv"
  fi
  _sl_python="$SPEAKERLAB_ROOT/.venv/bin/python"
  export PATH="$SPEAKERLAB_ROOT/.venv/bin:$PATH"
fi

# pip install ARGS..., from $SPEAKERLAB_WHEELS alone when it is set.
# --no-compile: Python compiles each module when first imported instead of all of torch now
# (measured: torch 15 s -> 5 s, requirements 10 s -> 6 s on a 2-core machine).
_sl_pip() {
  if [ -n "${SPEAKERLAB_WHEELS:-}" ]; then
    "$_sl_python" -m pip install -q --no-compile --no-index --find-links "$SPEAKERLAB_WHEELS" "$@"
  else
    "$_sl_python" -m pip install -q --no-compile "$@"
  fi
}

if ! "$_sl_python" -c "import torch" 2>/dev/null; then
  if [ -n "${SPEAKERLAB_WHEELS:-}" ]; then _sl_want_torch=torch; else _sl_want_torch="torch==2.13.0"; fi
  _sl_log "installing $_sl_want_torch"
  _sl_pip "$_sl_want_torch"
  unset _sl_want_torch
fi
_sl_reqs="${SPEAKERLAB_REQUIREMENTS:-requirements.txt}"
_sl_missing="$("$_sl_python" "$SPEAKERLAB_ROOT/egs/tools/missing_requirements.py" "$SPEAKERLAB_ROOT/$_sl_reqs")"
if [ -n "$_sl_missing" ]; then
  _sl_log "installing from $_sl_reqs: $(echo $_sl_missing)${SPEAKERLAB_WHEELS:+ (wheels of $SPEAKERLAB_WHEELS)}"
  _sl_pip $_sl_missing
fi

# speakerlab itself: an editable install of this checkout (`pip install -e .` again when pyproject.toml
# gains a console script), or offline this checkout on PYTHONPATH.
_sl_where="$(cd / && "$_sl_python" -c 'import os, speakerlab; print(os.path.dirname(os.path.dirname(speakerlab.__file__)))' 2>/dev/null || true)"
if [ "$_sl_where" != "$SPEAKERLAB_ROOT" ]; then
  if [ -n "${SPEAKERLAB_WHEELS:-}" ]; then
    export PYTHONPATH="$SPEAKERLAB_ROOT${PYTHONPATH:+:$PYTHONPATH}"
  else
    _sl_log "installing speakerlab (editable) from $SPEAKERLAB_ROOT"
    "$_sl_python" -m pip install -q --no-compile --no-deps -e "$SPEAKERLAB_ROOT"
  fi
fi
unset _sl_python _sl_reqs _sl_missing _sl_where
unset -f _sl_pip
