#!/usr/bin/env bash
# egs/custom: your own recordings -> a speaker-embedding model fine-tuned on your speakers, with its EER on
# held-out speakers next to the EER of the model you started from (docs/custom_data.md).
#   bash egs/custom/run.sh --root /data/voices --init egs/mini/exp/campplus     # ours: an exp dir or checkpoint
#   bash egs/custom/run.sh --csv list.csv --3dspeaker campplus --weights campplus_cn_common.bin
#   bash egs/custom/run.sh --root /data/voices --init b2-vox2-ptn.pt   # a ReDimNet2 release: its log-mel, from the audio
#   bash egs/custom/run.sh --root /data/voices                                  # no --init: from scratch
# Stages (the same numbers in every recipe): 1 data preparation (speakerlab-folder: every
# file checked, $data/report.txt; speaker-disjoint train/, val/ and test/, val/trials and test/trials), 2 features
# (validate lists, index lengths, fbank stores), 3 fine-tune from the pretrained model (from scratch without one;
# epochs, patience and frozen start scaled to the data; the best epoch on val/ kept, early stop on a plateau),
# 4 embeddings of test/ with the run's result and with the pretrained model, 5 scoring (both EERs with their
# confidence intervals, trial and speaker counts); optional: 9 stress table (speakerlab-stress), 6 average the last checkpoints, 7 large-margin
# fine-tuning, then stages 4-5 with --exp ${exp}_lm.
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
opt prepare_opts ""                # e.g. "--test-speakers 40 --val-speakers 20 --trials 40000 --folder-sessions"
opt init ""                        # pretrained model: a speakerlab exp dir or checkpoint, a ReDimNet2 release file
opt threedspeaker ""               # --3dspeaker NAME: a 3D-Speaker state dict (--weights) of registered model NAME
opt weights ""                     # the 3D-Speaker state dict file of --3dspeaker
opt config ../../conf/custom/finetune.yaml
opt scratch_config ../../conf/custom/scratch.yaml   # added to --config when there is no pretrained model
opt exp ""                         # default exp/finetune (exp/scratch without a pretrained model)
opt hardware cpu                   # profile in conf/hardware/ (GPUs: auto, a100-80g, ...)
opt scale true                     # stage 3: epochs, patience, frozen start scaled to the data (train/scaled.py)
opt checkpoint ""                  # stage 4 model ("" = the run's result: checkpoints/best.pt, else the latest)
opt average_last 3                 # stage 6: epoch checkpoints averaged
opt lm_config ../../conf/custom/finetune_lm.yaml   # stage 7 overlay
opt jobs 4 count                   # processes reading the audio (stage 1), index threads (stage 2)
launch_options none                # --gpus (none: the CPU; GPUs: --gpus all --hardware auto) --nproc --nnodes ...
calibration_options                # --cal_set (stage 8: held-out data dir with trials) --p_target
opt train_overrides ""             # e.g. "train.epochs=10 optim.backbone_lr_scale=0.1" (+ speakerlab-train flags)
opt lm_overrides ""                # stage 7: overrides on top of train_overrides, e.g. "train.epochs=1"
opt stress_opts ""                # stage 9: more speakerlab-stress options, e.g. "--both-sides"

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
  log "stage 1: data preparation: ${root:-$csv} -> $data/{train,val,test} (report: $data/report.txt)"
  speakerlab-folder ${root:+--root "$root"} ${csv:+--csv "$csv"} --data "$data" \
    --jobs "$jobs" $prepare_opts
fi

# The validation split (model selection while training) when stage 1 made one (not for a handful of speakers).
sets=(--data "$data/train" --data "$data/test")
val=()
if [ -f "$data/val/trials" ]; then
  val=("data.val=$data/val")
  settings+=("${val[@]}")
  sets+=(--data "$data/val")
fi

if stage_on 2; then
  log "stage 2: features: validate lists and trials, index lengths; fbank stores of train, test${val[*]:+ and val}"
  speakerlab-prepare "${sets[@]}" --jobs "$jobs"
  speakerlab-feature-store "${configs[@]}" "${sets[@]}" "${settings[@]}" ${settings_only[@]+"${settings_only[@]}"}
fi

