#!/usr/bin/env bash
# egs/voxceleb: train on VoxCeleb2 dev, evaluate on Vox1-O / Vox1-E / Vox1-H (cleaned lists).
#   bash egs/voxceleb/run.sh --gpus "0 1 2 3" --hardware a100-80g
#   bash egs/voxceleb/run.sh --archive_dir /corpora/voxceleb --stage 1 --stop_stage 5   # archives on disk
#   bash egs/voxceleb/run.sh --stage 6 --config ../../conf/voxceleb_eres2net_base.yaml --exp exp/eres2net_base
#   bash egs/voxceleb/run.sh --parts vox1 --train_set vox1_dev --eval_set vox1_test --trials vox1_o_clean
# Stages: 1 download, 2 extract, 3 VoxCeleb2 m4a -> wav (ffmpeg), 4 Kaldi lists (+ MUSAN/RIRS lists),
#         5 index (check audio, lengths), 6 train, 7 embeddings, 8 score every trial list.
# Optional: 9 average checkpoints, 10 large-margin fine-tuning; then extract/score the
# fine-tuned model with --exp ${exp}_lm.
# Every stage can be re-run: finished downloads/extractions/conversions are skipped and training
# resumes from its latest checkpoint. See README.md here for disk space and hosts.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh               # stage helpers, shared option defaults
help_message="Usage: bash egs/voxceleb/run.sh [--stage N] [--stop_stage N] [--option value ...]"

stage=1
stop_stage=8
data=data                          # Kaldi data dirs
fetch_options                      # --download_dir --archive_dir --raw_dir --mirror --download_opts
                                   # --musan_rirs (defaults and meaning in ../tools/common.sh)
parts="vox1 vox2"                  # corpora to fetch and prepare ("vox1": VoxCeleb1 only, no ffmpeg)
jobs=8                             # parallel downloads / ffmpeg processes
train_set=vox2_dev
val_set=""                         # e.g. vox1_test: its EER is logged during training (data.val)
eval_set=vox1                      # all of VoxCeleb1: Vox1-E/H use dev speakers too
trials="vox1_o_clean vox1_e_clean vox1_h_clean"   # $data/$eval_set/trials_<name>
exp=exp/campplus
config=../../conf/voxceleb_campplus.yaml
hardware=auto                      # profile in conf/hardware/
launch_options                     # --gpus (e.g. "0 1 2 3": one training process per GPU) --nproc
                                   # --nnodes --node_rank --master_addr --master_port (../tools/common.sh)
train_overrides=""                 # e.g. "train.epochs=2 optim.lr=0.2"
checkpoint=""                      # extraction model ("" = latest of $exp; e.g. $exp/checkpoints/avg.pt)
average_last=10                    # stage 9: epoch checkpoints averaged into $exp/checkpoints/avg.pt
lm_config=../../conf/finetune_lm.yaml   # stage 10: large-margin fine-tuning overlay -> ${exp}_lm

. ../tools/parse_options.sh
. ../tools/env.sh

if stage_on 1; then
  log "stage 1: download VoxCeleb1, VoxCeleb2 (and MUSAN, RIRS_NOISES if musan_rirs=true) -> $download_dir"
  download_stage voxceleb --parts $parts
fi

if stage_on 2; then
  log "stage 2: extract archives -> $raw_dir"
  extract_stage voxceleb --parts $parts
fi

if stage_on 3 && [[ " $parts " == *" vox2 "* ]]; then
  log "stage 3: VoxCeleb2 m4a -> 16 kHz wav with ffmpeg ($jobs processes)"
  python -m speakerlab.datasets.voxceleb convert --raw-dir "$raw_dir" --jobs "$jobs"
fi

if stage_on 4; then
  log "stage 4: Kaldi lists and trial lists -> $data"
  lists_stage voxceleb --parts $parts
fi

if stage_on 5; then
  log "stage 5: validate lists, check audio, index lengths"
  index_stage
fi

if stage_on 6; then
  log "stage 6: train $config -> $exp"
  corpus_train_stage
fi

if stage_on 7; then
  log "stage 7: embeddings of $eval_set"
  embeddings_stage "$eval_set"
fi

if stage_on 8; then
  log "stage 8: score $trials"
  for t in $trials; do
    score_stage "$eval_set" "trials_$t" "$t"
  done
fi

if stage_on 9; then
  log "stage 9: average the last $average_last epoch checkpoints of $exp"
  average_stage
fi

if stage_on 10; then
  log "stage 10: large-margin fine-tuning from $exp/checkpoints/avg.pt -> ${exp}_lm"
  corpus_finetune_stage
fi
log "done"
