# Sourced by every recipe and by tests/run.sh: makes `python` one that has speakerlab and its
# requirements, installing only what is missing. It never touches a Python you did not choose:
#   1. an active virtualenv / conda env ($VIRTUAL_ENV / $CONDA_PREFIX) is used as it is, with the
#      missing requirements installed into it (your CUDA build of torch is kept);
#   2. else <repo>/.venv when it exists;
#   3. else a `python3` on PATH that is itself a virtualenv's and has torch (a container's own
#      environment, e.g. a GPU image's /opt/.../.venv) is used like an active one;
#   4. otherwise <repo>/.venv is created. torch==2.13.0 is pinned there (a bare `torch` would take the
#      newest release). From PyPI on Linux that is the CUDA build, with several GB of CUDA packages; for
#      the CPU build, create the venv and install torch into it first, from PyTorch's CPU index
#      (`python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 --index-url
#      https://download.pytorch.org/whl/cpu`) or from a local wheel: a torch that is there is kept.
# Recipes need requirements.txt; tests/run.sh sets SPEAKERLAB_REQUIREMENTS=requirements-test.txt
# (pytest, scipy, onnx, ruff on top). pip runs only for requirements that are missing or too old
# (egs/tools/missing_requirements.py), so a machine that has everything never calls it.
#
# speakerlab itself is installed (editable, `pip install -e <repo>`) only when this Python has none or
# lacks one of the console scripts of pyproject.toml that every recipe stage calls (speakerlab-*).
# When this Python's speakerlab is another checkout (or an installed wheel), that install is left
# alone, so two checkouts sharing one environment never re-point each other's install mid-run: one log
# line names both and how to switch, and THIS checkout's code runs, put first on PYTHONPATH (the
# console scripts only import speakerlab by name). If this checkout has a console script that the
# environment lacks, sourcing fails with one line saying how to switch (exit 2).
#
# Without network, SPEAKERLAB_WHEELS=DIR installs everything from wheels in DIR (pip --no-index
# --find-links DIR): the missing requirements, and speakerlab itself the same way as online, built by
# the setuptools wheel of DIR (and `wheel` for a setuptools older than 70.1); bench/fetch_gpu_wheels.sh
# fills one.

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
# --no-compile: Python compiles each module when first imported and caches it, instead of all of torch now
# (measured: torch 15 s -> 5 s, requirements 10 s -> 6 s on a 2-core machine); but with PYTHONDONTWRITEBYTECODE set
# nothing is cached, and pip's compile is the only one (below).
_sl_pip() {
  local compile=--no-compile
  [ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || compile=--compile
  if [ -n "${SPEAKERLAB_WHEELS:-}" ]; then
    "$_sl_python" -m pip install -q "$compile" --no-index --find-links "$SPEAKERLAB_WHEELS" "$@"
  else
    "$_sl_python" -m pip install -q "$compile" "$@"
  fi
}

# find_spec, not an import: importing torch takes seconds, and pip would find a broken one "satisfied" anyway.
if ! "$_sl_python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null; then
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

# speakerlab itself (see the header). The console scripts are read off pyproject.toml's [project.scripts].
_sl_where="$(cd / && "$_sl_python" -c 'import os, speakerlab; print(os.path.dirname(os.path.dirname(speakerlab.__file__)))' 2>/dev/null || true)"
_sl_lacking=""
for _sl_script in $(sed -n '/^\[project\.scripts\]/,/^\[/s/^\(speakerlab-[A-Za-z0-9_-]*\) *=.*/\1/p' "$SPEAKERLAB_ROOT/pyproject.toml"); do
  [ -x "$(dirname "$_sl_python")/$_sl_script" ] || _sl_lacking="$_sl_lacking $_sl_script"
done
if [ -n "$_sl_where" ] && [ "$_sl_where" != "$SPEAKERLAB_ROOT" ]; then
  # PyPI's `speakerlab` is 3D-Speaker's toolkit (ours is the distribution speakerlab-recipes): both import as
  # speakerlab, so one environment cannot hold both.
  # (An install of this project from before the rename is also called speakerlab: the summary tells them apart.)
  if "$_sl_python" -c "import sys; from importlib.metadata import metadata as m; sys.exit('3D-Speaker' not in (m('speakerlab')['Summary'] or ''))" 2>/dev/null; then
    _sl_log "error: this environment's speakerlab ($_sl_where) is 3D-Speaker's package (PyPI's speakerlab), another project that also imports as speakerlab; use a separate virtual environment for this checkout"
    return 2 2>/dev/null || exit 2
  fi
  if [ -n "$_sl_lacking" ]; then
    _sl_log "error: this checkout's console script(s)$_sl_lacking are not in $(dirname "$_sl_python"), whose speakerlab is $_sl_where; switch it to this checkout with: $_sl_python -m pip install --no-deps -e $SPEAKERLAB_ROOT (or use another environment)"
    return 2 2>/dev/null || exit 2
  fi
  _sl_log "this environment's speakerlab is $_sl_where, not this checkout $SPEAKERLAB_ROOT: left as it is, this checkout's code runs through PYTHONPATH (to switch the environment to this checkout: $_sl_python -m pip install --no-deps -e $SPEAKERLAB_ROOT)"
  export PYTHONPATH="$SPEAKERLAB_ROOT${PYTHONPATH:+:$PYTHONPATH}"
elif [ -z "$_sl_where" ] || [ -n "$_sl_lacking" ]; then
  if [ -n "${SPEAKERLAB_WHEELS:-}" ] && ! compgen -G "$SPEAKERLAB_WHEELS/setuptools-*.whl" >/dev/null; then
    _sl_log "error: $SPEAKERLAB_WHEELS has no setuptools wheel to build speakerlab with; bash bench/fetch_gpu_wheels.sh $SPEAKERLAB_WHEELS adds it"
    return 2 2>/dev/null || exit 2
  fi
  _sl_log "installing speakerlab (editable) from $SPEAKERLAB_ROOT${SPEAKERLAB_WHEELS:+ (build backend from $SPEAKERLAB_WHEELS)}"
  _sl_pip --no-deps -e "$SPEAKERLAB_ROOT"
fi

# Bytecode, once, for an environment installed without it: with PYTHONDONTWRITEBYTECODE set (as container images often
# do) Python never caches what it compiles, so every process would compile torch from source again (measured on the
# 2-core VM: import torch 5.2 s -> 2.3 s; torch with torch._dynamo, which the first weight initialisation loads, 12.2
# s -> 3.9 s; the whole site-packages compiled in about a minute). Done only when this Python writes no bytecode
# itself, torch has none and its site can be written (a read-only one would be compiled in vain each time). Some
# package files are for newer Pythons and never imported here (torch's py312_intrinsics): compileall's exit status is
# ignored.
_sl_site="$("$_sl_python" -c 'import importlib.util as u, os, sys
s = u.find_spec("torch")
d = os.path.dirname(os.path.dirname(s.origin))
print(d if sys.dont_write_bytecode and not os.path.exists(u.cache_from_source(s.origin)) and os.access(d, os.W_OK) else "")' 2>/dev/null || true)"
if [ -n "$_sl_site" ]; then
  _sl_log "compiling the bytecode of $_sl_site once (PYTHONDONTWRITEBYTECODE is set: else every process compiles torch again)"
  "$_sl_python" -m compileall -qq -j 0 "$_sl_site" >/dev/null 2>&1 || true
fi
unset _sl_python _sl_reqs _sl_missing _sl_where _sl_lacking _sl_script _sl_site
unset -f _sl_pip
