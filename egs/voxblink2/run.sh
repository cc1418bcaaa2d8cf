#!/usr/bin/env bash
# egs/voxblink2: train on VoxBlink2 + VoxCeleb2 dev (+ CN-Celeb2), each corpus its own speaker-id namespace;
# evaluate on Vox1-O / Vox1-E / Vox1-H (cleaned) and the CN-Celeb1 evaluation trials.
#   bash egs/voxblink2/run.sh --archive_dir /corpora/archives --gpus "0 1 2 3 4 5 6 7" --hardware h100-80g
#   bash egs/voxblink2/run.sh --cnceleb false          # VoxBlink2 + VoxCeleb2 only, scored on VoxCeleb1
# VoxBlink2's audio is sent by its authors on request: VB2_audio.tar.gz (or its parts) goes in --archive_dir
# with the other corpora's archives, or --vb2_audio_dir names an already unpacked <spk>/<video>/<n>.wav tree.
# Stages (the same numbers in every recipe): 1 data preparation (VoxBlink2, VoxCeleb1+2 with the m4a -> wav
# conversion, CN-Celeb1+2, MUSAN/RIR lists), 2 features (validate lists, check audio, index lengths),
# 3 train on the corpora list $data/train_corpora.yaml (data.train), 4 embeddings of every evaluation set,
# 5 score every trial list; optional: 9 stress table (speakerlab-stress), 6 average checkpoints, 7 large-margin fine-tuning (speakers mapped by id
# onto the pre-training's rows), then stages 4-5 with --exp ${exp}_lm. Every stage can be re-run.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh
help_message="Usage: bash egs/voxblink2/run.sh [--stage N] [--stop_stage N] [--option value ...]"

opt stage 1
opt stop_stage 5
opt data data                      # Kaldi data dirs
fetch_options                      # --download_dir --archive_dir --raw_dir --mirror --download_opts --musan_rirs
opt jobs 8 count                   # parallel downloads / ffmpeg processes / index threads
opt vb2_audio_dir ""               # VoxBlink2 already unpacked: its <spk>/<video>/<n>.wav tree (no archive needed)
opt cnceleb true                   # CN-Celeb2 in the training mix and the CN-Celeb1 evaluation (false: neither)
opt vb2_weight 1.0                 # passes per epoch over each corpus (data.train[i].weight)
opt vox2_weight 1.0
opt cnc2_weight 1.0
opt val_set ""                     # a data dir with `trials`, scored during training (data.val)
opt exp exp/redimnet2_b6
opt config ../../conf/voxblink2/redimnet2_b6.yaml
opt hardware auto                  # profile in conf/hardware/
launch_options                     # --gpus (default: all visible) --nproc --nnodes --node_rank --master_addr --master_port
calibration_options                # --cal_set (stage 8: held-out data dir with trials) --p_target
opt shards false                   # stage 2 also writes tar shards of the corpora; stages 3, 7 stream them
opt train_overrides ""             # e.g. "train.epochs=2 optim.lr=0.2"
opt checkpoint ""                  # stage 4 model ("" = latest of $exp; e.g. $exp/checkpoints/avg.pt)
opt average_last 10                # stage 6: epoch checkpoints averaged into $exp/checkpoints/avg.pt
opt lm_config ../../conf/voxblink2/redimnet2_b6_lm.yaml   # stage 7: large-margin overlay -> ${exp}_lm
opt lm_overrides ""                # stage 7: overrides on top of train_overrides, e.g. "train.epochs=1"
opt stress_opts ""                # stage 9: more speakerlab-stress options, e.g. "--both-sides"

. ../tools/parse_options.sh
. ../tools/env.sh

# The corpora of stages 2, 3 and 7 (speakerlab.dataio.tables.corpora): one record each, in this order.
corpora="$data/train_corpora.yaml"
write_corpora() {
  {
    echo "- {name: vb2, dir: $data/vb2, weight: $vb2_weight}"
    echo "- {name: vox2, dir: $data/vox2_dev, weight: $vox2_weight}"
    [ "$cnceleb" = true ] && echo "- {name: cnc2, dir: $data/cnc2/cnceleb_train, weight: $cnc2_weight}"
    true
  } > "$corpora"
}
train_dirs="$data/vb2 $data/vox2_dev"
eval_sets="vox1"
[ "$cnceleb" = true ] && train_dirs="$train_dirs $data/cnc2/cnceleb_train" && eval_sets="vox1 cnceleb_eval"
trials_of() { [ "$1" = vox1 ] && echo "vox1_o_clean vox1_e_clean vox1_h_clean" || echo "cnceleb1"; }

# Training data of stages 3 and 7: the corpora list, the validation set when given, and the MUSAN/RIR lists
# of stage 1 (or no augmentation); with --shards true, the tar shards of stage 2.
aug="augment.lists=null"
[ "$musan_rirs" = true ] && aug="augment.lists=$data/musan_rirs"
train_data="data.train=$corpora ${val_set:+data.val=$data/$val_set} $aug"
[ "$shards" = true ] && train_data="$train_data data.shards=$data/train_shards"

