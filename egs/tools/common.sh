# Sourced first by every egs/*/run.sh: logging, option declaration, stage selection, and `launch`,
# the one helper a stage calls instead of `python -m` (training: one process or torchrun).
#
# Every recipe has the same stages:
#   1 data preparation (download, extract, convert, Kaldi lists and trials, MUSAN/RIR lists)
#   2 features (validate lists, check audio, index lengths)
#   3 training
#   4 embeddings
#   5 scoring of every trial list
#   6 checkpoint averaging
#   7 large-margin fine-tuning (then stages 4-5 with --exp ${exp}_lm)
#   8 calibration (`calibration_stage`): LLRs and operating points fitted on a held-out set, into the exp dir
#   9 stress table: EER / minDCF under short, telephone, codec, noisy and reverberant test audio (stress_stage)
#   10 pseudo-label rounds (pseudo_label_rounds, below)
LAST_STAGE=10

log() { echo "[$(date '+%Y-%m-%d %H:%M:%S')] $*" >&2; }

# opt NAME DEFAULT [RULE]: declare the recipe option --NAME (shell variable NAME) with its default and, where given,
# the rule of its values: several words are its choices; one word names a rule of _RULES (count, clusters, share);
# an option whose default is true or false takes only those. Only declared options are accepted by
# parse_options.sh, and a value that breaks its option's rule is an error there, before any stage: a typo like
# `--segmenter flase` no longer means false, a `--rounds 0` no longer runs nothing and says done.
_options=()
declare -A _option_rules=() _option_rule_texts=()
declare -A _RULES=([count]='^[1-9][0-9]*$' [clusters]='^(estimate|[2-9]|[1-9][0-9]+)$' [share]='^(0|0?\.[0-9]+)$')
declare -A _RULE_TEXTS=([count]="a whole number >= 1" [clusters]="a whole number >= 2 or 'estimate'"
  [share]="a share in [0, 1) like 0.2")
opt() {
  printf -v "$1" '%s' "$2"
  _options+=("$1")
  local rule="${3:-}"
  if [ -z "$rule" ] && { [ "$2" = true ] || [ "$2" = false ]; }; then rule="true false"; fi
  if [ -n "$rule" ] && [ -n "${_RULES[$rule]:-}" ]; then
    _option_rules[$1]="${_RULES[$rule]}"
    _option_rule_texts[$1]="${_RULE_TEXTS[$rule]}"
  elif [ -n "$rule" ]; then
    _option_rules[$1]="^(${rule// /|})\$"
    _option_rule_texts[$1]="one of ${rule// /, }"
  fi
}

# stage_on N: true when stage N is within --stage .. --stop_stage.
stage_on() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }

# fetch_options: declare the options of the data preparation stage of the real-corpus recipes.
fetch_options() {
  opt download_dir data/download     # archives are downloaded (or joined) here
  opt archive_dir ""                 # folder already holding the archives: nothing is downloaded
  opt raw_dir data/raw               # archives are unpacked here
  opt mirror ""                      # base URL replacing the official hosts (<mirror>/<file name>)
  opt download_opts ""               # more download options, e.g. "--user NAME --skip-md5 --keep-parts"
  opt musan_rirs true                # also fetch MUSAN + RIRS_NOISES and augment with them (false: none)
}

# launch_options [GPUS]: declare the options `launch` reads. --gpus: `all` (the default, or GPUS when
# given: every GPU this shell sees, CUDA_VISIBLE_DEVICES respected; the CPU when there is none), a list
# like "0 1 2 3" (one process each), or `none` (the CPU with --nproc processes, e.g. CPU DDP). Several
# machines: the same command on each with --nnodes, --node_rank, --master_addr (node 0's address), or
# --nnodes MIN:MAX for elastic restarts. Under Slurm (--launcher slurm, or auto inside an sbatch/salloc
# allocation) the allocation says all of that: see docs/clusters.md.
launch_options() {
  opt gpus "${1:-all}"               # all | none | e.g. "0 1 2 3": one training process per GPU
  opt nproc 1                        # training processes when no GPU is used
  opt nnodes 1                       # machines taking part (the same command on each); MIN:MAX: elastic
  opt node_rank 0                    # this machine's number, 0 .. nnodes-1 (not used when elastic)
  opt master_addr 127.0.0.1          # node 0's address (elastic: the rendezvous host), reachable from every node
  opt master_port 29500
  opt max_restarts 0                 # torchrun restarts the processes this often after one (or a node) fails
  opt launcher auto "auto local slurm"  # local | slurm (srun, one torchrun agent per node) | auto: slurm in an allocation
  opt requeue auto "auto true false"  # slurm: a pre-empted job requeues itself: auto (if sbatch --requeue) | true | false
}

