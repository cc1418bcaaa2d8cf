#!/usr/bin/env bash
# egs/3dspeaker: train on the 3D-Speaker training set, evaluate on its cross-device,
# cross-distance and cross-dialect trial lists.
#   bash egs/3dspeaker/run.sh --gpus "0 1 2 3" --hardware a100-80g
#   bash egs/3dspeaker/run.sh --archive_dir /corpora/3dspeaker --stage 1 --stop_stage 4   # archives on disk
#   bash egs/3dspeaker/run.sh --stage 5 --config ../../conf/3dspeaker_campplus.yaml --exp exp/campplus
# Stages: 1 download, 2 extract, 3 Kaldi lists (+ MUSAN/RIRS lists), 4 index (check audio, lengths),
#         5 train, 6 embeddings, 7 score every trial list.
# Optional: 8 average checkpoints, 9 large-margin fine-tuning; then extract/score the
# fine-tuned model with --exp ${exp}_lm.
# Every stage can be re-run: finished downloads/extractions are skipped and training resumes from
# its latest checkpoint. See README.md here.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh               # stage helpers, shared option defaults
help_message="Usage: bash egs/3dspeaker/run.sh [--stage N] [--stop_stage N] [--option value ...]"

stage=1
stop_stage=7
data=data                          # Kaldi data dirs
fetch_options                      # --download_dir --archive_dir --raw_dir --mirror --download_opts
                                   # --musan_rirs (defaults and meaning in ../tools/common.sh)
jobs=8                             # parallel downloads / index threads
prepare_opts=""                    # e.g. "--keep-device09"
train_set=3dspeaker_train
val_set=""                         # a data dir with `trials`, scored during training (data.val)
eval_set=3dspeaker_test
trials="cross_device cross_distance cross_dialect"   # $data/$eval_set/trials_<name>
exp=exp/eres2net_base
config=../../conf/3dspeaker_eres2net_base.yaml
hardware=auto                      # profile in conf/hardware/
launch_options                     # --gpus (e.g. "0 1 2 3": one training process per GPU) --nproc
                                   # --nnodes --node_rank --master_addr --master_port (../tools/common.sh)
train_overrides=""                 # e.g. "train.epochs=2 optim.lr=0.2"
checkpoint=""                      # extraction model ("" = latest of $exp; e.g. $exp/checkpoints/avg.pt)
average_last=10                    # stage 8: epoch checkpoints averaged into $exp/checkpoints/avg.pt
lm_config=../../conf/finetune_lm.yaml   # stage 9: large-margin fine-tuning overlay -> ${exp}_lm

. ../tools/parse_options.sh
. ../tools/env.sh

if stage_on 1; then
  log "stage 1: download 3D-Speaker (and MUSAN, RIRS_NOISES if musan_rirs=true) -> $download_dir"
  download_stage threedspeaker
fi

if stage_on 2; then
  log "stage 2: extract archives -> $raw_dir"
  extract_stage threedspeaker
fi

if stage_on 3; then
  log "stage 3: Kaldi lists and trial lists -> $data"
  lists_stage threedspeaker $prepare_opts
fi

if stage_on 4; then
  log "stage 4: validate lists, check audio, index lengths"
  index_stage
fi

if stage_on 5; then
  log "stage 5: train $config -> $exp"
  corpus_train_stage
fi

if stage_on 6; then
  log "stage 6: embeddings of $eval_set"
  embeddings_stage "$eval_set"
fi

if stage_on 7; then
  log "stage 7: score $trials"
  for t in $trials; do
    score_stage "$eval_set" "trials_$t" "$t"
  done
fi

if stage_on 8; then
  log "stage 8: average the last $average_last epoch checkpoints of $exp"
  average_stage
fi

if stage_on 9; then
  log "stage 9: large-margin fine-tuning from $exp/checkpoints/avg.pt -> ${exp}_lm"
  corpus_finetune_stage
fi
log "done"
