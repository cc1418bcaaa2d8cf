#!/usr/bin/env bash
# egs/voxconverse: speaker diarization of VoxConverse (debates and news, 1-21 speakers per clip) with a
# trained model, scored by DER. There is no training here: bring a model trained on VoxCeleb (egs/voxceleb)
# or a published one.
#   bash egs/voxconverse/run.sh --model_opts "--checkpoint ../voxceleb/exp/campplus"
#   bash egs/voxconverse/run.sh --model_opts "--3dspeaker campplus --weights campplus_cn_en_common.pt" --sets test
#   bash egs/voxconverse/run.sh --archive_dir /corpora/voxconverse --stage 1 --stop_stage 1   # archives on disk
# Stages (numbers as in every recipe): 1 data preparation (download the dev and test audio and the
# annotations v0.3, extract, data dirs with wav.scp, rttm, reco2num_spk, uem), 3 the PLDA of VBx (only with
# --plda_data: a data dir of training speakers, e.g. ../voxceleb/data/vox1_dev), 4 diarize
# (egs/tools/diarization.sh: estimated count, AHC, oracle count, oracle speech, one-speaker baseline, VBx when
# the PLDA exists; the VAD and embeddings once per recording, in $exp/<set>/cache), 5 DER of each (collar 0.25 and 0, overlap scored and skipped). Every stage can be re-run.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh
. ../tools/diarization.sh
help_message="Usage: bash egs/voxconverse/run.sh --model_opts \"--checkpoint EXP\" [--stage N] [--option value ...]"

opt stage 1
opt stop_stage 5
opt data data                      # data dirs voxconverse_dev, voxconverse_test
opt download_dir data/download     # archives are downloaded here
opt archive_dir ""                 # folder already holding the archives: nothing is downloaded
opt raw_dir data/raw               # archives are unpacked here
opt mirror ""                      # base URL replacing the official hosts (<mirror>/<file name>)
opt download_opts ""               # more download options, e.g. "--skip-md5 --jobs 2"
opt sets "dev test"                # which sets to prepare and diarize
opt model_opts ""                  # the model, as speakerlab-diarize takes it: "--checkpoint EXP" or
                                   # "--3dspeaker NAME --weights FILE" or "--redimnet2 FILE" (stages 4-5)
opt exp exp/diar
opt vad silero                     # silero | energy
opt max_speakers 25                # estimated counts stay within 1..this: VoxConverse's recordings have up to 21
opt diarize_opts ""                # more speakerlab-diarize options, e.g. "--window 2.0 --device cuda"
opt seed 0
opt plda_data ""                   # stage 3: a data dir (wav.scp, utt2spk) of speakers to fit VBx's PLDA on
opt plda_opts ""                   # more speakerlab-plda options, e.g. "--per-utterance 2"

. ../tools/parse_options.sh
if { [ "$stop_stage" -ge 4 ] || { stage_on 3 && [ -n "$plda_data" ]; }; } && [ -z "$model_opts" ]; then
  echo "error: stages 4-5 need --model_opts, e.g. --model_opts \"--checkpoint ../voxceleb/exp/campplus\"" >&2; exit 2
fi
export SPEAKERLAB_REQUIREMENTS="${SPEAKERLAB_REQUIREMENTS:-egs/tools/requirements-diarization.txt}"
. ../tools/env.sh
plda="$exp/plda.npz"

if stage_on 1; then
  log "stage 1: data preparation: VoxConverse $sets and the annotations -> $data"
  fetch=(--download-dir "$download_dir" --archive-dir="$archive_dir")
  speakerlab-voxconverse download "${fetch[@]}" --mirror="$mirror" --parts $sets annotations $download_opts
  speakerlab-voxconverse extract "${fetch[@]}" --raw-dir "$raw_dir" --parts $sets annotations
  speakerlab-voxconverse prepare --raw-dir "$raw_dir" --data "$data" --sets $sets
fi

if stage_on 3; then
  if [ -n "$plda_data" ]; then
    log "stage 3: the PLDA of VBx: $model_opts embeddings of $plda_data -> $plda"
    fit_plda "$plda_data" "$plda" $model_opts $plda_opts
  else
    log "stage 3: no --plda_data: no PLDA, no VBx system"
  fi
fi

for set in $sets; do
  if stage_on 4; then
    log "stage 4: diarize $data/voxconverse_$set ($model_opts) -> $exp/$set"
    diarize_systems "$data/voxconverse_$set" "$exp/$set" $model_opts --seed "$seed"
  fi
  if stage_on 5; then
    log "stage 5: DER against $data/voxconverse_$set/rttm -> $exp/$set/der.txt"
    score_systems "$data/voxconverse_$set" "$exp/$set"
  fi
done
log "done"
