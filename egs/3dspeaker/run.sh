#!/usr/bin/env bash
# egs/3dspeaker: train on the 3D-Speaker training set, evaluate on its cross-device,
# cross-distance and cross-dialect trial lists.
#   bash egs/3dspeaker/run.sh --gpus "0 1 2 3" --hardware a100-80g
#   bash egs/3dspeaker/run.sh --archive_dir /corpora/3dspeaker --stage 1 --stop_stage 2   # archives on disk
#   bash egs/3dspeaker/run.sh --stage 3 --config ../../conf/3dspeaker/campplus.yaml --exp exp/campplus
# Stages (the same numbers in every recipe): 1 data preparation (download, extract, Kaldi lists and
# trials, MUSAN/RIR lists), 2 features (validate lists, check audio, index lengths),
# 3 train (two runs with --ft_config),
# 4 embeddings, 5 score every trial list; optional: 9 stress table (speakerlab-stress), 6 average checkpoints, 7 large-margin
# fine-tuning, then stages 4-5 with --exp ${exp}_lm.
# Without speaker labels (docs/selfsup.md): --labels false with a self-supervised config, e.g.
#   bash egs/3dspeaker/run.sh --labels false --config ../../conf/3dspeaker/dino_rdino_ecapa_tdnn.yaml --exp exp/rdino
#   bash egs/3dspeaker/run.sh --labels false --exp exp/rdino --stage 10 --stop_stage 10 --rounds 2   # pseudo-labels
# then stages 4-5 with --exp exp/rdino_pl2.
# Every stage can be re-run: finished downloads/extractions are skipped and training resumes from
# its latest checkpoint. See README.md here.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh
help_message="Usage: bash egs/3dspeaker/run.sh [--stage N] [--stop_stage N] [--option value ...]"

opt stage 1
opt stop_stage 5
opt data data                      # Kaldi data dirs
fetch_options                      # --download_dir --archive_dir --raw_dir --mirror --download_opts --musan_rirs
opt jobs 8 count                   # parallel downloads / index threads
opt prepare_opts ""                # e.g. "--keep-device09"
opt train_set 3dspeaker_train
opt val_set ""                     # a data dir with `trials`, scored during training (data.val)
opt eval_set 3dspeaker_test
opt trials "cross_device cross_distance cross_dialect"   # $data/$eval_set/trials_<name>
opt exp exp/eres2net_base
opt config ../../conf/3dspeaker/eres2net_base.yaml
opt hardware auto                  # profile in conf/hardware/
launch_options                     # --gpus (default: all visible) --nproc --nnodes --node_rank --master_addr --master_port
calibration_options                # --cal_set (stage 8: held-out data dir with trials) --p_target
opt shards false                   # stage 2 also writes tar shards of the training set; stages 3, 7 stream them
opt train_overrides ""             # e.g. "train.epochs=2 optim.lr=0.2"
opt checkpoint ""                  # stage 4 model ("" = latest of $exp; e.g. $exp/checkpoints/avg.pt)
opt average_last 10                # stage 6: epoch checkpoints averaged into $exp/checkpoints/avg.pt
opt ft_config ""                   # stage 3 in two runs (SSL encoders): $config -> ${exp}_frozen, then this
                                   # joint fine-tuning overlay from its averaged checkpoints -> $exp
opt lm_config ../../conf/finetune_lm.yaml   # stage 7: large-margin fine-tuning overlay -> ${exp}_lm
opt lm_overrides ""                # stage 7: overrides on top of train_overrides, e.g. "train.epochs=1"
opt stress_opts ""                # stage 9: more speakerlab-stress options, e.g. "--both-sides"
pseudo_label_options 3dspeaker          # stage 10: --labels --supervised_config --rounds --clusters --drop --round_overrides

. ../tools/parse_options.sh
# Without labels, stage 10's pseudo-labels need scikit-learn (egs/tools/requirements-selfsup.txt)
[ "$labels" = false ] && export SPEAKERLAB_REQUIREMENTS="${SPEAKERLAB_REQUIREMENTS:-egs/tools/requirements-selfsup.txt}"
. ../tools/env.sh

# Training data of stages 3 and 7: the training set, the validation set when given, and the
# MUSAN/RIR lists of stage 1 (or no augmentation); with --shards true, the tar shards of stage 2.
aug="augment.lists=null"
[ "$musan_rirs" = true ] && aug="augment.lists=$data/musan_rirs"
train_data="data.train=$data/$train_set ${val_set:+data.val=$data/$val_set} $aug"
[ "$shards" = true ] && train_data="$train_data data.shards=$data/$train_set/shards"
[ "$labels" = false ] && train_data="$train_data data.labels=false"

