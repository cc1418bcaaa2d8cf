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
opt model_opts ""                  # the model, as speakerlab-diarize takes it: "--checkpoint EXP" or
                                   # "--3dspeaker NAME --weights FILE" or "--redimnet2 FILE" (stages 4-5)
opt exp exp/diar
opt vad silero                     # silero | energy
opt max_speakers 25                # estimated counts stay within 1..this: VoxConverse's recordings have up to 21
opt diarize_opts ""                # more speakerlab-diarize options, e.g. "--window 2.0 --device cuda"
opt seed 0
opt plda_data ""                   # stage 3: a data dir (wav.scp, utt2spk) of speakers to fit VBx's PLDA on
opt plda_opts ""                   # more speakerlab-plda options, e.g. "--per-utterance 2"
opt segmentation_train ""          # stage 3: train the segmentation model on this set (dev): "" trains none
opt seg_config ../../conf/diarization/segmentation_cpu.yaml  # its config (segmentation_gpu.yaml: pyannote's sizes, a GPU)
opt seg_opts ""                    # more speakerlab-segmentation-train options, e.g. "--set steps=2400"
opt segmentation ""                # instead: an existing segmentation model's ONNX file (from egs/mini_diar, or
                                   # another recipe's stage 3; relative to egs/voxconverse): stages 4-5 use it

. ../tools/parse_options.sh
if { [ "$stop_stage" -ge 4 ] || { stage_on 3 && [ -n "$plda_data" ]; }; } && [ -z "$model_opts" ]; then
  echo "error: stages 4-5 need --model_opts, e.g. --model_opts \"--checkpoint ../voxceleb/exp/campplus\"" >&2; exit 2
fi
if [ -n "$segmentation_train" ]; then
  if [ -n "$segmentation" ]; then
    echo "error: --segmentation_train trains a model and --segmentation gives one: choose one" >&2; exit 2
  elif [[ ! "$segmentation_train" =~ ^(dev|test)$ ]]; then
    echo "error: --segmentation_train must be dev or test (a VoxConverse set), got '$segmentation_train'" >&2; exit 2
  elif [[ " $sets " == *" $segmentation_train "* ]]; then
    echo "error: --segmentation_train $segmentation_train is also in --sets '$sets': it would be scored on its" \
      "training data (score the other set: --sets $([ "$segmentation_train" = dev ] && echo test || echo dev))" >&2
    exit 2
  fi
  segmentation="$exp/segmentation/segmentation.onnx"  # egs/tools/diarization.sh runs its systems where it exists
elif [ -n "$segmentation" ] && [ "$stop_stage" -ge 4 ] && [ ! -f "$segmentation" ]; then
  echo "error: --segmentation $segmentation: no such file (a segmentation model's ONNX file)" >&2; exit 2
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

if stage_on 3; then
  if [ -n "$plda_data" ]; then
    log "stage 3: the PLDA of VBx: $model_opts embeddings of $plda_data -> $plda"
    fit_plda "$plda_data" "$plda" $model_opts $plda_opts
  else
    log "stage 3: no --plda_data: no PLDA, no VBx system"
  fi
  if [ -n "$segmentation_train" ]; then
    train_dir="$data/voxconverse_$segmentation_train" seg_dir="$(dirname "$segmentation")"
    if [ ! -f "$train_dir/wav.scp" ] || [ ! -f "$train_dir/rttm" ]; then
      echo "error: stage 3: $train_dir has no wav.scp and rttm: run stage 1 with --segmentation_train" >&2; exit 2
    fi
    # What the model was trained from: its lists, config and options (a rewritten, unchanged list retrains nothing).
    inputs="$({ cat "$train_dir/wav.scp" "$train_dir/rttm" "$seg_config"; echo "$seg_opts"; } | cksum)"
    if [ -f "$segmentation" ] && [ "$(cat "$seg_dir/inputs.cksum" 2>/dev/null)" = "$inputs" ]; then
      log "stage 3: the segmentation model $segmentation is up to date ($train_dir, $seg_config), nothing to do"
    else
      log "stage 3: train the segmentation model ($seg_config) on $train_dir -> $segmentation"
      mkdir -p "$seg_dir"
      speakerlab-segmentation-train --data "$train_dir" --out "$seg_dir" --config "$seg_config" $seg_opts \
        2> >(tee "$seg_dir/train.log" >&2)
      echo "$inputs" >"$seg_dir/inputs.cksum"
    fi
  elif [ -n "$segmentation" ]; then
    log "stage 3: the segmentation model is --segmentation $segmentation: nothing to train"
  fi
fi

for set in $sets; do
  if stage_on 4; then
    if [ -n "$segmentation" ] && [ ! -f "$segmentation" ]; then
      echo "error: stage 4: no segmentation model $segmentation yet: run stage 3 (--stage 3)" >&2; exit 2
    fi
    log "stage 4: diarize $data/voxconverse_$set ($model_opts${segmentation:+; segmentation $segmentation}) -> $exp/$set"
    diarize_systems "$data/voxconverse_$set" "$exp/$set" $model_opts --seed "$seed"
  fi
  if stage_on 5; then
    log "stage 5: DER against $data/voxconverse_$set/rttm -> $exp/$set/der.txt"
    score_systems "$data/voxconverse_$set" "$exp/$set"
  fi
done
log "done"
