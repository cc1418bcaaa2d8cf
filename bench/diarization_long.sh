#!/usr/bin/env bash
# Hours-long recordings through the real `speakerlab-diarize` (Silero VAD, a trained model's embeddings, capped
# clustering): the wall seconds of each stage and the peak RSS of the whole command on a 3-hour conversation, and
# the DER of capped against uncapped clustering (--max-units 0) on 30-minute conversations. The recordings are
# `speakerlab-synth-conversations` of the corpus's test speakers: one conversation of 3 hours among 8 speakers
# (turns of 1-6 s, some overlapped, background noise), and three of 30 minutes among 4-8 speakers.
#   OMP_NUM_THREADS=1 bash bench/diarization_long.sh MINI_DATA MODEL OUT [CLUSTERING...]
#   OMP_NUM_THREADS=1 bash bench/diarization_long.sh egs/mini/data egs/mini/exp/campplus /tmp/long vbx spectral
#   HALF_HOURS=8 LONG=false bash bench/diarization_long.sh ...   # eight 30-minute conversations, no 3-hour one
# MINI_DATA: egs/mini's data folder (test/ talks, train/ fits the PLDA of vbx, musan/noise under it all); MODEL:
# its checkpoint or exp dir; OUT: where the conversations, RTTM, logs and the PLDA go (kept: a rerun reuses
# them, and the VAD regions and embeddings are computed once per recording, in OUT/cache). CLUSTERING: the
# --clustering methods compared (default: vbx spectral); the 3-hour run's RSS is that of the first.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: bash bench/diarization_long.sh MINI_DATA MODEL OUT [CLUSTERING...]" >&2; exit 2; }
data="$1" model="$2" out="$3"
shift 3
if [ $# -ge 1 ]; then methods=("$@"); else methods=(vbx spectral); fi
mkdir -p "$out"
echo "command: OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset} bash bench/diarization_long.sh $data $model $out ${methods[*]}"
echo "machine: $(nproc --all) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load $(cut -d' ' -f1-3 /proc/loadavg)"

synth() {  # OUT_DIR then speakerlab-synth-conversations options; made once
  local dir="$1"; shift
  [ -f "$dir/wav.scp" ] || speakerlab-synth-conversations --data "$data/test" --noise "$data/musan/noise" --out "$dir" "$@"
}
long="${LONG:-true}" half_hours="${HALF_HOURS:-3}"
[ "$long" = false ] || synth "$out/conv3h" --num-conversations 1 --duration 10800 --min-speakers 8 --max-speakers 8 --seed 45
synth "$out/conv30" --num-conversations "$half_hours" --duration 1800 --min-speakers 4 --max-speakers 8 --seed 46
plda="$out/plda.npz"
[ -f "$plda" ] || speakerlab-plda --data "$data/train" --checkpoint "$model" --out "$plda"

diarize() {  # NAME DATA OPTIONS...: speakerlab-diarize under /usr/bin/time -v -> OUT/NAME.rttm, OUT/NAME.log
  local name="$1" dir="$2"; shift 2
  local opts=(--wav-scp "$dir/wav.scp" --checkpoint "$model" --cache "$out/cache" --rttm "$out/$name.rttm" "$@")
  /usr/bin/time -v speakerlab-diarize "${opts[@]}" 2> "$out/$name.log" || { cat "$out/$name.log" >&2; exit 1; }
  echo "$name: speakerlab-diarize ${opts[*]}"
  grep -E "^speakerlab-diarize: conv|Maximum resident|Elapsed \(wall" "$out/$name.log" | sed 's/^/  /'
}

plda_of() { [ "$1" = vbx ] && echo "--plda $plda" || true; }
if [ "$long" != false ]; then
  for m in "${methods[@]}"; do
    # shellcheck disable=SC2046  # the PLDA option is two words or none
    diarize "3h_$m" "$out/conv3h" --clustering "$m" $(plda_of "$m")
  done
  hyps=()
  for m in "${methods[@]}"; do hyps+=(--hyp "$m=$out/3h_$m.rttm"); done
  speakerlab-der --ref "$out/conv3h/rttm" --uem "$out/conv3h/uem" "${hyps[@]}"
fi

hyps=()
for m in "${methods[@]}"; do
  for cap in capped uncapped; do
    extra=()
    [ "$cap" = uncapped ] && extra=(--max-units 0)
    # shellcheck disable=SC2046
    diarize "30min_${m}_$cap" "$out/conv30" --clustering "$m" $(plda_of "$m") "${extra[@]}"
    hyps+=(--hyp "${m}_$cap=$out/30min_${m}_$cap.rttm")
  done
done
speakerlab-der --ref "$out/conv30/rttm" --uem "$out/conv30/uem" "${hyps[@]}"