# preflight ARGS...: when stage 3 is among the stages to run, `speakerlab-train --check ARGS` first (the
# arguments of stage 3's training command): a config, override, pretrained model or exp dir stage 3 would
# refuse stops the recipe with its one-line error (exit 2) before the data stages run.
preflight() {
  stage_on 3 || return 0
  log "pre-flight: config, overrides, pretrained model and exp dir of stage 3 (speakerlab-train --check)"
  speakerlab-train --check "$@" >&2
}

# calibration_options: declare the options of stage 8. --cal_set: a data dir with `trials`, held out from training
# and from the test lists ("": the recipe's validation set); --p_target: the priors of its costs.
calibration_options() {
  opt cal_set ""                     # stage 8: held-out data dir whose trials fit the calibration ("": the val set)
  opt p_target "0.01 0.05"           # stage 8: priors of actDCF / minDCF; the first is the calibration's fit prior
}

# calibration_stage EXP MODEL CAL_DIR EVAL_DIR TRIALS...: stage 8. Embeds CAL_DIR (held out: not the test set) with
# MODEL (a checkpoint or exp dir), fits speakerlab-calibrate on its trials (durations from both data dirs'
# utt2num_samples) and measures the fit on the held-out TRIALS of EVAL_DIR, scored on stage 4's
# $EXP/embeddings/<EVAL_DIR name>.npz; writes $EXP/calibration.json, which speakerlab-export --waveform carries into
# the ONNX file and speakerlab-verify reads.
calibration_stage() {
  local exp="$1" model="$2" cal_set="$3" eval_dir="$4"; shift 4
  [ -n "$cal_set" ] || { echo "error: stage 8 needs --cal_set DIR: a held-out data dir with trials (not the test set)" >&2; exit 2; }
  [ -f "$cal_set/trials" ] || { echo "error: --cal_set $cal_set: no trials file there (stage 8 fits on its trials)" >&2; exit 2; }
  local cal_npz="$exp/embeddings/calibration_$(basename "$cal_set").npz"
  log "stage 8: calibration: fit on $cal_set/trials, measured on $* -> $exp/calibration.json"
  speakerlab-extract --checkpoint "$model" --data "$cal_set" --out "$cal_npz"
  speakerlab-calibrate --trials "$cal_set/trials" --embeddings "$cal_npz" --durations "$cal_set" "$eval_dir" \
    --eval-trials "$@" --eval-embeddings "$exp/embeddings/$(basename "$eval_dir").npz" --p-target $p_target \
    --out "$exp/calibration.json"
}

# listed_eval_stages EXP MODEL EVAL_DIR CAL_DIR TRIAL_NAMES...: stages 8 and 9 of a recipe whose evaluation lists are
# EVAL_DIR/trials_<name>: calibration fitted on CAL_DIR, measured on every list; the stress table of the first list.
listed_eval_stages() {
  local exp="$1" model="$2" eval_dir="$3" cal_dir="$4" lists=() t; shift 4
  for t in "$@"; do lists+=("$eval_dir/trials_$t"); done
  if stage_on 8; then calibration_stage "$exp" "$model" "$cal_dir" "$eval_dir" "${lists[@]}"; fi
  if stage_on 9; then  # every condition on the test side
    stress_stage "$model" "$eval_dir" "${lists[0]}" "$1" "$exp" "$(dirname "$eval_dir")/musan_rirs/bank" \
      "$exp/embeddings/$(basename "$eval_dir").npz"
  fi
}

# stress_stage MODEL DATA TRIALS NAME EXP [BANK [CLEAN]]: stage 9, the same in every recipe. The stress table
# (speakerlab-stress) of MODEL (a checkpoint or exp dir) on the list TRIALS of the data dir DATA: the
# conditions of speakerlab.dataio.waveform.degrade on the test side, those with noise and RIRs from the noise bank
# BANK when it was built -> EXP/stress/NAME.md and NAME.json; the clean side read from stage 4's embeddings
# CLEAN when they exist (the command refuses them if another model made them). $stress_opts (when the recipe
# declares it) adds options, e.g. "--both-sides" or "--conditions clean trunc1 gsm".
stress_stage() {
  local model="$1" data="$2" trials="$3" name="$4" exp="$5" bank="${6:-}" clean="${7:-}" extra=()
  [ -n "$bank" ] && [ -f "$bank/index.json" ] && extra=(--noise-bank "$bank")
  [ -n "$clean" ] && [ -f "$clean" ] && extra+=(--clean-embeddings "$clean")
  log "stage 9: stress table of $model on $trials -> $exp/stress/$name.md"
  mkdir -p "$exp/stress"
  speakerlab-stress --checkpoint "$model" --data "$data" --trials "$trials" "${extra[@]}" ${stress_opts:-} \
    --out "$exp/stress/$name.md" --json "$exp/stress/$name.json"
}

