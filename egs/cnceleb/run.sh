#!/usr/bin/env bash
# egs/cnceleb: train on CN-Celeb1 dev + CN-Celeb2, evaluate on the CN-Celeb1 evaluation trials.
#   bash egs/cnceleb/run.sh --gpus "0 1 2 3" --hardware a100-80g
#   bash egs/cnceleb/run.sh --archive_dir /corpora/cnceleb --stage 1 --stop_stage 4   # archives on disk
# Stages: 1 download, 2 extract, 3 Kaldi lists (+ MUSAN/RIRS lists), 4 index (check audio, lengths),
#         5 train, 6 embeddings, 7 score.
# Enrolment follows the official protocol: one embedding of eval/enroll/<spk>-enroll.flac, the
# release's concatenation of each speaker's enrolment utterances (see README.md here).
# Optional: 8 average checkpoints, 9 large-margin fine-tuning; then extract/score the
# fine-tuned model with --exp ${exp}_lm.
# Every stage can be re-run: finished downloads/extractions are skipped and training resumes from
# its latest checkpoint.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh               # stage helpers, shared option defaults
help_message="Usage: bash egs/cnceleb/run.sh [--stage N] [--stop_stage N] [--option value ...]"

stage=1
stop_stage=7
data=data                          # Kaldi data dirs
fetch_options                      # --download_dir --archive_dir --raw_dir --mirror --download_opts
                                   # --musan_rirs (defaults and meaning in ../tools/common.sh)
jobs=8                             # parallel downloads / index threads
train_set=cnceleb_train
val_set=""                         # a data dir with `trials`, scored during training (data.val)
eval_set=cnceleb_eval
exp=exp/campplus
config=../../conf/cnceleb_campplus.yaml
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
  log "stage 1: download CN-Celeb1, CN-Celeb2 (and MUSAN, RIRS_NOISES if musan_rirs=true) -> $download_dir"
  download_stage cnceleb
fi

if stage_on 2; then
  log "stage 2: extract archives -> $raw_dir"
  extract_stage cnceleb
fi

if stage_on 3; then
  log "stage 3: Kaldi lists and trial list -> $data"
  lists_stage cnceleb
fi

if stage_on 4; then
  log "stage 4: validate lists and trials, check audio, index lengths"
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
  log "stage 7: score the CN-Celeb evaluation trials"
  score_stage "$eval_set" trials cnceleb_eval
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
