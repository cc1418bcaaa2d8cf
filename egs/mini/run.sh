#!/usr/bin/env bash
# egs/mini: the whole speaker-verification recipe on a synthetic corpus, CPU-only, in minutes.
#   bash egs/mini/run.sh                       # all stages
#   bash egs/mini/run.sh --stage 3 --stop_stage 3 --train_overrides "train.epochs=2"
# Stages: 1 corpus, 2 prepare lists, 3 train, 4 extract, 5 score, 6 no-training baseline;
# optional: 7 average the last checkpoints, 8 large-margin fine-tuning from the average, then
#   bash egs/mini/run.sh --stage 4 --stop_stage 5 --exp exp/campplus_lm
# Every stage can be re-run; training resumes from its latest checkpoint.
set -euo pipefail
cd "$(dirname "$0")"
help_message="Usage: bash egs/mini/run.sh [--stage N] [--stop_stage N] [--option value ...]"

stage=1
stop_stage=6
data=data                          # corpus and Kaldi data dirs
exp=exp/campplus
config=../../conf/mini_campplus.yaml
hardware=cpu                       # profile in conf/hardware/
checkpoint=""                      # stage 4 model ("" = the latest checkpoint of $exp)
average_last=3                     # stage 7: epoch checkpoints averaged
lm_config=../../conf/mini_finetune_lm.yaml
corpus_opts=""                     # extra generator options, e.g. "--num-train-speakers 50"
seed=1234
jobs=2                             # corpus generation processes
gpus=""                            # e.g. "0 1": one training process per GPU
nproc=1                            # training processes when gpus is empty (CPU DDP)
nnodes=1
node_rank=0
master_addr=127.0.0.1
master_port=29500
train_overrides=""                 # e.g. "train.epochs=2 optim.lr=0.2"

. ../tools/parse_options.sh
. ../tools/env.sh
. ../tools/common.sh

if stage_on 1; then
  log "stage 1: synthetic corpus -> $data"
  python -m speakerlab.synth --out "$data" --seed "$seed" --jobs "$jobs" $corpus_opts
fi

if stage_on 2; then
  log "stage 2: validate lists, check audio, index lengths; augmentation lists -> $data/musan_rirs"
  python -m speakerlab.prepare --data "$data/train" --data "$data/val" --data "$data/test"
  # The corpus has MUSAN/RIRS_NOISES-shaped noise (fewer files than the real sets: count warnings are
  # expected). Training augments with them only when asked: --train_overrides "augment.lists=$data/musan_rirs".
  python -m speakerlab.datasets.musan_rirs prepare --raw-dir "$data" --out "$data/musan_rirs"
  python -m speakerlab.noise_bank --lists "$data/musan_rirs"  # the int16 bank training memory-maps
fi

if stage_on 3; then
  log "stage 3: train $config -> $exp"
  train_stage data.train="$data/train" data.val="$data/val"
fi

if stage_on 4; then
  log "stage 4: extract test embeddings"
  embeddings_stage test
fi

if stage_on 5; then
  log "stage 5: score test trials"
  score_stage test trials test
fi

if stage_on 6; then
  log "stage 6: no-training baseline (cosine of mean log-mel)"
  python -m speakerlab.baseline --data "$data/test" --out "$exp/scores/test_baseline"
fi
if stage_on 7; then
  log "stage 7: average the last $average_last epoch checkpoints of $exp"
  average_stage
fi

if stage_on 8; then
  log "stage 8: large-margin fine-tuning -> ${exp}_lm"
  finetune_stage data.train="$data/train" data.val="$data/val"
fi
log "done"