# visible_gpu_count: the CUDA devices this shell's python sees (CUDA_VISIBLE_DEVICES applied), 0 without any.
visible_gpu_count() {
  python -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0
}

# launch COMMAND ARGS...: the console script `COMMAND ARGS` for one process, torchrun's agent
# (speakerlab.train.launch.agent) for several, or under Slurm srun with one agent per node; says how many
# processes it starts and on what. Its exit code is the training's: 75 means pre-empted with the
# checkpoint written (a Slurm job then requeues itself when allowed; the same command resumes), 130 stopped
# by Ctrl-C with the checkpoint written (the same command resumes).
launch() {
  local how="$launcher"
  if [ "$how" = auto ]; then  # a batch or salloc shell of an allocation, not a process inside a job step
    how=local
    [ -n "${SLURM_JOB_ID:-}" ] && [ -z "${SLURM_STEP_ID:-}" ] && how=slurm
  fi
  case "$how" in
    local) _launch_local "$@" ;;
    slurm) _launch_slurm "$@" ;;
    *) echo "error: --launcher must be auto, local or slurm, got '$launcher'" >&2; exit 2 ;;
  esac
}

_launch_local() {
  local n="$nproc" where="the CPU"
  case "$gpus" in
    none) ;;
    all)
      local count; count="$(visible_gpu_count)"
      if [ "$count" -gt 0 ]; then
        n="$count"; where="$count GPU(s) (all visible${CUDA_VISIBLE_DEVICES:+: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES})"
      else
        where="the CPU (no GPU visible)"
      fi ;;
    *)
      export CUDA_VISIBLE_DEVICES="$(echo $gpus | tr ' ' ',')"
      n=$(echo $gpus | wc -w); where="GPU(s) $CUDA_VISIBLE_DEVICES" ;;
  esac
  local nodes="" rdzv=(--node_rank="$node_rank" --master_addr="$master_addr" --master_port="$master_port")
  if [[ "$nnodes" == *:* ]]; then  # elastic: c10d rendezvous; the id is the command's, the same on every node
    rdzv=(--rdzv_backend=c10d --rdzv_endpoint="$master_addr:$master_port"
      --rdzv_id="speakerlab-$(printf '%s ' "$@" | cksum | cut -d' ' -f1)")
    nodes=" on $nnodes node(s) (elastic, rendezvous $master_addr:$master_port)"
  elif [ "$nnodes" -gt 1 ]; then
    nodes=" on node $node_rank of $nnodes (master $master_addr:$master_port)"
  fi
  [ "$nnodes" = 1 ] || python -m speakerlab.train.launch.slurm host "$master_addr" --port "$master_port" || exit 2
  log "launch: $n process(es) on $where$nodes: $1"
  if [ "$n" -gt 1 ] || [ "$nnodes" != 1 ] || [ "$max_restarts" -gt 0 ]; then
    python -m speakerlab.train.launch.agent --nnodes="$nnodes" --nproc_per_node="$n" --max-restarts="$max_restarts" \
      "${rdzv[@]}" --no-python "$@"
  else
    "$@"
  fi
}

# One torchrun agent per node of the allocation (srun), each with a process per GPU Slurm granted on its
# node (per task when there is none, or with --gpus none), meeting at the first node
# (speakerlab.train.launch.slurm reads and checks the allocation).
_launch_slurm() {
  local plan status=0
  plan="$(python -m speakerlab.train.launch.slurm slurm --gpus "$gpus" --nnodes "$nnodes" --requeue "$requeue")" || exit 2
  eval "$plan"
  log "launch: $slurm_where: $1"
  srun --nodes="$slurm_nodes" --ntasks="$slurm_nodes" --ntasks-per-node=1 --cpus-per-task="$slurm_cpus" \
    --kill-on-bad-exit=0 python -m speakerlab.train.launch.agent --nnodes="$slurm_nnodes" --nproc_per_node="$slurm_nproc" \
    --max-restarts="$max_restarts" --rdzv_backend=c10d --rdzv_endpoint="$slurm_rdzv" --rdzv_id="$SLURM_JOB_ID" \
    --no-python "$@" || status=$?
  if [ "$status" -eq 75 ]; then
    if [ "$slurm_requeue" = true ]; then
      log "launch: pre-empted, checkpoint written; requeueing Slurm job $SLURM_JOB_ID (its next start resumes)"
      scontrol requeue "$SLURM_JOB_ID" || echo "error: scontrol requeue $SLURM_JOB_ID failed; submit the script again to resume" >&2
    else
      log "launch: pre-empted, checkpoint written; submit the same script again to resume (sbatch --requeue does it)"
    fi
    exit 75
  fi
  return "$status"
}

