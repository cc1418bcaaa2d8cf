#!/usr/bin/env bash
# EER of trained egs/mini models on a larger held-out test set than the recipe's own (60 speakers,
# 8,100 trials): 150 speakers of another corpus seed, 20,250 trials, whose EER moves far less from
# run to run. Used to compare recipe versions (e.g. the two exp dirs of two bench/mini_recipe.sh runs).
#   bash bench/heldout_eer.sh EXP_OR_CHECKPOINT [...]     # prints one EER line per model
# The held-out corpus is generated once into $HELDOUT (default /tmp/speakerlab_heldout) and reused.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: bash bench/heldout_eer.sh EXP_DIR_OR_CHECKPOINT [...]" >&2; exit 2; }
heldout="${HELDOUT:-/tmp/speakerlab_heldout}"
. "$repo/egs/tools/env.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Seed 777 (the recipe uses 1234): other voices; test utterances of 4-8 s as in the recipe.
speakerlab-synth --out "$heldout" --seed 777 --num-train-speakers 2 --utts-per-speaker 2 \
  --num-val-speakers 2 --num-test-speakers 150 --jobs 2 2> "$work/synth.log" || { cat "$work/synth.log" >&2; exit 1; }
echo "command: bash bench/heldout_eer.sh $*  (held-out set $heldout/test: seed 777, 150 speakers)"
for model in "$@"; do
  speakerlab-extract --checkpoint "$model" --data "$heldout/test" --out "$work/emb.npz" 2> "$work/log" \
    || { cat "$work/log" >&2; exit 1; }
  eer=$(speakerlab-score --embeddings "$work/emb.npz" --trials "$heldout/test/trials" --out "$work/s" \
    2>&1 | grep -o 'EER [0-9.]*%' | head -n 1)
  echo "  $model: $(wc -l < "$heldout/test/trials") trials, $eer"
done
