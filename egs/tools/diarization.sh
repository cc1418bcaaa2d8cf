# Stages 3 (the PLDA), 4 and 5 of the diarization recipes (egs/mini_diar, egs/voxconverse), sourced after
# common.sh.
#   fit_plda DATA PLDA OPTS...        stage 3: speakerlab-plda on the training data dir DATA (speakers that are not
#                                     diarized later) with the model options OPTS -> the file PLDA (+ PLDA.log)
#   diarize_systems DATA EXP OPTS...  stage 4: speakerlab-diarize over DATA/wav.scp with the model options OPTS,
#                                     once per system, -> EXP/<system>.rttm (+ .json, .log with the timing)
#   score_systems DATA EXP            stage 5: speakerlab-der of every EXP/<system>.rttm against DATA/rttm
#                                     (DATA/uem) -> EXP/der.txt, EXP/der.json
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
fit_plda() {
  local data="$1" out="$2"; shift 2
  mkdir -p "$(dirname "$out")"
  speakerlab-plda --data "$data" "$@" --out "$out" 2> >(tee "$out.log" >&2)
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
    if [ -n "${max_speakers:-}" ]; then opts+=(--max-speakers "$max_speakers"); fi
    log "  $name: speakerlab-diarize ${opts[*]} $diarize_opts"
    speakerlab-diarize --wav-scp "$data/wav.scp" "$@" "${opts[@]}" $diarize_opts \
      --cache "$exp/cache" --rttm "$exp/$name.rttm" --json "$exp/$name.json" 2> >(tee "$exp/$name.log" >&2)
  done
}

score_systems() {
  local data="$1" exp="$2" name hyps=()
  for name in $(systems); do
    hyps+=(--hyp "$name=$exp/$name.rttm")
  done
  speakerlab-der --ref "$data/rttm" --uem "$data/uem" "${hyps[@]}" --out "$exp/der.json" | tee "$exp/der.txt"
}