# pseudo_label_options CORPUS: declare the options of stage 10 in the real-corpus recipes (--labels false runs).
pseudo_label_options() {
  opt labels true                    # false: the training set's speaker labels are not used (data.labels=false):
                                     # a self-supervised --config (conf/$1/dino_*.yaml), then stage 10
  opt supervised_config "../../conf/$1/ecapa_tdnn_c1024.yaml"  # stage 10: the margin recipe trained on the clusters
  opt rounds 1 count                 # stage 10: pseudo-label rounds (embed, cluster, train from the last model)
  opt clusters estimate clusters     # stage 10: pseudo-speakers, or estimate: AHC on a sample, scaled to the set
  opt drop 0.2 share                 # stage 10: share of the least confident utterances dropped (on egs/mini's
                                     # 4,800 utterances 0 trained the best round: bench/RESULTS.md, "How pure...")
  opt round_overrides ""             # stage 10: overrides of the rounds' training, e.g. "train.epochs=20"
}

# pseudo_label_stage EXP TRAIN_DIR [TRAIN ARGS...]: stage 10 of a real-corpus recipe after its --labels false
# stage 3: pseudo_label_rounds with the options of pseudo_label_options; the clusters' purity against
# TRAIN_DIR/utt2spk is printed when that file exists (for measuring only: nothing trains on it).
pseudo_label_stage() {
  local exp="$1" train="$2" count truth=""
  shift 2
  if [ "$labels" != false ]; then
    echo "error: stage 10 (pseudo-label rounds) follows a self-supervised --labels false run; give --labels false" >&2
    exit 2
  fi
  count="--clusters $clusters"; [ "$clusters" = estimate ] && count="--estimate"
  [ -f "$train/utt2spk" ] && truth="--true-labels $train/utt2spk"
  pseudo_label_opts="$count --drop $drop $truth"
  pseudo_label_rounds "$rounds" "$exp" "$train" "$supervised_config" "$@" $round_overrides
}

# pseudo_label_rounds ROUNDS EXP UNLABELLED CONFIG [TRAIN ARGS...]: stage 10. Each round embeds the unlabelled
# data dir with the last model (EXP: the self-supervised run, then each round's), clusters the embeddings into
# a labelled data dir UNLABELLED_<name>_pl<r> (speakerlab-pseudo-label with $pseudo_label_opts), prepares it and
# trains the supervised CONFIG on it into EXP_pl<r>, initialised from the last model (train.init: its backbone; a new
# classifier). The labels are named after the round's model, so that rounds from another start (--exp) never
# rewrite those a model was trained on. Re-running skips nothing it cannot redo cheaply: the embeddings and clusters
# are rewritten (the same ones from the same model), the training resumes. Once a round has a checkpoint, its labels
# are never rewritten: clusters that differ from them (another --clusters or --drop) stop the rerun with an error.
pseudo_label_rounds() {
  local rounds="$1" prev="$2" unlabelled="$3" config="$4" r
  shift 4
  local base="$prev"
  for r in $(seq 1 "$rounds"); do
    local exp="${base}_pl$r"
    local dir="${unlabelled}_$(basename "$exp")"
    local emb="$prev/embeddings/$(basename "$unlabelled").npz"
    local out="$dir"
    if compgen -G "$exp/checkpoints/*.pt" >/dev/null && [ -f "$dir/utt2spk" ]; then
      out="$dir.again"  # a trained round: its labels are compared with this clustering, not replaced by it
    fi
    log "stage 10: pseudo-label round $r of $rounds: embed $unlabelled with $prev, cluster -> $dir, train -> $exp"
    speakerlab-extract --checkpoint "$prev" --data "$unlabelled" --out "$emb"
    speakerlab-pseudo-label --embeddings "$emb" --data "$unlabelled" --out "$out" $pseudo_label_opts
    if [ "$out" != "$dir" ]; then
      if ! cmp -s "$out/utt2spk" "$dir/utt2spk"; then
        rm -rf "$out"
        echo "error: $dir/utt2spk: $exp was trained on these labels and this round's clusters differ (another" \
          "--clusters or --drop?): they are kept; delete $exp and $dir to train the round on new ones" >&2
        exit 2
      fi
      rm -rf "$out"
    fi
    speakerlab-prepare --data "$dir"
    launch speakerlab-train --config "$config" --exp-dir "$exp" --hardware "$hardware" data.train="$dir" \
      train.init="$prev" "$@"
    prev="$exp"
  done
}
