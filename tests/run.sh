#!/usr/bin/env bash
# The test command of the README: sets up the environment (egs/tools/env.sh with requirements-test.txt: pip
# only for what is missing; offline SPEAKERLAB_WHEELS=DIR installs that from wheels), checks lint and format
# with ruff (settings in pyproject.toml), then runs pytest and lists the 15 slowest tests. Extra arguments go
# to pytest, e.g. `bash tests/run.sh -k fbank`; the inner loop while you work is the fast lane,
# `bash tests/run.sh -m "not slow"` (a few minutes: one model per family, the learning tests); CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
SPEAKERLAB_REQUIREMENTS=requirements-test.txt source egs/tools/env.sh
echo "ruff check and ruff format --check" >&2
python -m ruff check --quiet .
python -m ruff format --check --quiet .
exec python -m pytest -q -p no:cacheprovider --durations=15 tests "$@"
