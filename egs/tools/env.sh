# Sourced by every recipe and by tests/run.sh: makes `python` one that has speakerlab and its
# requirements, installing them on first use. It never touches a Python you did not choose:
#   1. an active virtualenv / conda env ($VIRTUAL_ENV / $CONDA_PREFIX) is used as it is, with the
#      missing requirements installed into it (your CUDA build of torch is kept);
#   2. otherwise <repo>/.venv is created. torch==2.13.0 is pinned there because a bare `torch`
#      requirement would pull the newest build with several GB of CUDA packages.
# Recipes install requirements.txt; tests/run.sh sets SPEAKERLAB_REQUIREMENTS=requirements-test.txt
# (pytest, scipy, onnx, ruff on top). Re-installs only when that file, requirements.txt or
# pyproject.toml change (a stamp file per requirements file records them).

SPEAKERLAB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export SPEAKERLAB_ROOT

_sl_log() { echo "[$(date '+%H:%M:%S')] env: $*" >&2; }

if [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ]; then
  _sl_python="$(command -v python)"
  _sl_stamp_dir="${VIRTUAL_ENV:-${CONDA_PREFIX}}"
else
  if [ ! -x "$SPEAKERLAB_ROOT/.venv/bin/python" ]; then
    _sl_log "creating $SPEAKERLAB_ROOT/.venv"
    python3 -m venv "$SPEAKERLAB_ROOT/.venv"
  fi
  _sl_python="$SPEAKERLAB_ROOT/.venv/bin/python"
  _sl_stamp_dir="$SPEAKERLAB_ROOT/.venv"
  export PATH="$SPEAKERLAB_ROOT/.venv/bin:$PATH"
fi

# The stamp of a requirements file: its checksum with requirements.txt and pyproject.toml.
_sl_sum() { cat "$SPEAKERLAB_ROOT/$1" "$SPEAKERLAB_ROOT/requirements.txt" "$SPEAKERLAB_ROOT/pyproject.toml" | cksum | cut -d' ' -f1; }
_sl_reqs="${SPEAKERLAB_REQUIREMENTS:-requirements.txt}"
_sl_want="$(_sl_sum "$_sl_reqs")"
_sl_stamp="$_sl_stamp_dir/.speakerlab-installed-${_sl_reqs%.txt}"
if [ "$(cat "$_sl_stamp" 2>/dev/null)" != "$_sl_want" ] || ! "$_sl_python" -c "import speakerlab, torch" 2>/dev/null; then
  if ! "$_sl_python" -c "import torch" 2>/dev/null; then
    _sl_log "installing torch==2.13.0"
    "$_sl_python" -m pip install -q --no-compile "torch==2.13.0"
  fi
  _sl_log "installing $_sl_reqs and speakerlab (editable)"
  # --no-compile: Python compiles each module when first imported instead of all of torch now
  # (measured: torch 15 s -> 5 s, requirements 10 s -> 6 s on a 2-core machine).
  "$_sl_python" -m pip install -q --no-compile -r "$SPEAKERLAB_ROOT/$_sl_reqs" -e "$SPEAKERLAB_ROOT"
  echo "$_sl_want" > "$_sl_stamp"
  # Every requirements file includes requirements.txt: the recipes' set is installed too.
  _sl_sum requirements.txt > "$_sl_stamp_dir/.speakerlab-installed-requirements"
fi
unset _sl_python _sl_stamp_dir _sl_want _sl_stamp _sl_reqs
unset -f _sl_sum
