#!/usr/bin/env bash
# Fetch, here (with network), the wheels the GPU machines lack, for bench/gpu_session.sh --wheels DIR
# (or SPEAKERLAB_WHEELS=DIR bash tests/run.sh) there: their image has Python 3.12, torch 2.11.0+cu130,
# numpy, PyYAML, tqdm, tensorboard, matplotlib, scipy, pytest, onnx, onnxscript, onnxruntime, but not
# soundfile (nor its cffi, pycparser), kaldiio, webdataset (nor braceexpand), ruff, silero-vad or pyannote.metrics
# (nor pyannote.core, pyannote.database), and perhaps a peft older than requirements-test.txt's. Also setuptools, the
# build backend with which egs/tools/env.sh installs speakerlab itself there: pip --no-index builds it in an
# isolated environment from DIR alone, whatever the image has (setuptools >= 70.1 needs no `wheel` beside it).
#   bash bench/fetch_gpu_wheels.sh [DIR]        # default .whl/ (git-ignored); prints the total size
# Versions are pinned: the ones the CPU suite runs with (requirements*.txt's lower bounds hold).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-.whl}"
mkdir -p "$out"
wheels=(soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 kaldiio==2.18.1 webdataset==1.0.2 braceexpand==0.1.7 ruff==0.17.6
  silero-vad==6.2.3 pyannote.metrics==4.2.0 pyannote.core==6.1.0 pyannote.database==6.1.1 peft==0.21.2 setuptools==84.2.1)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$out" "${wheels[@]}"
ls -1 "$out"
total=$(du -cb "$out"/*.whl | tail -1 | cut -f1)
echo "$(ls "$out"/*.whl | wc -l) wheels, $((total / 1024)) KiB in $out (a device call carries at most 64 MiB)"
[ "$total" -lt $((48 * 1024 * 1024)) ] || { echo "error: $out holds more than 48 MiB" >&2; exit 1; }
