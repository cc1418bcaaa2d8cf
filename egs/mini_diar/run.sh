#!/usr/bin/env bash
# egs/mini_diar: speaker diarization with the egs/mini model on synthetic conversations of the mini corpus's
# held-out test speakers (2-6 speakers, pauses, 10-15 % overlapped speech, background noise), scored by DER.
#   bash egs/mini_diar/run.sh                      # stages 1-5: corpus and model of egs/mini made when absent
#   bash egs/mini_diar/run.sh --stage 4 --vad energy --diarize_opts "--window 2.0 --hop 1.0"
# Stages (numbers as in every recipe): 1 data preparation (egs/mini's corpus if absent; the conversations of the
# test speakers, their reference RTTM, reco2num_spk, uem; the segmentation model's training conversations of the
# training speakers, $data/seg_train, and its validation conversations of the validation speakers, $data/valconv),
# 3 train (egs/mini stages 2-3 when $model has no checkpoint; the PLDA of VBx on the model's embeddings of egs/mini's
# training speakers; the segmentation model, $seg_config, -> ONNX, its validation printed every 200 steps),
# 4 diarize (egs/tools/diarization.sh: estimated count, AHC, oracle count, oracle speech, one-speaker baseline,
# VBx, and the segmentation systems; the VAD and embeddings once per recording, in $exp/cache), 5 DER of each
# (collar 0.25 and 0, overlap scored and skipped; missed overlapped speech). No stage 2: nothing to prepare.
# Every stage can be re-run. docs/diarization.md says what the figures mean.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh
. ../tools/diarization.sh
help_message="Usage: bash egs/mini_diar/run.sh [--stage N] [--stop_stage N] [--option value ...]"

opt stage 1
opt stop_stage 5
opt mini_data ../mini/data         # egs/mini's corpus: its test speakers talk (made by egs/mini stage 1 if absent)
opt model ../mini/exp/campplus_eq20 # checkpoint or exp dir (trained by egs/mini stages 2-3 if it has none)
opt corpus_opts ""                 # egs/mini's --corpus_opts when it makes the corpus
# egs/mini's config trained 20 epochs, not its 10, from the audio (--augment true): each turn of a conversation brings
# its own channel, so a random equaliser on most crops and noise on half; no speed perturbation (it makes new
# voices). On the validation conversations the segmentation system's DER went 13.40 (10 epochs) -> 10.47 (20) ->
# 8.80 % (20, augmented) (bench/RESULTS.md, "Seventh pass", "Tenth pass").
opt augment true                   # egs/mini's --augment when it trains the model
opt train_overrides "train.epochs=20 augment.eq_prob=0.8 augment.prob=0.5 augment.speed_prob=0"  # egs/mini's, as above
opt data data                      # the conversations go to $data/conv
opt exp exp/diar
opt num_conversations 20
opt overlap 0.5                    # chance a turn starts before the last ends: 0.5 gives 10-15 % overlapped speech
opt conv_opts ""                   # more speakerlab-synth-conversations options, e.g. "--snr 0:10"
opt segmenter true                 # train the segmentation model (stage 3) and diarize with it too (stage 4)
opt seg_conversations 400          # the segmentation model's training conversations (training speakers; 10.3 h)
opt val_conversations 30           # conversations of $mini_data/val's speakers: the model's validation (stage 3 prints it)
opt seg_conv_opts "--overlap 0.6 --min-speakers 1 --max-speakers 6"
opt seg_config ../../conf/diarization/segmentation_cpu.yaml  # segmentation_gpu.yaml: pyannote's sizes, a GPU
opt seg_opts ""                    # more speakerlab-segmentation-train options, e.g. "--set steps=200"
opt vad silero "silero energy"   # the voice activity detector: speakerlab-diarize --vad
opt diarize_opts ""                # more speakerlab-diarize options, e.g. "--window 2.0 --hop 1.0"
opt seed 0
opt plda_opts ""                   # more speakerlab-plda options, e.g. "--per-utterance 5"

. ../tools/parse_options.sh
export SPEAKERLAB_REQUIREMENTS="${SPEAKERLAB_REQUIREMENTS:-egs/tools/requirements-diarization.txt}"
. ../tools/env.sh
plda="$exp/plda.npz"
segmentation=""  # egs/tools/diarization.sh runs the segmentation systems where this file exists
if [ "$segmenter" = true ]; then segmentation="$exp/segmentation/segmentation.onnx"; fi
# egs/mini/run.sh works in its own folder: it gets absolute paths.
mini=(bash ../mini/run.sh --data "$(realpath -m "$mini_data")" --corpus_opts "$corpus_opts" --augment "$augment"
  --train_overrides "$train_overrides")

if stage_on 1; then
  log "stage 1: data preparation: $num_conversations conversations of $mini_data/test's speakers -> $data/conv"
  [ -f "$mini_data/test/wav.scp" ] || "${mini[@]}" --stage 1 --stop_stage 1
  speakerlab-synth-conversations --data "$mini_data/test" --out "$data/conv" --noise "$mini_data/musan/noise" \
    --num-conversations "$num_conversations" --seed "$seed" --overlap "$overlap" $conv_opts
  if [ -n "$segmentation" ]; then
    log "stage 1: $seg_conversations training conversations of $mini_data/train's speakers -> $data/seg_train"
    speakerlab-synth-conversations --data "$mini_data/train" --out "$data/seg_train" --noise "$mini_data/musan/noise" \
      --num-conversations "$seg_conversations" --seed "$((seed + 1))" $seg_conv_opts
    log "stage 1: $val_conversations validation conversations of $mini_data/val's speakers -> $data/valconv"
    speakerlab-synth-conversations --data "$mini_data/val" --out "$data/valconv" --noise "$mini_data/musan/noise" \
      --num-conversations "$val_conversations" --seed "$((seed + 100))" --overlap "$overlap" $conv_opts
  fi
fi

if stage_on 3; then
  if ls "$model"/checkpoints/*.pt >/dev/null 2>&1 || [ -f "$model" ]; then
    log "stage 3: train: $model has a checkpoint, nothing to do"
  else
    log "stage 3: train the egs/mini model (its stages 2-3) -> $model"
    "${mini[@]}" --stage 2 --stop_stage 3 --exp "$(realpath -m "$model")"
  fi
  log "stage 3: the PLDA of VBx: $model's embeddings of $mini_data/train -> $plda"
  fit_plda "$mini_data/train" "$plda" --checkpoint "$model" $plda_opts
  if [ -z "$segmentation" ]; then
    log "stage 3: train: no segmentation model (--segmenter false)"
  elif [ -f "$segmentation" ]; then
    log "stage 3: train: $segmentation exists, nothing to do"
  else
    log "stage 3: train the segmentation model ($seg_config) on $data/seg_train -> $segmentation"
    speakerlab-segmentation-train --data "$data/seg_train" --out "$(dirname "$segmentation")" --config "$seg_config" \
      --set val_data="$data/valconv" $seg_opts 2> >(tee -i "$exp/segmentation_train.log" >&2)
  fi
fi

if stage_on 4; then
  log "stage 4: diarize $data/conv with $model -> $exp"
  diarize_systems "$data/conv" "$exp" --checkpoint "$model" --seed "$seed"
fi

if stage_on 5; then
  log "stage 5: DER against $data/conv/rttm -> $exp/der.txt"
  score_systems "$data/conv" "$exp"
fi
log "done"
