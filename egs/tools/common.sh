# Helpers shared by egs/*/run.sh. Sourced before or after parse_options.sh (it only defines functions;
# a recipe that takes its option defaults from fetch_options / launch_options sources it before).

log() { echo "[$(date '+%Y-%m-%d %H:%M:%S')] $*" >&2; }

# stage_on N: true when stage N is within --stage .. --stop_stage.
stage_on() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }

# fetch_options: defaults of the options of the corpus stages below (call it before parse_options.sh).
fetch_options() {
  download_dir=data/download         # archives are downloaded (or joined) here
  archive_dir=""                     # folder already holding the archives: nothing is downloaded
  raw_dir=data/raw                   # archives are unpacked here
  mirror=""                          # base URL replacing the official hosts (<mirror>/<file name>)
  download_opts=""                   # more download-step options, e.g. "--user NAME --skip-md5 --keep-parts"
  musan_rirs=true                    # also fetch MUSAN + RIRS_NOISES, write their lists, augment with
                                     # them in training (false: augment.lists=null, no augmentation)
}

# launch_options: defaults of the options `launch` reads (call it before parse_options.sh).
launch_options() {
  gpus=""                            # e.g. "0 1 2 3": one training process per GPU
  nproc=1                            # training processes when gpus is empty
  nnodes=1
  node_rank=0
  master_addr=127.0.0.1
  master_port=29500
}

# launch MODULE ARGS...: `python -m MODULE` for one process, torchrun for several.
# Uses the recipe's gpus ("0 1 2 3" -> CUDA_VISIBLE_DEVICES and one process each), nproc (processes
# per node when gpus is empty, e.g. CPU DDP), nnodes, node_rank, master_addr, master_port.
launch() {
  local n="${nproc:-1}"
  if [ -n "${gpus:-}" ]; then
    export CUDA_VISIBLE_DEVICES="$(echo $gpus | tr ' ' ',')"
    n=$(echo $gpus | wc -w)
  fi
  if [ "$n" -gt 1 ] || [ "${nnodes:-1}" -gt 1 ]; then
    python -m torch.distributed.run --nnodes="${nnodes:-1}" --node_rank="${node_rank:-0}" \
      --nproc_per_node="$n" --master_addr="${master_addr:-127.0.0.1}" --master_port="${master_port:-29500}" \
      -m "$@"
  else
    python -m "$@"
  fi
}

# The corpus stages of egs/{voxceleb,3dspeaker,cnceleb}: CORPUS names the module
# speakerlab.datasets.CORPUS, ARGS go to its step (e.g. --parts $parts). When musan_rirs=true each also
# runs the same step of speakerlab.datasets.musan_rirs (the MUSAN + RIRS_NOISES augmentation sets).

# download_stage CORPUS ARGS...: download the archives into $download_dir ($jobs at a time, from $mirror
# when set), or only verify (and join parts of) those already in $archive_dir; then $download_opts.
download_stage() {
  local corpus="$1"; shift
  local opts=(--download-dir "$download_dir" --archive-dir="$archive_dir" --mirror="$mirror" --jobs "$jobs")
  python -m "speakerlab.datasets.$corpus" download "${opts[@]}" "$@" $download_opts
  if [ "$musan_rirs" = true ]; then
    python -m speakerlab.datasets.musan_rirs download "${opts[@]}" $download_opts
  fi
}

# extract_stage CORPUS ARGS...: unpack the archives (from $archive_dir or $download_dir) into $raw_dir.
extract_stage() {
  local corpus="$1"; shift
  local opts=(--download-dir "$download_dir" --archive-dir="$archive_dir" --raw-dir "$raw_dir")
  python -m "speakerlab.datasets.$corpus" extract "${opts[@]}" "$@"
  if [ "$musan_rirs" = true ]; then
    python -m speakerlab.datasets.musan_rirs extract "${opts[@]}"
  fi
}

# lists_stage CORPUS ARGS...: Kaldi data dirs and trial lists from $raw_dir into $data; the augmentation
# lists into $data/musan_rirs (where corpus_train_stage points augment.lists).
lists_stage() {
  local corpus="$1"; shift
  python -m "speakerlab.datasets.$corpus" prepare --raw-dir "$raw_dir" --data "$data" "$@"
  if [ "$musan_rirs" = true ]; then
    python -m speakerlab.datasets.musan_rirs prepare --raw-dir "$raw_dir" --out "$data/musan_rirs"
    python -m speakerlab.noise_bank --lists "$data/musan_rirs"  # the int16 bank training memory-maps
  fi
}

# index_stage: validate $data/$train_set and $data/$eval_set (lists, trials), read every audio header
# and write the lengths ($jobs threads).
index_stage() {
  python -m speakerlab.prepare --data "$data/$train_set" --data "$data/$eval_set" --jobs "$jobs"
}

# train_stage OVERRIDES...: train $config into $exp on $hardware (one process or torchrun), with the
# recipe's data overrides and then $train_overrides. Re-running resumes.
train_stage() {
  launch speakerlab.train --config "$config" --exp-dir "$exp" --hardware "$hardware" "$@" $train_overrides
}

# corpus_train_stage / corpus_finetune_stage: train_stage / finetune_stage with the corpus recipes' data:
# data.train=$data/$train_set, data.val=$data/$val_set when val_set is set, and augmentation with the
# lists stage's $data/musan_rirs (augment.lists=null, no augmentation, unless musan_rirs=true).
corpus_train_stage() { _with_corpus_data train_stage; }
corpus_finetune_stage() { _with_corpus_data finetune_stage; }
_with_corpus_data() {
  local val=${val_set:+data.val=$data/$val_set} aug="augment.lists=null"
  if [ "$musan_rirs" = true ]; then aug="augment.lists=$data/musan_rirs"; fi
  "$1" data.train="$data/$train_set" $val "$aug"
}

# embeddings_stage SET: embeddings of $data/SET into $exp/embeddings/SET.npz, with $checkpoint
# ("" = the latest checkpoint of $exp).
embeddings_stage() {
  python -m speakerlab.extract --checkpoint "${checkpoint:-$exp}" --data "$data/$1" --out "$exp/embeddings/$1.npz"
}

# score_stage SET TRIALS NAME: score the trial list $data/SET/TRIALS with $exp/embeddings/SET.npz;
# scores and EER / minDCF go to $exp/scores/NAME.*.
score_stage() {
  python -m speakerlab.score --embeddings "$exp/embeddings/$1.npz" --trials "$data/$1/$2" --out "$exp/scores/$3"
}

# average_stage: average the last $average_last epoch checkpoints of $exp into $exp/checkpoints/avg.pt.
average_stage() {
  python -m speakerlab.average --exp-dir "$exp" --last "$average_last"
}

# finetune_stage OVERRIDES...: large-margin fine-tuning ($lm_config overlaid on $config) from
# $exp/checkpoints/avg.pt into ${exp}_lm.
finetune_stage() {
  launch speakerlab.train --config "$config" --config "$lm_config" --exp-dir "${exp}_lm" --hardware "$hardware" \
    train.init_from="$exp/checkpoints/avg.pt" "$@" $train_overrides
}
