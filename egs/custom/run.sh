#!/usr/bin/env bash
# egs/custom: your own recordings -> a speaker-embedding model fine-tuned on your speakers, with its EER on
# held-out speakers next to the EER of the model you started from (docs/custom_data.md).
#   bash egs/custom/run.sh --root /data/voices --init egs/mini/exp/campplus     # ours: an exp dir or checkpoint
#   bash egs/custom/run.sh --csv list.csv --3dspeaker campplus --weights campplus_cn_common.bin
#   bash egs/custom/run.sh --root /data/voices --init b2-vox2-ptn.pt \
#     --train_overrides data.feats=false    # a ReDimNet2 release: its own log-mel, computed from the audio
#   bash egs/custom/run.sh --root /data/voices                                  # no --init: from scratch
# Stages (the same numbers in every recipe): 1 data preparation (speakerlab-folder: every
# file checked, $data/report.txt; speaker-disjoint train/ and test/, test/trials), 2 features (validate lists,
# index lengths, fbank stores), 3 fine-tune from the pretrained model (from scratch without one), 4 embeddings of
# test/ with the trained model and with the pretrained one, 5 scoring (`EER: x%` of both); optional: 6 average
# the last checkpoints, 7 large-margin fine-tuning, then stages 4-5 with --exp ${exp}_lm.
# Before stage 1 (when stage 3 is to run) a pre-flight `speakerlab-train --check` stops what stage 3 would refuse.
# Every stage can be re-run; training resumes from its latest checkpoint.
set -euo pipefail
caller="$PWD"   # your input paths (--root, --csv, --init, --weights) are relative to where you run this
cd "$(dirname "$0")"
. ../tools/common.sh
help_message="Usage: bash egs/custom/run.sh (--root DIR | --csv FILE) [--init MODEL | --3dspeaker NAME --weights FILE] [--option value ...]"

opt stage 1
opt stop_stage 5
opt root ""                        # stage 1: folder tree <root>/<speaker>/**/<audio file>
opt csv ""                         # stage 1: or a CSV/TSV of path,speaker[,session]
opt data data/custom               # train/, test/, report.txt, sources.csv, audio/ (relative: under egs/custom)
opt prepare_opts ""                # e.g. "--test-speakers 40 --trials 40000 --min-seconds 2 --folder-sessions"
opt init ""                        # pretrained model: a speakerlab exp dir or checkpoint, a ReDimNet2 release file
opt threedspeaker ""               # --3dspeaker NAME: a 3D-Speaker state dict (--weights) of registered model NAME
opt weights ""                     # the 3D-Speaker state dict file of --3dspeaker
opt config ../../conf/custom/finetune.yaml
opt scratch_config ../../conf/custom/scratch.yaml   # added to --config when there is no pretrained model
opt exp ""                         # default exp/finetune (exp/scratch without a pretrained model)
opt hardware cpu                   # profile in conf/hardware/ (GPUs: auto, a100-80g, ...)
opt checkpoint ""                  # stage 4 model ("" = the latest checkpoint of $exp)
opt average_last 3                 # stage 6: epoch checkpoints averaged
opt lm_config ../../conf/custom/finetune_lm.yaml   # stage 7 overlay
opt jobs 4                         # processes reading the audio (stage 1), index threads (stage 2)
launch_options none                # --gpus (none: the CPU; GPUs: --gpus all --hardware auto) --nproc --nnodes ...
opt train_overrides ""             # e.g. "train.epochs=10 optim.backbone_lr_scale=0.1" (+ speakerlab-train flags)
opt lm_overrides ""                # stage 7: overrides on top of train_overrides, e.g. "train.epochs=1"

# --3dspeaker, as the inference commands spell it (a shell variable cannot start with a digit).
args=()
for a in "$@"; do
  case "$a" in
    --3dspeaker) a=--threedspeaker ;;
    --3dspeaker=*) a="--threedspeaker=${a#--3dspeaker=}" ;;
  esac
  args+=("$a")
