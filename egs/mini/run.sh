#!/usr/bin/env bash
# egs/mini: the whole speaker-verification recipe on a synthetic corpus, CPU-only, in minutes.
#   bash egs/mini/run.sh                       # stages 1-5
#   bash egs/mini/run.sh --stage 3 --stop_stage 3 --train_overrides "train.epochs=2"
# Stages (the same numbers in every recipe): 1 data preparation (synthetic corpus, MUSAN/RIR lists),
# 2 features (validate lists, check audio, index lengths; the fbank store of every set, which
# training, validation and extraction read instead of decoding audio), 3 train, 4 embeddings, 5 scoring (and the
# no-training baseline); optional: 6 average the last checkpoints, 7 large-margin fine-tuning, then
#   bash egs/mini/run.sh --stage 4 --stop_stage 5 --exp exp/campplus_lm
# 8 calibration (fitted on val/trials, measured on test/trials: $exp/calibration.json) and 9 the stress table
# (speakerlab-stress; also after the default pass with --stress true).
# Every stage can be re-run; training resumes from its latest checkpoint.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh
help_message="Usage: bash egs/mini/run.sh [--stage N] [--stop_stage N] [--option value ...]"

opt stage 1
opt stop_stage 5
opt data data                      # corpus and Kaldi data dirs
opt exp ""                         # default exp/campplus (exp/campplus_augment with --augment true)
opt config ../../conf/mini/campplus.yaml
opt hardware cpu                   # profile in conf/hardware/
opt checkpoint ""                  # stage 4 model ("" = the latest checkpoint of $exp)
opt average_last 3                 # stage 6: epoch checkpoints averaged
opt lm_config ../../conf/mini/finetune_lm.yaml
opt lm_overrides ""                # stage 7: overrides on top of train_overrides, e.g. "train.epochs=1"
opt corpus_opts ""                 # extra generator options, e.g. "--num-train-speakers 50"
opt augment false                  # true: train from audio with speed perturbation, reverb, noise ...
opt augment_config ../../conf/mini/augment.yaml  # ... as this overlay of $config says
opt seed 1234
opt jobs 2 count                   # corpus generation processes
opt shards false                   # stage 2 also writes tar shards of the training set; stages 3, 7 stream them
launch_options none                # --gpus (none: the CPU profile) --nproc --nnodes --node_rank --master_addr --master_port
calibration_options                # --cal_set (stage 8: held-out data dir with trials) --p_target
opt train_overrides ""             # e.g. "train.epochs=2 optim.lr=0.2"
opt stress false                  # true: also stage 9, the stress table, after the stages asked for
# Stage 9 here: one condition per family (short, channel, codec, noise, room) on a seeded draw of 200 of the 596
# test utterances (2,700 of the 8,100 trials), to fit egs/mini's 2-minute budget; --stress_opts "" is the full table.
opt stress_opts "--conditions clean trunc1 trunc2 tel gsm mp3 noise5 reverb --test-utts 200"

. ../tools/parse_options.sh
. ../tools/env.sh
[ -n "$exp" ] || { exp=exp/campplus; [ "$augment" = false ] || exp=exp/campplus_augment; }

train_data="data.train=$data/train data.val=$data/val"   # stages 3 and 7
# Stored fbank needs no loader worker: on a small CPU one only competes with training (6% slower).
store_opts="hardware.num_workers=0"
# Shards hold audio: training from them reads no fbank store.
[ "$shards" = true ] && { train_data="$train_data data.shards=$data/train/shards data.feats=false"; store_opts=""; }

stage3=(--config "$config"); [ "$augment" = false ] || stage3+=(--config "$augment_config" "augment.lists=$data/musan_rirs")
preflight "${stage3[@]}" --exp-dir "$exp" --hardware "$hardware" $train_data $train_overrides

if stage_on 1; then
  log "stage 1: data preparation: synthetic corpus and its MUSAN/RIR lists -> $data"
  speakerlab-synth --out "$data" --seed "$seed" --jobs "$jobs" $corpus_opts
  # The corpus has MUSAN/RIRS_NOISES-shaped noise (fewer files than the real sets: count warnings are
  # expected). Training augments with them only when asked: --augment true.
  speakerlab-musan-rirs prepare --raw-dir "$data" --out "$data/musan_rirs"
fi

if stage_on 2; then
  log "stage 2: features: validate lists, check audio, index lengths; fbank stores; the int16 noise/RIR bank"
  speakerlab-prepare --data "$data/train" --data "$data/val" --data "$data/test"
  # Kaldi feats.ark/scp with $config's fbank: training without augmentation (data.feats) crops frames
  # from it, validation and stage 4 embed from it (a config whose fbank differs recomputes from audio).
  speakerlab-feature-store --config "$config" --data "$data/train" --data "$data/val" --data "$data/test"
  speakerlab-noise-bank --lists "$data/musan_rirs"  # read once; augmenting training memory-maps it
  if [ "$shards" = true ]; then   # WebDataset tar shards (speakerlab.dataio.loaders.shards): for data on network storage
    speakerlab-shards --data "$data/train" --out "$data/train/shards"
  fi
fi

if stage_on 3; then
  log "stage 3: train $config -> $exp (augment: $augment)"
  if [ "$augment" = true ]; then
    launch speakerlab-train --config "$config" --config "$augment_config" --exp-dir "$exp" --hardware "$hardware" \
      $train_data augment.lists="$data/musan_rirs" $train_overrides
  else
    launch speakerlab-train --config "$config" --exp-dir "$exp" --hardware "$hardware" $train_data $store_opts \
      $train_overrides
  fi
fi

if stage_on 4; then
  log "stage 4: embeddings of $data/test"
  speakerlab-extract --checkpoint "${checkpoint:-$exp}" --data "$data/test" --out "$exp/embeddings/test.npz"
fi

if stage_on 5; then
  log "stage 5: score the test trials; then the no-training baseline (cosine of mean log-mel)"
  speakerlab-score --embeddings "$exp/embeddings/test.npz" --trials "$data/test/trials" \
    --out "$exp/scores/test"
  speakerlab-baseline --data "$data/test" --out "$exp/scores/test_baseline"
fi

if stage_on 6; then
  log "stage 6: average the last $average_last epoch checkpoints of $exp"
  speakerlab-average --exp-dir "$exp" --last "$average_last"
fi

if stage_on 7; then
  log "stage 7: large-margin fine-tuning from $exp/checkpoints/avg.pt -> ${exp}_lm"
  launch speakerlab-train --config "$config" --config "$lm_config" --exp-dir "${exp}_lm" --hardware "$hardware" \
    train.init="$exp/checkpoints/avg.pt" $train_data $store_opts $train_overrides $lm_overrides
fi
if stage_on 8; then
  calibration_stage "$exp" "${checkpoint:-$exp}" "${cal_set:-$data/val}" "$data/test" "$data/test/trials"
fi

if stage_on 9 || [ "$stress" = true ]; then  # the first trial list, every condition on its test side
  stress_stage "${checkpoint:-$exp}" "$data/test" "$data/test/trials" test "$exp" "$data/musan_rirs/bank" \
    "$exp/embeddings/test.npz"
fi
log "done"
