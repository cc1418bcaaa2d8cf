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
help_message="Usage: bash egs/cnceleb/run.sh [--stage N] [--stop_stage N] [--option value ...]"

stage=1
stop_stage=7
data=data                          # Kaldi data dirs
download_dir=data/download         # archives are downloaded (or joined) here
archive_dir=""                     # folder already holding the archives: nothing is downloaded
raw_dir=data/raw                   # archives are unpacked here
mirror=""                          # base URL replacing the official hosts (<mirror>/<file name>)
download_opts=""                   # more download-step options, e.g. "--user NAME --skip-md5 --keep-parts"
musan_rirs=true                    # also fetch MUSAN + RIRS_NOISES, write their lists, augment with
                                   # them in training (false: augment.lists=null, no augmentation)
jobs=8                             # parallel downloads / index threads
train_set=cnceleb_train
val_set=""                         # a data dir with `trials`, scored during training (data.val)
eval_set=cnceleb_eval
exp=exp/campplus
config=../../conf/cnceleb_campplus.yaml
hardware=auto                      # profile in conf/hardware/
gpus=""                            # e.g. "0 1 2 3": one training process per GPU
nproc=1                            # training processes when gpus is empty
nnodes=1
node_rank=0
master_addr=127.0.0.1
master_port=29500
train_overrides=""                 # e.g. "train.epochs=2 optim.lr=0.2"
checkpoint=""                      # extraction model ("" = latest of $exp; e.g. $exp/checkpoints/avg.pt)
average_last=10                    # stage 8: epoch checkpoints averaged into $exp/checkpoints/avg.pt
lm_config=../../conf/finetune_lm.yaml   # stage 9: large-margin fine-tuning overlay -> ${exp}_lm

. ../tools/parse_options.sh
. ../tools/env.sh
. ../tools/common.sh

fetch_opts=(--download-dir "$download_dir" --archive-dir="$archive_dir")
# Training reads the augmentation lists where the lists stage wrote them (as data.train follows --data).
if [ "$musan_rirs" = true ]; then aug="augment.lists=$data/musan_rirs"; else aug="augment.lists=null"; fi

if stage_on 1; then
  log "stage 1: download CN-Celeb1, CN-Celeb2 (and MUSAN, RIRS_NOISES if musan_rirs=true) -> $download_dir"
  python -m speakerlab.datasets.cnceleb download "${fetch_opts[@]}" --mirror="$mirror" --jobs "$jobs" $download_opts
  if [ "$musan_rirs" = true ]; then
    python -m speakerlab.datasets.musan_rirs download "${fetch_opts[@]}" --mirror="$mirror" \
      --jobs "$jobs" $download_opts
  fi
fi

if stage_on 2; then
  log "stage 2: extract archives -> $raw_dir"
  python -m speakerlab.datasets.cnceleb extract "${fetch_opts[@]}" --raw-dir "$raw_dir"
  if [ "$musan_rirs" = true ]; then
    python -m speakerlab.datasets.musan_rirs extract "${fetch_opts[@]}" --raw-dir "$raw_dir"
  fi
fi

if stage_on 3; then
  log "stage 3: Kaldi lists and trial list -> $data"
  python -m speakerlab.datasets.cnceleb prepare --raw-dir "$raw_dir" --data "$data"
  if [ "$musan_rirs" = true ]; then
    python -m speakerlab.datasets.musan_rirs prepare --raw-dir "$raw_dir" --out "$data/musan_rirs"
  fi
fi

if stage_on 4; then
  log "stage 4: validate lists and trials, check audio, index lengths"
  python -m speakerlab.prepare --data "$data/$train_set" --data "$data/$eval_set" --jobs "$jobs"
fi

if stage_on 5; then
  log "stage 5: train $config -> $exp"
  val=${val_set:+data.val=$data/$val_set}
  train_stage data.train="$data/$train_set" $val "$aug"
fi

if stage_on 6; then
  log "stage 6: embeddings of $eval_set"
  python -m speakerlab.extract --checkpoint "${checkpoint:-$exp}" --data "$data/$eval_set" --out "$exp/embeddings/$eval_set.npz"
fi

if stage_on 7; then
  log "stage 7: score the CN-Celeb evaluation trials"
  python -m speakerlab.score --embeddings "$exp/embeddings/$eval_set.npz" --trials "$data/$eval_set/trials" \
    --out "$exp/scores/cnceleb_eval"
fi
if stage_on 8; then
  log "stage 8: average the last $average_last epoch checkpoints of $exp"
  average_stage
fi

if stage_on 9; then
  log "stage 9: large-margin fine-tuning from $exp/checkpoints/avg.pt -> ${exp}_lm"
  val=${val_set:+data.val=$data/$val_set}
  finetune_stage data.train="$data/$train_set" $val "$aug"
fi
log "done"