done
set -- ${args[@]+"${args[@]}"}
. ../tools/parse_options.sh
for v in root csv init weights; do   # data/ and exp/ are relative to egs/custom/, as in every recipe
  case "${!v}" in ""|/*) ;; *) printf -v "$v" '%s' "$caller/${!v}" ;; esac
done

bad() { echo "error: $*" >&2; exit 2; }
[ -z "$threedspeaker" ] || [ -n "$weights" ] || bad "--3dspeaker $threedspeaker needs --weights FILE"
[ -z "$weights" ] || [ -n "$threedspeaker" ] || bad "--weights goes with --3dspeaker NAME"
[ -z "$init" ] || [ -z "$threedspeaker" ] || bad "give one pretrained model: --init or --3dspeaker NAME --weights FILE"
if stage_on 1; then
  [ -n "$root$csv" ] || bad "stage 1 needs --root DIR (one folder per speaker) or --csv FILE"
  [ -z "$root" ] || [ -z "$csv" ] || bad "give one of --root and --csv"
fi
. ../tools/env.sh
# The pretrained model as training settings; without one, the from-scratch overlay and its own exp dir.
# Arrays: a path with spaces stays one argument.
configs=(--config "$config")
settings=("data.train=$data/train")
if [ -n "$init" ]; then
  settings+=("train.init=$init")
elif [ -n "$threedspeaker" ]; then
  settings+=("train.init=$weights" "train.init_3dspeaker=$threedspeaker")
else
  configs+=(--config "$scratch_config")
fi
what="fine-tuned from ${init:-$weights}"
[ -n "$init$threedspeaker" ] || what="trained from scratch"
[ -n "$exp" ] || { exp=exp/finetune; [ -n "$init$threedspeaker" ] || exp=exp/scratch; }
store_opts="hardware.num_workers=0"   # crops come from the fbank store: a loader worker only competes
# --train_overrides: its `key=value` settings go to every command that reads the config, the rest (flags of
# speakerlab-train such as --force-new-schedule, in any order) to speakerlab-train alone.
settings_only=()
for w in $train_overrides; do case "$w" in --*) ;; *=*) settings_only+=("$w") ;; esac; done

preflight "${configs[@]}" --exp-dir "$exp" --hardware "$hardware" "${settings[@]}" $store_opts $train_overrides

if stage_on 1; then
  log "stage 1: data preparation: ${root:-$csv} -> $data/{train,test} (report: $data/report.txt)"
  speakerlab-folder ${root:+--root "$root"} ${csv:+--csv "$csv"} --data "$data" \
    --jobs "$jobs" $prepare_opts
fi

if stage_on 2; then
  log "stage 2: features: validate lists and trials, index lengths; fbank stores of train and test"
  speakerlab-prepare --data "$data/train" --data "$data/test" --jobs "$jobs"
  speakerlab-feature-store "${configs[@]}" --data "$data/train" --data "$data/test" "${settings[@]}" \
    ${settings_only[@]+"${settings_only[@]}"}
fi

if stage_on 3; then
  log "stage 3: $exp: $what"
  launch speakerlab-train "${configs[@]}" --exp-dir "$exp" --hardware "$hardware" "${settings[@]}" $store_opts \
    $train_overrides
fi

if stage_on 4; then
  log "stage 4: embeddings of $data/test (and with the pretrained model, $exp/pretrained.pt)"
  speakerlab-extract --checkpoint "${checkpoint:-$exp}" --data "$data/test" --out "$exp/embeddings/test.npz"
  if [ -f "$exp/pretrained.pt" ]; then
    speakerlab-extract --checkpoint "$exp/pretrained.pt" --data "$data/test" \
      --out "$exp/embeddings/test_pretrained.npz"
  fi
fi

eer() {  # the EER of a scoring's JSON, as `EER: x.xx%`
  python -c 'import json, sys; print("EER: %.2f%%" % (100 * json.load(open(sys.argv[1]))["eer"]))' "$1"
}

if stage_on 5; then
  log "stage 5: score $data/test/trials (the trained model, then the pretrained one)"
  speakerlab-score --embeddings "$exp/embeddings/test.npz" --trials "$data/test/trials" \
    --out "$exp/scores/test"
  have_pretrained=false
  if [ -f "$exp/embeddings/test_pretrained.npz" ]; then
    have_pretrained=true
    speakerlab-score --embeddings "$exp/embeddings/test_pretrained.npz" --trials "$data/test/trials" \
      --out "$exp/scores/test_pretrained"
  fi
  echo "$(eer "$exp/scores/test.json") $what ($exp, ${checkpoint:-its latest checkpoint}) on $data/test/trials"
  if [ "$have_pretrained" = true ]; then
    echo "$(eer "$exp/scores/test_pretrained.json") before fine-tuning ($exp/pretrained.pt) on $data/test/trials"
  fi
fi

if stage_on 6; then
  log "stage 6: average the last $average_last epoch checkpoints of $exp"
  speakerlab-average --exp-dir "$exp" --last "$average_last"
fi

if stage_on 7; then
  log "stage 7: large-margin fine-tuning from $exp/checkpoints/avg.pt -> ${exp}_lm"
  launch speakerlab-train "${configs[@]}" --config "$lm_config" --exp-dir "${exp}_lm" --hardware "$hardware" \
    data.train="$data/train" train.init="$exp/checkpoints/avg.pt" $store_opts $train_overrides $lm_overrides
fi
log "done"
