#!/usr/bin/env bash
# egs/voxconverse: speaker diarization of VoxConverse (debates and news, 1-21 speakers per clip) with a
# trained model, scored by DER. The speaker model is not trained here: bring one trained on VoxCeleb (egs/voxceleb)
# or a published one. A segmentation model can be trained here on one set's reference RTTM (dev, with test scored).
#   bash egs/voxconverse/run.sh --model_opts "--checkpoint ../voxceleb/exp/campplus"
#   bash egs/voxconverse/run.sh --model_opts "--3dspeaker campplus --weights campplus_cn_en_common.pt" --sets test
#   bash egs/voxconverse/run.sh --model_opts "--checkpoint ../voxceleb/exp/campplus" --sets test --segmentation_train dev
#   bash egs/voxconverse/run.sh --model_opts "..." --segmentation ../mini_diar/exp/diar/segmentation/segmentation.onnx
#   bash egs/voxconverse/run.sh --archive_dir /corpora/voxconverse --stage 1 --stop_stage 1   # archives on disk
# Stages (numbers as in every recipe): 1 data preparation (download the dev and test audio and the
# annotations v0.3, extract, data dirs with wav.scp, rttm, reco2num_spk, uem; of --sets and --segmentation_train),
# 3 train: the PLDA of VBx (only with --plda_data: a data dir of training speakers, e.g. ../voxceleb/data/vox1_dev)
# and, with --segmentation_train SET, the segmentation model on that set's audio and reference RTTM ($seg_config
# -> $exp/segmentation/segmentation.onnx; retrained only when its data, config or options change), 4 diarize
# (egs/tools/diarization.sh: estimated count, AHC, oracle count, oracle speech, one-speaker baseline, VBx when
# the PLDA exists, and segmentation, segmentation_oracle_count (and segmentation_vbx with the PLDA) when a
# segmentation model is trained or given; the VAD and embeddings once per recording, in $exp/<set>/cache),
# 5 DER of each (collar 0.25 and 0, overlap scored and skipped). Every stage can be re-run.
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
corpus_diarization_options 25      # egs/tools/diarization.sh: --model_opts, --max_speakers (25: VoxConverse's
                                   # recordings have up to 21 speakers), --segmentation_train (dev), --segmentation ...

. ../tools/parse_options.sh
corpus_diarization_checks
if [ -n "$segmentation_train" ]; then
  if [[ ! "$segmentation_train" =~ ^(dev|test)$ ]]; then
    echo "error: --segmentation_train must be dev or test (a VoxConverse set), got '$segmentation_train'" >&2; exit 2
  elif [[ " $sets " == *" $segmentation_train "* ]]; then
    echo "error: --segmentation_train $segmentation_train is also in --sets '$sets': it would be scored on its" \
      "training data (score the other set: --sets $([ "$segmentation_train" = dev ] && echo test || echo dev))" >&2
    exit 2
  fi
fi
export SPEAKERLAB_REQUIREMENTS="${SPEAKERLAB_REQUIREMENTS:-egs/tools/requirements-diarization.txt}"
. ../tools/env.sh
plda="$exp/plda.npz"

if stage_on 1; then
  log "stage 1: data preparation: VoxConverse $sets $segmentation_train and the annotations -> $data"
  fetch=(--download-dir "$download_dir" --archive-dir="$archive_dir")
  speakerlab-voxconverse download "${fetch[@]}" --mirror="$mirror" --parts $sets $segmentation_train annotations \
    $download_opts
  speakerlab-voxconverse extract "${fetch[@]}" --raw-dir "$raw_dir" --parts $sets $segmentation_train annotations
  speakerlab-voxconverse prepare --raw-dir "$raw_dir" --data "$data" --sets $sets $segmentation_train
fi

if stage_on 3; then corpus_train_stage "$data/voxconverse_$segmentation_train"; fi

for set in $sets; do
  corpus_diarize_stages "$data/voxconverse_$set" "$exp/$set"
done
log "done"
