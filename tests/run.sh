#!/usr/bin/env bash
# The test command of the README: sets up the environment (egs/tools/env.sh), then runs pytest.
# Extra arguments go to pytest, e.g. `bash tests/run.sh -k fbank`.
set -euo pipefail
cd "$(dirname "$0")/.."
source egs/tools/env.sh
exec python -m pytest -q -p no:cacheprovider tests "$@"
