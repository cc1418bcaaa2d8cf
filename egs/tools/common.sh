# Helpers shared by egs/*/run.sh (sourced after parse_options.sh and env.sh).

log() { echo "[$(date '+%Y-%m-%d %H:%M:%S')] $*" >&2; }

# stage_on N: true when stage N is within --stage .. --stop_stage.
stage_on() { [ "$stage" -le "$1" ] && [ "$stop_stage" -ge "$1" ]; }

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

# train_stage OVERRIDES...: train $config into $exp on $hardware (one process or torchrun), with the
# recipe's data overrides and then $train_overrides. Re-running resumes.
train_stage() {
  launch speakerlab.train --config "$config" --exp-dir "$exp" --hardware "$hardware" "$@" $train_overrides
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