if stage_on 3; then
  log "stage 3: $exp: $what"
  scaled=()
  if [ "$scale" = true ]; then
    text="$(python -m speakerlab.train.scaled --data "$data/train" "${configs[@]}" "${settings[@]}" \
      ${settings_only[@]+"${settings_only[@]}"})"
    [ -z "$text" ] || mapfile -t scaled <<< "$text"   # one override a line (a freeze rule holds spaces)
  fi
  launch speakerlab-train "${configs[@]}" --exp-dir "$exp" --hardware "$hardware" "${settings[@]}" \
    ${scaled[@]+"${scaled[@]}"} $store_opts $train_overrides
fi

if stage_on 4; then
  log "stage 4: embeddings of $data/test (and with the pretrained model, $exp/pretrained.pt)"
  # The file the model stands for (the run's result: best.pt, else the newest intact checkpoint), kept beside
  # the embeddings so that stage 5 names it. (`python -m` for speakerlab-which and speakerlab-scaled: they run
  # in an environment installed before these commands existed.)
  which="$(python -m speakerlab.inference.which "${checkpoint:-$exp}")"
  speakerlab-extract --checkpoint "${which%%$'\t'*}" --data "$data/test" --out "$exp/embeddings/test.npz"
  printf '%s\n' "$which" > "$exp/embeddings/test.model"
  if [ -f "$exp/pretrained.pt" ]; then
    speakerlab-extract --checkpoint "$exp/pretrained.pt" --data "$data/test" \
      --out "$exp/embeddings/test_pretrained.npz"
  fi
fi

init_of() {  # a run's config.yaml -> its train.init ("" for a run from scratch)
  python -c 'import sys, yaml
print(((yaml.safe_load(open(sys.argv[1])) or {}).get("train") or {}).get("init") or "")' "$1"
}

result() {  # JSON LABEL: `EER: x.xx% (95% CI a-b%) LABEL on <trials>, N trials (T target, M nontarget, S speakers)`
  python -c 'import json, sys
from speakerlab.scoring.report import counts_text, eer_text
s = json.load(open(sys.argv[1]))
print(f"EER: {eer_text(s)} {sys.argv[2]} on {sys.argv[3]}, {counts_text(s)}")' "$1" "$2" "$data/test/trials"
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
  # What the exp dir's own run was (its config.yaml): stage 7's is fine-tuned whatever this command's --init.
  if [ -f "$exp/config.yaml" ]; then
    from="$(init_of "$exp/config.yaml")"
    what="fine-tuned from $from"
    [ -n "$from" ] || what="trained from scratch"
  fi
  which="${checkpoint:-$exp}"
  [ ! -f "$exp/embeddings/test.model" ] || which="$(cat "$exp/embeddings/test.model")"
  model="${which%%$'\t'*}"
  [ "$model" = "$which" ] || model="$model: ${which#*$'\t'}"
  result "$exp/scores/test.json" "$what ($model)"
  if [ "$have_pretrained" = true ]; then
    result "$exp/scores/test_pretrained.json" "before fine-tuning ($exp/pretrained.pt)"
  fi
fi

if stage_on 6; then
  log "stage 6: average the last $average_last epoch checkpoints of $exp"
  speakerlab-average --exp-dir "$exp" --last "$average_last"
fi

if stage_on 7; then
  log "stage 7: large-margin fine-tuning from $exp/checkpoints/avg.pt -> ${exp}_lm"
  launch speakerlab-train "${configs[@]}" --config "$lm_config" --exp-dir "${exp}_lm" --hardware "$hardware" \
    data.train="$data/train" ${val[@]+"${val[@]}"} train.init="$exp/checkpoints/avg.pt" $store_opts \
    $train_overrides $lm_overrides
fi
if stage_on 8; then
  calibration_stage "$exp" "${checkpoint:-$exp}" "${cal_set:-$data/val}" "$data/test" "$data/test/trials"
fi

if stage_on 9; then  # the first trial list, every condition on its test side
  which="$(python -m speakerlab.inference.which "${checkpoint:-$exp}")"   # the run's result, as stage 4
  stress_stage "${which%%$'\t'*}" "$data/test" "$data/test/trials" test "$exp"
fi
log "done"
