"""Does `speakerlab-diarize` give the same RTTM every time? The same command run `--runs` times in fresh processes on
one thread, then once more on each of `--threads`; every RTTM is compared byte for byte with the first.

    python bench/diarization_repeat.py --runs 3 --threads 2 --out /tmp/repeat -- \\
        --wav-scp egs/mini_diar/data/conv/wav.scp --checkpoint egs/mini/exp/campplus \\
        --segmentation egs/mini_diar/exp/diar/segmentation/segmentation.onnx --clustering vbx \\
        --plda egs/mini_diar/exp/diar/plda.npz

Prints one line per run (threads, wall seconds, identical or the first differing line) and a verdict line.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def run_once(options, threads: int, rttm: Path) -> float:
    """One `speakerlab-diarize` process on `threads` threads writing `rttm`; its wall time in seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    entry = "from speakerlab.diarization.cli import main; main()"
    command = [sys.executable, "-c", entry, *options, "--threads", str(threads), "--rttm", str(rttm)]
    began = time.time()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"speakerlab-diarize failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return time.time() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs on one thread")
    ap.add_argument("--threads", type=int, nargs="*", default=[2], help="then one run on each of these")
    ap.add_argument("--out", required=True, help="folder for the RTTMs")
    ap.add_argument("options", nargs=argparse.REMAINDER, help="-- then speakerlab-diarize's options")
    args = ap.parse_args()
    options = args.options[1:] if args.options[:1] == ["--"] else args.options
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = [1] * args.runs + list(args.threads)
    first, same = None, True
    for i, threads in enumerate(plan):
        rttm = out / f"run{i}_threads{threads}.rttm"
        seconds = run_once(options, threads, rttm)
        lines = rttm.read_text().splitlines()
        first = lines if first is None else first
        diff = next((f"line {j + 1}: {a!r} vs {b!r}" for j, (a, b) in enumerate(zip(first, lines)) if a != b), None)
        if diff is None and len(lines) != len(first):
            diff = f"{len(lines)} lines vs {len(first)}"
        same &= diff is None
        print(f"run {i + 1}: {threads} thread(s), {seconds:.1f} s, {len(lines)} RTTM lines: {diff or 'identical'}")
    print(f"{'the same RTTM' if same else 'DIFFERENT RTTMs'} over {len(plan)} runs (threads {plan})")


if __name__ == "__main__":
    main()
