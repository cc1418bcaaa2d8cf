# Stages 3 (the PLDA, the segmentation model), 4 and 5 of the diarization recipes (egs/mini_diar, egs/voxconverse,
# egs/ami), sourced after common.sh.
#   fit_plda DATA PLDA OPTS...        stage 3: speakerlab-plda on the training data dir DATA (speakers that are not
#                                     diarized later) with the model options OPTS -> the file PLDA (+ PLDA.log)
#   train_segmentation DATA           stage 3: speakerlab-segmentation-train on DATA's audio and reference RTTM
#                                     ($seg_config, $seg_opts) -> $segmentation, unless it is up to date
#   diarize_systems DATA EXP OPTS...  stage 4: speakerlab-diarize over DATA/wav.scp with the model options OPTS,
#                                     once per system, -> EXP/<system>.rttm (+ .json, .log with the timing)
#   score_systems DATA EXP            stage 5: speakerlab-der of every EXP/<system>.rttm against DATA/rttm
#                                     (DATA/uem) -> EXP/der.txt, EXP/der.json
# The recipes on a real corpus with a model brought along (egs/voxconverse, egs/ami) declare their options with
# corpus_diarization_options, check them with corpus_diarization_checks and run corpus_train_stage (stage 3) and
# corpus_diarize_stages (4-5) on their data dirs.
# The systems: estimated (speaker count estimated: spectral clustering, eigengap), estimated_ahc (AHC),
# oracle_count (DATA/reco2num_spk given), oracle_vad (the reference's speech instead of the VAD) and
# one_speaker (the baseline: every speech region of the VAD is one speaker), and vbx (VBx on EXP/plda.npz,
# started from AHC; only where the recipe's $plda file exists), and where the recipe's $segmentation model exists:
# segmentation (its local speakers per window, embedded outside overlap, spectral clustering, count estimated),
# segmentation_vbx (the same clustered by VBx on $plda) and segmentation_oracle_count. The VAD regions and
# embeddings of the VAD systems are computed once per recording and shared through EXP/cache (speakerlab-diarize
# --cache), as are the segmentation systems' windows and local-speaker embeddings.
# $vad, $diarize_opts (extra speakerlab-diarize options) and, where a recipe sets it, $max_speakers (the
# highest speaker count an estimate may reach) come from the recipe's options.

# corpus_diarization_options MAX_SPEAKERS: declare the options of stages 3-5 (--max_speakers defaults to MAX_SPEAKERS).
corpus_diarization_options() {
  opt model_opts ""                  # the model, as speakerlab-diarize takes it: "--checkpoint EXP" or
                                     # "--3dspeaker NAME --weights FILE" or "--redimnet2 FILE" (stages 4-5)
  opt exp exp/diar
  opt vad silero "silero energy"   # the voice activity detector: speakerlab-diarize --vad
  opt max_speakers "$1" count        # estimated counts stay within 1..this
  opt diarize_opts ""                # more speakerlab-diarize options, e.g. "--window 2.0 --device cuda"
  opt seed 0
  opt plda_data ""                   # stage 3: a data dir (wav.scp, utt2spk) of speakers to fit VBx's PLDA on
  opt plda_opts ""                   # more speakerlab-plda options, e.g. "--per-utterance 2"
  opt segmentation_train ""          # stage 3: train the segmentation model on this set of the corpus: "" trains none
  opt seg_config ../../conf/diarization/segmentation_cpu.yaml  # its config (segmentation_gpu.yaml: pyannote's, a GPU)
  opt seg_opts ""                    # more speakerlab-segmentation-train options, e.g. "--set steps=2400"
  opt segmentation ""                # instead: an existing segmentation model's ONNX file (from egs/mini_diar, or
                                     # another recipe's stage 3; relative to the recipe's folder): stages 4-5 use it
}

# corpus_diarization_checks: after parse_options.sh, one `error:` line and exit 2 for what stages 3-5 would refuse
# (no --model_opts; both --segmentation_train and --segmentation; a --segmentation file that is not there); with
# --segmentation_train, $segmentation becomes the model stage 3 trains. The recipe checks the set's name itself.
corpus_diarization_checks() {
  if { [ "$stop_stage" -ge 4 ] || { stage_on 3 && [ -n "$plda_data" ]; }; } && [ -z "$model_opts" ]; then
    echo "error: stages 4-5 need --model_opts, e.g. --model_opts \"--checkpoint ../voxceleb/exp/campplus\"" >&2; exit 2
  fi
  if [ -n "$segmentation_train" ]; then
    if [ -n "$segmentation" ]; then
      echo "error: --segmentation_train trains a model and --segmentation gives one: choose one" >&2; exit 2
    fi
    segmentation="$exp/segmentation/segmentation.onnx"  # the systems of the segmentation model run where it exists
  elif [ -n "$segmentation" ] && [ "$stop_stage" -ge 4 ] && [ ! -f "$segmentation" ]; then
    echo "error: --segmentation $segmentation: no such file (a segmentation model's ONNX file)" >&2; exit 2
  fi
}

