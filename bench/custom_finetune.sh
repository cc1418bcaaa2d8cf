#!/usr/bin/env bash
# Fine-tuning on one's own data, measured: the egs/mini model (pretrained on 400 synthetic speakers, wide-band)
# fine-tuned with egs/custom on other synthetic speakers (another seed) recorded over a telephone channel and
# kept as a folder tree (speakerlab-synth-tree: nested folders, FLAC and WAV, 8/16/44.1 kHz, a stereo
# file), against the same model without fine-tuning and the same CAM++ trained from scratch for the same steps.
#   bash bench/custom_finetune.sh [WORK_DIR] [-- egs/custom/run.sh options...]
# Prints the three EERs on the held-out speakers' trials (each with its interval and counts), the stage times and
# the command. The egs/mini model is trained once into WORK_DIR/mini (or taken as it is from $MINI_EXP, an exp
# dir). The held-out split is the recipe's default (200 speakers: 40 test, 20 validation).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mkdir -p "${1:-/tmp/speakerlab_custom_bench}" && cd "${1:-/tmp/speakerlab_custom_bench}" && pwd)"
shift || true
[ "${1:-}" = "--" ] && shift
. "$repo/egs/tools/env.sh"
speakers="${SPEAKERS:-200}"    # custom speakers (+ 4; the default split holds out 40 for the test, 20 for validation)
utts="${UTTS:-16}"             # utterances of 2-4 s per speaker
t0=$(date +%s)
stamp() { echo "  $1: $(( $(date +%s) - t0 )) s"; t0=$(date +%s); }
echo "command: bash bench/custom_finetune.sh $work $*   (speakers $speakers x $utts utterances)"
echo "machine: $(nproc --all) CPU cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
mini="${MINI_EXP:-$work/mini/exp}"
if [ -z "${MINI_EXP:-}" ] && [ ! -f "$mini/checkpoints/epoch_010.pt" ]; then
  bash "$repo/egs/mini/run.sh" --data "$work/mini/data" --exp "$mini" --stop_stage 3 > "$work/mini.log" 2>&1
  stamp "egs/mini stages 1-3 (the pretrained model)"
fi
if [ ! -d "$work/tree" ]; then
  speakerlab-synth --out "$work/corpus" --seed 999 --num-train-speakers "$speakers" \
    --num-val-speakers 2 --num-test-speakers 2 --utts-per-speaker "$utts" --eval-utts-per-speaker 2 --min-dur 2 \
    --max-dur 4 --eval-min-dur 2 --eval-max-dur 4 --jobs 2 2> "$work/synth.log"
  speakerlab-synth-tree --corpus "$work/corpus" --out "$work/tree"
  stamp "custom speakers: synthetic voices (seed 999) as a telephone folder tree"
fi
custom=(--root "$work/tree" --data "$work/data" --jobs 2 "$@")
bash "$repo/egs/custom/run.sh" "${custom[@]}" --init "$mini" --exp "$work/finetune" > "$work/finetune.log" 2>&1
stamp "egs/custom stages 1-5, fine-tuning"
bash "$repo/egs/custom/run.sh" "${custom[@]}" --stage 3 --exp "$work/scratch" > "$work/scratch.log" 2>&1
stamp "egs/custom stages 3-5, from scratch"
grep -h "^EER: " "$work/finetune.log" "$work/scratch.log" | sed 's/^/  /'
steps() { grep -oE "(training done: [0-9]+ epochs|stopped early after epoch [0-9]+ of [0-9]+), [0-9]+ steps" \
  "$1/train.log" | tail -n 1; }
echo "  fine-tuning: $(steps "$work/finetune"); from scratch: $(steps "$work/scratch")"
grep -hE "the run's result|training did not help" "$work/finetune/train.log" "$work/scratch/train.log" | sed 's/^/  /'
grep -h "files, .* of them audio" "$work/finetune.log" | sed 's/^/  /'
