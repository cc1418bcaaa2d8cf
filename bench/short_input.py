"""Short test input: embed a 0.2-1 s crop as it is, or repeated to a longer length first? EER of each.

    python bench/short_input.py --model egs/mini/exp/campplus --data egs/mini/data/test
    python bench/short_input.py --model exp/x --data data/test --crops 0.2 0.5 1 --pad-to 1.5 3 --both-sides

For every crop length the test side of the trial list (enrolment whole and clean, or cropped too with
`--both-sides`) is cut to a seeded crop (`truncN` of speakerlab.dataio.waveform.degrade) and embedded as it is, then
repeated to each `--pad-to` length before embedding (`truncN+repP`). Every figure is a row of speakerlab-stress
(same crops, same seed: the columns differ only by the padding), with its 95 % speaker-bootstrap interval.
Prints the command and one markdown row per crop length (the rows of bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from speakerlab.inference.stress import run as stress


def cell(row: dict) -> str:
    ci = row.get("eer_ci")
    interval = f" ({100 * ci['low']:.2f}-{100 * ci['high']:.2f})" if ci else ""
    return f"{100 * row['eer']:.2f}{interval}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint or exp dir")
    ap.add_argument("--data", required=True, help="Kaldi data dir with trials")
    ap.add_argument("--crops", type=float, nargs="+", default=[0.2, 0.5, 1.0], help="test crop lengths, seconds")
    ap.add_argument("--pad-to", type=float, nargs="+", default=[1.5, 3.0], help="repetition targets, seconds")
    ap.add_argument("--both-sides", action="store_true", help="crop (and pad) enrolment too")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("command: python bench/short_input.py " + " ".join(sys.argv[1:] if argv is None else argv))
    conditions = ["clean"]
    for c in args.crops:
        conditions += [f"trunc{c:g}", *(f"trunc{c:g}+rep{p:g}" for p in args.pad_to)]
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        cmd = ["--checkpoint", args.model, "--data", args.data, "--conditions", *conditions, "--json", str(out)]
        cmd += ["--seed", str(args.seed), "--device", "cpu"] + (["--both-sides"] if args.both_sides else [])
        if stress(cmd) != 0:
            return 2
        rows = {r["condition"]: r for r in json.loads(out.read_text())["rows"]}
    side = "both sides cropped" if args.both_sides else "test side cropped, enrolment whole"
    clean = rows["clean"]
    print(f"\nclean (whole files): EER {cell(clean)} %, {clean['n_trials']} trials; {side}; seed {args.seed}")
    pads = " | ".join(f"repeated to {p:g} s: EER % (95 % CI)" for p in args.pad_to)
    print(f"\n| test crop | trials | as it is: EER % (95 % CI) | {pads} |")
    print("|---" * (3 + len(args.pad_to)) + "|")
    for c in args.crops:
        padded = " | ".join(cell(rows[f"trunc{c:g}+rep{p:g}"]) for p in args.pad_to)
        print(f"| {c:g} s | {rows[f'trunc{c:g}']['n_trials']} | {cell(rows[f'trunc{c:g}'])} | {padded} |")
    print(f"\n{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
