#!/usr/bin/env bash
# egs/ami: speaker diarization of the AMI meeting corpus (scenario and non-scenario meetings of 3-5 speakers) with a
# trained model, scored by DER on the AMI-diarization-setup protocol (its meeting lists, words-only reference RTTMs
# and UEMs). Nothing is downloaded: bring the AMI audio (the amicorpus folder of the AMI download page; the
# headset mix, or the first channel of the first array for SDM) and a checkout of the setup
# (git clone https://github.com/BUTSpeechFIT/AMI-diarization-setup). The speaker model is not trained here: bring
# one trained on VoxCeleb (egs/voxceleb) or a published one.
#   bash egs/ami/run.sh --ami_root /corpora/amicorpus --setup /corpora/AMI-diarization-setup \
#     --model_opts "--checkpoint ../voxceleb/exp/campplus"                         # SDM, test
#   bash egs/ami/run.sh --ami_root ... --setup ... --model_opts "..." --condition headset --subset "dev test"
#   bash egs/ami/run.sh --ami_root ... --setup ... --model_opts "..." --segmentation_train train
# Stages (numbers as in every recipe): 1 data preparation (speakerlab-ami prepare: data dirs
# ami_<condition>_<subset> with wav.scp, rttm, reco2num_spk, uem; of --subset and --segmentation_train),
# 3 train: the PLDA of VBx (only with --plda_data: a data dir of training speakers, e.g. ../voxceleb/data/vox1_dev)
# and, with --segmentation_train train, the segmentation model on the train list's audio and reference RTTM
# ($seg_config -> $exp/segmentation/segmentation.onnx; retrained only when its data, config or options change),
# 4 diarize (egs/tools/diarization.sh: estimated count, AHC, oracle count, oracle speech, one-speaker baseline, VBx
# when the PLDA exists, and the segmentation systems when a segmentation model is trained or given; the VAD and
# embeddings once per meeting, in $exp/<condition>_<subset>/cache), 5 DER of each (collar 0.25 and 0, overlap scored
# and skipped, in der.txt; the AMI convention, collar 0 with overlap scored, printed again). Every stage can be re-run.
set -euo pipefail
cd "$(dirname "$0")"
. ../tools/common.sh
. ../tools/diarization.sh
help_message="Usage: bash egs/ami/run.sh --ami_root DIR --setup DIR --model_opts \"--checkpoint EXP\" [--opt value]..."

opt stage 1
opt stop_stage 5
opt data data                      # data dirs ami_<condition>_<subset>
opt ami_root ""                    # the amicorpus folder (<meeting>/audio/<meeting>.*.wav), or the folder holding it
opt setup ""                       # a checkout of AMI-diarization-setup (lists/, only_words/rttms/, uems/)
opt subset test                    # dev | test | "dev test": which lists to prepare and diarize
opt condition sdm                  # sdm: <meeting>.Array1-01.wav, one distant microphone (the condition of the
                                   # published figures in docs/diarization.md) | headset: <meeting>.Mix-Headset.wav
opt annotations only_words         # the setup's reference: only_words (the usual one) | word_and_vocalsounds
corpus_diarization_options 8       # egs/tools/diarization.sh: --model_opts, --max_speakers, --segmentation_train
                                   # (train), --segmentation ... --max_speakers 8: every meeting of the setup's lists
                                   # has 3 to 5 speakers; VoxConverse's 25 would let the eigengap split a meeting
                                   # into many small clusters, 8 still lets an estimate overshoot 5 and show it

. ../tools/parse_options.sh
corpus_diarization_checks
if stage_on 1 && { [ -z "$ami_root" ] || [ -z "$setup" ]; }; then
  echo "error: stage 1 needs --ami_root (the amicorpus folder) and --setup (a checkout of AMI-diarization-setup)" >&2
  exit 2
fi
for set in $subset; do
  [[ "$set" =~ ^(dev|test)$ ]] || { echo "error: --subset must be dev, test or both, got '$subset'" >&2; exit 2; }
done
if [[ ! "$condition" =~ ^(sdm|headset)$ ]]; then
  echo "error: --condition must be sdm or headset, got '$condition'" >&2; exit 2
fi
if [ -n "$segmentation_train" ] && [ "$segmentation_train" != train ]; then  # dev and test are scored: not trained on
  echo "error: --segmentation_train must be train (the setup's training list), got '$segmentation_train'" >&2; exit 2
fi
export SPEAKERLAB_REQUIREMENTS="${SPEAKERLAB_REQUIREMENTS:-egs/tools/requirements-diarization.txt}"
. ../tools/env.sh
plda="$exp/plda.npz"

if stage_on 1; then
  log "stage 1: data preparation: AMI $subset $segmentation_train ($condition, $annotations) -> $data"
  speakerlab-ami prepare --ami-root "$ami_root" --setup "$setup" --data "$data" --subsets $subset $segmentation_train \
    --condition "$condition" --annotations "$annotations"
fi

if stage_on 3; then corpus_train_stage "$data/ami_${condition}_$segmentation_train"; fi

for set in $subset; do
  dir="$data/ami_${condition}_$set" out="$exp/${condition}_$set"
  corpus_diarize_stages "$dir" "$out"
  if stage_on 5; then  # AMI figures are published at collar 0 with overlapped speech scored (pyannote, DiariZen)
    log "stage 5: AMI $condition $set, collar 0, overlap scored (every condition: $out/der.txt)"
    awk 'NR == 1 || ($2 == "0.00" && $3 == "scored")' "$out/der.txt"
  fi
done
log "done"
