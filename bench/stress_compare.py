"""Two stress tables side by side: a baseline model's and another's (say, trained with channel augmentation).

    python bench/stress_compare.py egs/mini/exp/campplus/stress/test.json \
        egs/mini/exp/campplus_channel/stress/test.json --names baseline channel

Reads the `--json` rows of speakerlab-stress for the same trial list and conditions and prints, per condition,
each model's EER with its 95 % interval and the relative change of the second against the first; then the mean
EER over the degraded conditions (every row but clean) of each, and the two figures issue 43 asks of the second
model: the mean degraded EER's relative change (target <= -30 %) and the clean EER's (target <= +5 %).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def cell(row: dict) -> str:
    ci = row.get("eer_ci")
    return f"{100 * row['eer']:.2f} ({100 * ci['low']:.2f}-{100 * ci['high']:.2f})" if ci else f"{100 * row['eer']:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("first", type=Path, help="the baseline's stress JSON")
    ap.add_argument("second", type=Path, help="the other model's stress JSON")
    ap.add_argument("--names", nargs=2, default=["first", "second"])
    args = ap.parse_args(argv)
    print("command: python bench/stress_compare.py " + " ".join(sys.argv[1:] if argv is None else argv))
    docs = [json.loads(p.read_text()) for p in (args.first, args.second)]
    a, b = ({r["condition"]: r for r in d["rows"]} for d in docs)
    # The same trials: list, seed and test-side draw (speakerlab-stress --test-utts) of both tables.
    same = [docs[0].get(k) == docs[1].get(k) for k in ("trials", "seed", "test_utts", "list_trials")]
    if list(a) != list(b) or not all(same):
        print("error: the two tables differ in conditions, trial list, seed or test-side draw", file=sys.stderr)
        return 2
    first, second = args.names
    clean = a["clean"]
    head = docs[0]
    drawn = f" of {head['list_trials']}, test side a draw of {head['test_utts']}" if "test_utts" in head else ""
    print(f"\ntrials: {docs[0]['trials']} ({clean['n_trials']}{drawn}), seed {docs[0]['seed']}, side {clean['side']}")
    print(f"\n| condition | test s | {first}: EER % (95 % CI) | {second}: EER % (95 % CI) | {second} vs {first} |")
    print("|---|---|---|---|---|")
    for name in a:
        change = b[name]["eer"] / a[name]["eer"] - 1 if a[name]["eer"] else float("nan")
        print(f"| {name} | {a[name]['test_seconds']:.2f} | {cell(a[name])} | {cell(b[name])} | {100 * change:+.0f} % |")
    degraded = [n for n in a if n != "clean"]
    mean_a = float(np.mean([a[n]["eer"] for n in degraded]))
    mean_b = float(np.mean([b[n]["eer"] for n in degraded]))
    clean_change = b["clean"]["eer"] / a["clean"]["eer"] - 1
    print(
        f"\nmean EER over the {len(degraded)} degraded conditions: {first} {100 * mean_a:.2f} %, {second} "
        f"{100 * mean_b:.2f} %: {100 * (mean_b / mean_a - 1):+.1f} % relative (target <= -30 %); clean "
        f"{100 * clean_change:+.1f} % relative (target <= +5 %)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
