#!/usr/bin/env bash
# The first command of a session on a GPU machine: proves the GPU path and measures it, offline, within a
# time budget meant for one H100 session (on an H100 with torch 2.11: 461 s, every step run; bench/RESULTS.md).
#   bash bench/gpu_session.sh [--out DIR] [--wheels DIR] [--budget S]   # on the card
#   bash bench/gpu_session.sh --dry-run --out /tmp/gs         # the same steps on the CPU, tiny, < 3 minutes
# --wheels DIR: wheels of what the machine lacks (bash bench/fetch_gpu_wheels.sh DIR, here, beforehand),
# installed with pip --no-index (egs/tools/env.sh, SPEAKERLAB_WHEELS).
# Steps, each logged with its time, its output kept under --out (default bench/gpu_session_out):
#   1 environment (GPU, driver, torch, free memory, packages)                      env.txt
#   2 tests/test_cuda.py (TF32 parity, autocast, fp16 scaler, compiled step, NCCL; DINO, SSL front ends and the
#     segmentation model training on the card)                                       test_cuda.txt
#   3 bench/gpu_session.py measure (one process), output in measure.txt:
#     a synthetic data dir (768 x 4 s; listed 9 times for the loader rows: one epoch); the auto per-card batch  train_probe.json
#     bench/train_step.py, CAM++ and ERes2Net-base at 3 s crops, per-card batch 256: fp32, tf32, bf16
#     eager; bf16 eager through the data loader; extraction; last bf16 compiled              train_*.json
#     extraction throughput (python -m speakerlab.inference.extract) of both models                   extract.json
#   4 RESULTS.md-ready rows of the timed steps (always, also after the hard limit)          rows.md
# A step that fails is logged and the others still run; the exit code is that of the first failure. Steps
# past the time budget (--budget, 530 s; dry run 170 s, but a dry run skips nothing) are skipped, logged. A step begun
# before it may run past it: the measure step is stopped at the hard limit, budget + 30 s (train_step.py's JSON
# keeps the rows finished by then), so that a device call of 600 s still gets the rows back (the H200's
# compiled step began at +480 s and a call's limit stopped it, rows and all: bench/RESULTS.md).
set -uo pipefail
cd "$(dirname "$0")/.."
dry=false out=bench/gpu_session_out wheels="" budget=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=true; shift ;;
    --out) out="$2"; shift 2 ;;
    --wheels) wheels="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$budget" ] || { if [ "$dry" = true ]; then budget=170; else budget=530; fi; }
[[ "$budget" =~ ^[0-9]+$ ]] || { echo "error: --budget takes whole seconds, got $budget" >&2; exit 2; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
start=$(date +%s)
deadline=$((start + budget))
hard_limit=$((start + budget + 30))
status=0
log() { echo "[$(date '+%H:%M:%S') +$(( $(date +%s) - start ))s] gpu_session: $*" | tee -a "$out/session.log" >&2; }
# step NAME COMMAND...: run it unless the budget is spent; its output to $out/NAME.txt and the log.
step() {
  local name="$1"; shift
  if [ "$(date +%s)" -ge "$deadline" ] && [ "$dry" = false ]; then log "$name: skipped, past the budget"; return; fi
  log "$name: $*"
  "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  grep -E "^(==|\| |probe |extraction |[0-9]+ (passed|failed|skipped)|FAILED|ERROR)" "$out/$name.txt" >&2
  [ "$rc" -ne 124 ] || log "$name: stopped at the hard limit (+$((hard_limit - start))s)"
  if [ "$rc" -ne 0 ]; then log "$name: FAILED (exit $rc), see $out/$name.txt"; [ "$status" -ne 0 ] || status=$rc; fi
}

[ -n "$wheels" ] && export SPEAKERLAB_WHEELS="$(cd "$wheels" && pwd)"
SPEAKERLAB_REQUIREMENTS=requirements-test.txt source egs/tools/env.sh || { log "environment set-up failed"; exit 2; }
export PYTHONUNBUFFERED=1

log "start: dry-run $dry, out $out, wheels ${wheels:-none}, budget ${budget}s"
step env python bench/gpu_session.py env
step test_cuda python -m pytest -q -p no:cacheprovider tests/test_cuda.py
measure=(python bench/gpu_session.py measure "$out")
if [ "$dry" = true ]; then
  measure+=(--deadline $((start + 3600)) --dry-run)
  step measure "${measure[@]}"
else
  measure+=(--deadline "$deadline")
  step measure timeout $((hard_limit - $(date +%s))) "${measure[@]}"
fi
log "rows: python bench/gpu_session.py rows $out"
python bench/gpu_session.py rows "$out" > "$out/rows.txt" 2>&1 || { log "rows: FAILED, see $out/rows.txt"; [ "$status" -ne 0 ] || status=1; }
log "done in $(( $(date +%s) - start ))s, exit $status; rows: $out/rows.md; JSON: $out/*.json"
exit "$status"