first_exp="$exp"; [ -z "$ft_config" ] || first_exp="${exp}_frozen"   # stage 3's first training run
preflight --config "$config" --exp-dir "$first_exp" --hardware "$hardware" $train_data $train_overrides

if stage_on 1; then
  log "stage 1: data preparation: 3D-Speaker (and MUSAN, RIRS_NOISES if musan_rirs=true) -> $data"
  fetch=(--download-dir "$download_dir" --archive-dir="$archive_dir")
  speakerlab-3dspeaker download "${fetch[@]}" --mirror="$mirror" --jobs "$jobs" $download_opts
  speakerlab-3dspeaker extract "${fetch[@]}" --raw-dir "$raw_dir"
  speakerlab-3dspeaker prepare --raw-dir "$raw_dir" --data "$data" $prepare_opts
  if [ "$musan_rirs" = true ]; then
    speakerlab-musan-rirs download "${fetch[@]}" --mirror="$mirror" --jobs "$jobs" $download_opts
    speakerlab-musan-rirs extract "${fetch[@]}" --raw-dir "$raw_dir"
    speakerlab-musan-rirs prepare --raw-dir "$raw_dir" --out "$data/musan_rirs"
  fi
fi

if stage_on 2; then
  log "stage 2: features: validate lists and trials, check audio, index lengths; the noise/RIR bank"
  speakerlab-prepare --data "$data/$train_set" ${val_set:+--data "$data/$val_set"} --data "$data/$eval_set" --jobs "$jobs"
  if [ "$musan_rirs" = true ]; then   # noise/RIR audio read once into an int16 bank training memory-maps
    speakerlab-noise-bank --lists "$data/musan_rirs"
  fi
  if [ "$shards" = true ]; then   # WebDataset tar shards (speakerlab.dataio.loaders.shards): for data on network storage
    speakerlab-shards --data "$data/$train_set" --out "$data/$train_set/shards"
  fi
fi

if stage_on 3 && [ -n "$ft_config" ]; then
  log "stage 3: train $config -> ${exp}_frozen, average its last $average_last, then $ft_config -> $exp"
  launch speakerlab-train --config "$config" --exp-dir "${exp}_frozen" --hardware "$hardware" $train_data \
    $train_overrides
  speakerlab-average --exp-dir "${exp}_frozen" --last "$average_last"
  launch speakerlab-train --config "$config" --config "$ft_config" --exp-dir "$exp" --hardware "$hardware" \
    train.init="${exp}_frozen/checkpoints/avg.pt" $train_data $train_overrides
elif stage_on 3; then
  log "stage 3: train $config -> $exp"
  launch speakerlab-train --config "$config" --exp-dir "$exp" --hardware "$hardware" $train_data $train_overrides
fi

if stage_on 4; then
  log "stage 4: embeddings of $data/$eval_set"
  speakerlab-extract --checkpoint "${checkpoint:-$exp}" --data "$data/$eval_set" \
    --out "$exp/embeddings/$eval_set.npz"
fi

if stage_on 5; then
  log "stage 5: score $trials -> $exp/scores (per list: scores, metrics JSON, DET and histogram PNGs; one table)"
  lists=(); for t in $trials; do lists+=("$data/$eval_set/trials_$t"); done
  speakerlab-score --embeddings "$exp/embeddings/$eval_set.npz" --trials "${lists[@]}" --names $trials \
    --out "$exp/scores/"
fi

if stage_on 6; then
  log "stage 6: average the last $average_last epoch checkpoints of $exp"
  speakerlab-average --exp-dir "$exp" --last "$average_last"
fi

if stage_on 7; then
  log "stage 7: large-margin fine-tuning from $exp/checkpoints/avg.pt -> ${exp}_lm"
  launch speakerlab-train --config "$config" --config "$lm_config" --exp-dir "${exp}_lm" --hardware "$hardware" \
    train.init="$exp/checkpoints/avg.pt" $train_data $train_overrides $lm_overrides
fi
# 8 calibration (fitted on the held-out set, measured on every list), 9 the stress table of the first list
listed_eval_stages "$exp" "${checkpoint:-$exp}" "$data/$eval_set" "${cal_set:-${val_set:+$data/$val_set}}" $trials

if stage_on 10; then  # pseudo-label rounds after a self-supervised stage 3 (--labels false)
  pseudo_label_stage "$exp" "$data/$train_set" ${val_set:+data.val=$data/$val_set} $aug
fi
log "done"
