#!/usr/bin/env bash
# Static int8 against fp32 on ONE trained model: EER (with its interval) on the egs/mini test trials and
# utterances/s on this CPU, both waveform ONNX files exported from the same checkpoint.
#   bash bench/int8_trained.sh EXP [DATA] [WORK]
#     EXP   an exp dir or checkpoint of egs/mini (e.g. egs/mini/exp/ecapa_c512, trained by
#           bash egs/mini/run.sh --stage 3 --stop_stage 3 --config ../../conf/mini/ecapa_tdnn_c512.yaml --exp exp/ecapa_c512)
#     DATA  egs/mini's data dir (default egs/mini/data: val calibrates int8, test is scored)
#     WORK  where the files go (default: a new temporary directory)
# Prints each command, the parameter count, each file's EER line (speakerlab-score: EER, its bootstrap interval over
# speakers, minDCF) and the speed of the two files side by side (bench/deploy_speed.py --compare: one process, each
# cell on each file in alternating order, 3 rounds, median utterances/s of random 16 kHz audio, 2 threads).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: bash bench/int8_trained.sh EXP [DATA] [WORK]" >&2; exit 2; }
exp="$(realpath "$1")"
data="$(realpath "${2:-$repo/egs/mini/data}")"
work="${3:-$(mktemp -d)}"
mkdir -p "$work"
run() { echo "+ $*"; "$@"; }

echo "bench/int8_trained.sh $*  ($(date -u '+%Y-%m-%d %H:%M UTC'), $(git -C "$repo" rev-parse --short HEAD))"
echo "machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
python -c "import sys; from speakerlab.sources import read_source; m = read_source(sys.argv[1]).build(); \
print(f'model: {sum(p.numel() for p in m.parameters()):,} parameters')" "$exp"

run speakerlab-export --checkpoint "$exp" --waveform --out "$work/fp32.onnx"
# The EERs come from speakerlab-score below (with their intervals), not from the exporter's --trials check (the
# same embeddings once more); --force keeps a file the cosine check refused, for the figures below.
run speakerlab-export --checkpoint "$exp" --waveform --int8 static --calibration "$data/val" --force \
  --out "$work/int8.onnx"
for kind in fp32 int8; do
  run speakerlab-embed "$data/test/wav.scp" "$work/$kind.npz" --onnx "$work/$kind.onnx"
  run speakerlab-score --embeddings "$work/$kind.npz" --trials "$data/test/trials" --out "$work/scores_$kind" --no-plots \
    | sed "s/^/$kind: /"
done
run python "$repo/bench/deploy_speed.py" --work "$work" --compare "$work/fp32.onnx" "$work/int8.onnx"
