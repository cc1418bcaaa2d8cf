#!/usr/bin/env bash
# The test command of the README: sets up the environment (egs/tools/env.sh with requirements-test.txt: pip
# only for what is missing; offline SPEAKERLAB_WHEELS=DIR installs that from wheels), checks lint and format
# with ruff (settings in pyproject.toml), then runs pytest, lists the skipped tests with their reasons and the
# 15 slowest tests, and prints the wall time of the whole run. Extra arguments go to pytest, e.g. `bash
# tests/run.sh -k fbank`; the inner loop while you work is the fast lane, `bash tests/run.sh -m "not slow"` (one
# model per family, the learning tests); CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
SPEAKERLAB_REQUIREMENTS=requirements-test.txt source egs/tools/env.sh
echo "ruff check and ruff format --check" >&2
python -m ruff check --quiet .
python -m ruff format --check --quiet .
status=0
# Two workers (pytest-xdist), each test file whole on one of them (--dist loadfile: a file's module fixtures are
# built once and its tests never race each other), the longest files first (--no-loadscope-reorder keeps the order
# of tests/schedule.py); tests/conftest.py gives each worker its share of the cores and builds the shared session
# fixtures once for both. `-n 0` after the command runs everything in one process.
# The checkout's own bytecode is cached (its __pycache__ folders are ignored by git) even where the environment sets
# PYTHONDONTWRITEBYTECODE: else each worker rewrites the asserts of every test file again at collection (15 s -> 6 s
# per worker on the 2-core Intel VM once cached) and each speakerlab-* subprocess compiles the package again.
PYTHONDONTWRITEBYTECODE= python -m pytest -q -rs -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests "$@" ||
  status=$?
echo "tests/run.sh: $((SECONDS / 60)) min $((SECONDS % 60)) s wall (environment, lint and tests), pytest exit $status" >&2
exit "$status"
