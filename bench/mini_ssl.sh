#!/usr/bin/env bash
# The figures of egs/mini_ssl (issue 42's "must show"): self-supervised training (the recipe's default config,
# SimCLR; any other with --config) on egs/mini's corpus with its labels hidden, its test
# EER against the no-training baseline, then one pseudo-label round (cluster purity) and its test EER; each EER
# with its 95% interval as speakerlab-score prints it, and the wall time of every invocation.
#   bash bench/mini_ssl.sh [WORK_DIR [RECIPE OPTIONS]]   (a fresh clone of the committed tree in WORK_DIR, default a
#   new one; RECIPE OPTIONS go to stages 3-10, e.g. --config ../../conf/mini/dino.yaml --exp exp/dino)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
shift $(( $# > 0 ? 1 : 0 ))
exp=exp/ssl  # the recipe's default, or the --exp of the options
for ((i = 1; i < $#; i++)); do [ "${!i}" = --exp ] && { j=$((i + 1)); exp="${!j}"; }; done
clone="$work/speakerlab"
[ -e "$clone" ] && { echo "error: $clone exists; give an empty WORK_DIR" >&2; exit 2; }
git clone -q "$repo" "$clone"
rev=$(git -C "$clone" rev-parse --short HEAD)
log="$work/mini_ssl.log"
: > "$log"
step() {  # step NAME ARGS...: one recipe invocation, timed, its output appended to the log
  local name="$1" t0
  shift
  t0=$(date +%s)
  (cd "$clone" && bash egs/mini_ssl/run.sh "$@") >> "$log" 2>&1 || { tail -n 20 "$log" >&2; exit 1; }
  printf '  %-52s %6d s   bash egs/mini_ssl/run.sh %s\n' "$name" $(( $(date +%s) - t0 )) "$*"
}
echo "code: $rev; machine: $(nproc --all) CPU cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
step "stages 1-2: corpus, lists" --stop_stage 2
step "stage 3: self-supervised training" --stage 3 --stop_stage 3 "$@"
step "stages 4-5: its test EER, baseline" --stage 4 --stop_stage 5 "$@"
step "stage 10: pseudo-label round 1 (embed, cluster, train)" --stage 10 --stop_stage 10 --rounds 1 "$@"
step "stages 4-5: round 1's test EER" --stage 4 --stop_stage 5 --exp "$exp"_pl1
grep -E "EER|pseudo-label: (all|kept)|training done" "$log" | grep -v "^\[.*epoch" | sed 's/^/  /'
echo "full log: $log"