if stage_on 3; then   # the corpora list first: the pre-flight reads it as stage 3 will (the dirs may come later)
  mkdir -p "$data"
  write_corpora
fi
preflight --config "$config" --exp-dir "$exp" --hardware "$hardware" $train_data $train_overrides

if stage_on 1; then
  log "stage 1: data preparation: VoxBlink2, VoxCeleb1+2$([ "$cnceleb" = true ] && echo ", CN-Celeb1+2") (and MUSAN, RIRS_NOISES if musan_rirs=true) -> $data"
  fetch=(--download-dir "$download_dir" --archive-dir="$archive_dir")
  if [ -z "$vb2_audio_dir" ]; then
    speakerlab-voxblink2 download "${fetch[@]}" --mirror="$mirror" $download_opts
    speakerlab-voxblink2 extract "${fetch[@]}" --raw-dir "$raw_dir"
  fi
  speakerlab-voxblink2 prepare --raw-dir "$raw_dir" --data "$data" ${vb2_audio_dir:+--audio-dir "$vb2_audio_dir"}
  speakerlab-voxceleb download "${fetch[@]}" --mirror="$mirror" --jobs "$jobs" $download_opts
  speakerlab-voxceleb extract "${fetch[@]}" --raw-dir "$raw_dir"
  speakerlab-voxceleb convert --raw-dir "$raw_dir" --jobs "$jobs"
  speakerlab-voxceleb prepare --raw-dir "$raw_dir" --data "$data"
  if [ "$cnceleb" = true ]; then   # CN-Celeb2 alone for training (as ReDimNet2's mix), CN-Celeb1 for evaluation
    speakerlab-cnceleb download "${fetch[@]}" --mirror="$mirror" --jobs "$jobs" $download_opts
    speakerlab-cnceleb extract "${fetch[@]}" --raw-dir "$raw_dir"
    speakerlab-cnceleb prepare --raw-dir "$raw_dir" --data "$data"
    speakerlab-cnceleb prepare --raw-dir "$raw_dir" --data "$data/cnc2" --parts cnceleb2
  fi
  if [ "$musan_rirs" = true ]; then
    speakerlab-musan-rirs download "${fetch[@]}" --mirror="$mirror" --jobs "$jobs" $download_opts
    speakerlab-musan-rirs extract "${fetch[@]}" --raw-dir "$raw_dir"
    speakerlab-musan-rirs prepare --raw-dir "$raw_dir" --out "$data/musan_rirs"
  fi
fi

if stage_on 2; then
  log "stage 2: features: validate lists and trials, check audio, index lengths; the noise/RIR bank"
  prep=(); for d in $train_dirs; do prep+=(--data "$d"); done
  for e in $eval_sets; do prep+=(--data "$data/$e"); done
  speakerlab-prepare "${prep[@]}" ${val_set:+--data "$data/$val_set"} --jobs "$jobs"
  if [ "$musan_rirs" = true ]; then
    speakerlab-noise-bank --lists "$data/musan_rirs"
  fi
  if [ "$shards" = true ]; then   # one set of tar shards of all corpora, ids namespaced as training reads them
    write_corpora
    speakerlab-shards --data "$corpora" --out "$data/train_shards"
  fi
fi

if stage_on 3; then
  write_corpora
  log "stage 3: train $config on $(grep -o 'name: [a-z0-9]*' "$corpora" | cut -d' ' -f2 | xargs) -> $exp"
  launch speakerlab-train --config "$config" --exp-dir "$exp" --hardware "$hardware" $train_data $train_overrides
fi

if stage_on 4; then
  log "stage 4: embeddings of $eval_sets"
  for e in $eval_sets; do
    speakerlab-extract --checkpoint "${checkpoint:-$exp}" --data "$data/$e" --out "$exp/embeddings/$e.npz"
  done
fi

if stage_on 5; then
  log "stage 5: score $(for e in $eval_sets; do trials_of "$e"; done | xargs) -> $exp/scores"
  for e in $eval_sets; do
    names=$(trials_of "$e")
    lists=(); for t in $names; do lists+=("$data/$e/trials_$t"); done
    speakerlab-score --embeddings "$exp/embeddings/$e.npz" --trials "${lists[@]}" --names $names --out "$exp/scores/"
  done
fi

if stage_on 6; then
  log "stage 6: average the last $average_last epoch checkpoints of $exp"
  speakerlab-average --exp-dir "$exp" --last "$average_last"
fi

if stage_on 7; then
  write_corpora
  log "stage 7: large-margin fine-tuning from $exp/checkpoints/avg.pt -> ${exp}_lm (speakers mapped by id)"
  launch speakerlab-train --config "$config" --config "$lm_config" --exp-dir "${exp}_lm" --hardware "$hardware" \
    train.init="$exp/checkpoints/avg.pt" train.init_match_speakers=true $train_data $train_overrides $lm_overrides
fi
# 8 calibration (fitted on the held-out set, measured on the first evaluation set's lists), 9 its stress table
e="${eval_sets%% *}"
listed_eval_stages "$exp" "${checkpoint:-$exp}" "$data/$e" "$cal_set" $(trials_of "$e")
log "done"