# corpus_train_stage TRAIN_DIR: stage 3, the PLDA of VBx on --plda_data (when given) -> $plda, and the segmentation
# model on the data dir TRAIN_DIR (with --segmentation_train).
corpus_train_stage() {
  if [ -n "$plda_data" ]; then
    log "stage 3: the PLDA of VBx: $model_opts embeddings of $plda_data -> $plda"
    fit_plda "$plda_data" "$plda" $model_opts $plda_opts
  else
    log "stage 3: no --plda_data: no PLDA, no VBx system"
  fi
  if [ -n "$segmentation_train" ]; then
    train_segmentation "$1"
  elif [ -n "$segmentation" ]; then
    log "stage 3: the segmentation model is --segmentation $segmentation: nothing to train"
  fi
}

# corpus_diarize_stages DATA EXP: stages 4 (every system over the data dir DATA -> EXP) and 5 (their DER), those of
# --stage..--stop_stage.
corpus_diarize_stages() {
  local data="$1" exp="$2"
  if stage_on 4; then
    if [ -n "$segmentation" ] && [ ! -f "$segmentation" ]; then
      echo "error: stage 4: no segmentation model $segmentation yet: run stage 3 (--stage 3)" >&2; exit 2
    fi
    log "stage 4: diarize $data ($model_opts${segmentation:+; segmentation $segmentation}) -> $exp"
    diarize_systems "$data" "$exp" $model_opts --seed "$seed"
  fi
  if stage_on 5; then
    log "stage 5: DER against $data/rttm -> $exp/der.txt"
    score_systems "$data" "$exp"
  fi
}

fit_plda() {
  local data="$1" out="$2"; shift 2
  mkdir -p "$(dirname "$out")"
  speakerlab-plda --data "$data" "$@" --out "$out" 2> >(tee -i "$out.log" >&2)
}

# The segmentation model $segmentation is retrained only when what it was trained from changed: DATA's lists, the
# config and the options (their checksum beside it, inputs.cksum; a rewritten, unchanged list retrains nothing).
train_segmentation() {
  local train_dir="$1" seg_dir inputs
  seg_dir="$(dirname "$segmentation")"
  if [ ! -f "$train_dir/wav.scp" ] || [ ! -f "$train_dir/rttm" ]; then
    echo "error: stage 3: $train_dir has no wav.scp and rttm: run stage 1 with --segmentation_train" >&2; exit 2
  fi
  inputs="$({ cat "$train_dir/wav.scp" "$train_dir/rttm" "$seg_config"; echo "$seg_opts"; } | cksum)"
  if [ -f "$segmentation" ] && [ "$(cat "$seg_dir/inputs.cksum" 2>/dev/null)" = "$inputs" ]; then
    log "stage 3: the segmentation model $segmentation is up to date ($train_dir, $seg_config), nothing to do"
  else
    log "stage 3: train the segmentation model ($seg_config) on $train_dir -> $segmentation"
    mkdir -p "$seg_dir"
    speakerlab-segmentation-train --data "$train_dir" --out "$seg_dir" --config "$seg_config" $seg_opts \
      2> >(tee -i "$seg_dir/train.log" >&2)
    echo "$inputs" >"$seg_dir/inputs.cksum"
  fi
}

# The systems: the five, and vbx where the recipe's $plda exists.
systems() {
  echo estimated estimated_ahc oracle_count oracle_vad one_speaker
  if [ -n "${plda:-}" ] && [ -f "$plda" ]; then echo vbx; fi
  if [ -n "${segmentation:-}" ] && [ -f "$segmentation" ]; then
    echo segmentation segmentation_oracle_count
    if [ -n "${plda:-}" ] && [ -f "$plda" ]; then echo segmentation_vbx; fi
  fi
}

diarize_systems() {
  local data="$1" exp="$2" name opts; shift 2
  mkdir -p "$exp"
  for name in $(systems); do
    case "$name" in
      estimated) opts=(--vad "$vad") ;;
      estimated_ahc) opts=(--vad "$vad" --clustering ahc) ;;
      oracle_count) opts=(--vad "$vad" --reco2num-spk "$data/reco2num_spk") ;;
      oracle_vad) opts=(--vad oracle --segments "$data/rttm") ;;
      one_speaker) opts=(--vad "$vad" --num-speakers 1) ;;
      vbx) opts=(--vad "$vad" --clustering vbx --plda "$plda") ;;
      segmentation) opts=(--segmentation "$segmentation") ;;
      segmentation_oracle_count) opts=(--segmentation "$segmentation" --reco2num-spk "$data/reco2num_spk") ;;
      segmentation_vbx) opts=(--segmentation "$segmentation" --clustering vbx --plda "$plda") ;;
    esac
    # The bound is for estimated counts: the oracle counts are the reference's (speakerlab-diarize refuses one
    # outside --min-speakers..--max-speakers).
    if [ -n "${max_speakers:-}" ] && [[ "$name" != *oracle_count ]]; then opts+=(--max-speakers "$max_speakers"); fi
    log "  $name: speakerlab-diarize ${opts[*]} $diarize_opts"
    speakerlab-diarize --wav-scp "$data/wav.scp" "$@" "${opts[@]}" $diarize_opts \
      --cache "$exp/cache" --rttm "$exp/$name.rttm" --json "$exp/$name.json" 2> >(tee -i "$exp/$name.log" >&2)
  done
}

score_systems() {
  local data="$1" exp="$2" name hyps=()
  for name in $(systems); do
    hyps+=(--hyp "$name=$exp/$name.rttm")
  done
  speakerlab-der --ref "$data/rttm" --uem "$data/uem" "${hyps[@]}" --out "$exp/der.json" | tee "$exp/der.txt"
}
