#!/usr/bin/env bash
# Time the README's run command (egs/mini) the way a new user meets it: a fresh clone of the
# committed tree, its own .venv, every stage from the corpus to the baseline.
#   bash bench/mini_recipe.sh [WORK_DIR] [-- run.sh options...]
# Prints the wall time of set-up and of each stage, the test EER, the baseline EER and the command.
# WORK_DIR (default: a new temporary directory) receives the clone; it is left in place for a look.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
shift || true
[ "${1:-}" = "--" ] && shift
clone="$work/speakerlab"
[ -e "$clone" ] && { echo "error: $clone exists; give an empty WORK_DIR" >&2; exit 2; }
git clone -q "$repo" "$clone"
rev=$(git -C "$clone" rev-parse --short HEAD)
log="$work/mini.log"
start=$(date +%s)
# Every log line of the recipe carries a time stamp; the stamps alone give the stage times.
set +e
(cd "$clone" && bash egs/mini/run.sh "$@") 2>&1 | while IFS= read -r line; do
  printf '%s %s\n' "$(date +%s)" "$line"
done > "$log"
status=${PIPESTATUS[0]}
set -e
total=$(( $(date +%s) - start ))
if [ "$status" -ne 0 ]; then
  tail -n 20 "$log" >&2
  echo "error: egs/mini/run.sh exited with $status after $total s (log: $log)" >&2
  exit "$status"
fi

echo "command: (in a fresh clone of $rev) bash egs/mini/run.sh $*"
echo "machine: $(nproc --all) CPU cores, $(uname -m), python $("$clone/.venv/bin/python" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo '?')"
# Steps begin at the recipe's "stage N:" lines; set-up is everything before the first one.
awk -v start="$start" -v total="$total" '
  / stage [0-9]+: / && !/epoch/ {
    if (name != "") printf "  %-58s %5d s\n", name, $1 - t
    else printf "  %-58s %5d s\n", "set-up (env.sh)", $1 - start
    name = $0; sub(/^[0-9]+ \[[^]]*\] /, "", name); name = substr(name, 1, 58); t = $1
  }
  / EER / && !/validation/ { sub(/^[0-9]+ /, ""); eer[++n] = $0 }
  END {
    if (name != "") printf "  %-58s %5d s\n", name, start + total - t
    printf "  %-58s %5d s\n", "total", total
    for (i = 1; i <= n; i++) print "  " eer[i]
  }' "$log"
echo "full log: $log"
