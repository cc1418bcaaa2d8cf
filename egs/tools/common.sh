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
LAST_STAGE=7

log() { echo "[$(date '+%Y-%m-%d %H:%M:%S')] $*" >&2; }

# opt NAME DEFAULT: declare the recipe option --NAME (shell variable NAME) with its default.
# Only declared options are accepted by parse_options.sh.
_options=()
opt() { printf -v "$1" '%s' "$2"; _options+=("$1"); }

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

# launch_options: declare the options `launch` reads (one training process per GPU of --gpus, or
# --nproc processes when --gpus is empty, e.g. CPU DDP; several machines with --nnodes ...).
launch_options() {
  opt gpus ""                        # e.g. "0 1 2 3": one training process per GPU
  opt nproc 1                        # training processes when gpus is empty
  opt nnodes 1
  opt node_rank 0
  opt master_addr 127.0.0.1
  opt master_port 29500
}

# launch COMMAND ARGS...: the console script `COMMAND ARGS` for one process, torchrun for several, from
# the options of launch_options ("0 1 2 3" in gpus -> CUDA_VISIBLE_DEVICES and one process each).
launch() {
  local n="$nproc"
  if [ -n "$gpus" ]; then
    export CUDA_VISIBLE_DEVICES="$(echo $gpus | tr ' ' ',')"
    n=$(echo $gpus | wc -w)
  fi
  if [ "$n" -gt 1 ] || [ "$nnodes" -gt 1 ]; then
    python -m torch.distributed.run --nnodes="$nnodes" --node_rank="$node_rank" --nproc_per_node="$n" \
      --master_addr="$master_addr" --master_port="$master_port" --no-python "$@"
  else
    "$@"
  fi
}
