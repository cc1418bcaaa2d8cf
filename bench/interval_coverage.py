"""How often the EER's confidence interval (speakerlab.scoring.interval) holds the true EER, by number of speakers.

    python bench/interval_coverage.py [--lists 500] [--replicates 500]

Lists are drawn from tests/test_score_interval.py's score model (speaker effects on target and nontarget
scores, utterance effects, trial noise; its population EER known in closed form), for each case of CASES.
Per case: the share of lists whose nominal 95% interval holds the true EER, the mean half-width relative to
it, and for 20-speaker cases the same share for a bootstrap that resamples trials alone (first 200 lists).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from speakerlab.scoring.interval import TrialSpeakers, eer_interval  # noqa: E402
from speakerlab.scoring.metrics import compute_eer  # noqa: E402
from tests.test_score_interval import simulate, true_eer  # noqa: E402

# (speakers, utterances per speaker, mu, hard, alike, utt): the arguments of `simulate`
CASES = [
    (10, 6, 3.0, 1.0, 0.5, 0.0),
    (20, 6, 3.0, 1.0, 0.5, 0.0),
    (20, 6, 3.0, 1.0, 0.5, 0.7),
    (20, 10, 4.0, 1.5, 0.3, 0.5),
    (40, 6, 3.0, 1.0, 0.5, 0.5),
    (80, 6, 3.0, 0.7, 0.3, 0.5),
]


def trial_bootstrap(scores, target, rng, replicates: int = 200):
    """The 95% percentile interval of a bootstrap of target and nontarget trials, each resampled alone."""
    tar, non = np.flatnonzero(target), np.flatnonzero(~target)
    eers = []
    for _ in range(replicates):
        rows = np.r_[rng.choice(tar, len(tar)), rng.choice(non, len(non))]
        eers.append(compute_eer(scores[rows], target[rows]))
    return np.quantile(eers, [0.025, 0.975])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lists", type=int, default=500, help="lists per case")
    ap.add_argument("--replicates", type=int, default=500, help="bootstrap replicates per list")
    args = ap.parse_args()
    print(f"command: python bench/interval_coverage.py --lists {args.lists} --replicates {args.replicates}")
    cpu = platform.processor() or platform.machine()
    print(f"machine: {os.cpu_count()} cores, {cpu}, load {os.getloadavg()[0]:.1f}")
    for speakers, utts, mu, hard, alike, utt in CASES:
        truth = true_eer(mu, hard, alike, utt)
        rng = np.random.default_rng(7)
        hits = trial_hits = 0
        halves = []
        t0 = time.time()
        for k in range(args.lists):
            scores, target, enrol, test = simulate(rng, speakers, utts, mu, hard, alike, utt)
            eer = compute_eer(scores, target)
            spk = TrialSpeakers(enrol, test, speakers, "model")
            ci = eer_interval(scores, target, spk, eer, replicates=args.replicates, seed=k)
            hits += ci["low"] <= truth <= ci["high"]
            halves.append((ci["high"] - ci["low"]) / 2 / truth)
            if speakers == 20 and k < 200:
                low, high = trial_bootstrap(scores, target, rng)
                trial_hits += low <= truth <= high
        trials = f", trials alone {trial_hits / min(args.lists, 200):.3f}" if speakers == 20 else ""
        print(
            f"{speakers} speakers x {utts} utterances (mu {mu}, hard {hard}, alike {alike}, utt {utt}), true EER "
            f"{truth:.4f}: coverage {hits / args.lists:.3f}, half-width / EER {np.mean(halves):.2f}{trials} "
            f"({time.time() - t0:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
