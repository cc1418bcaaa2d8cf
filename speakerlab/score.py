"""Cosine scoring of a trial list, with EER and minDCF.

    python -m speakerlab.score --embeddings exp/mini/embeddings/test.npz --trials data/test/trials \
        --out exp/mini/scores/test

Writes `<out>.scores` (`enrol test score target|nontarget`) and `<out>.result` (EER, minDCF), and
prints the result. Scoring is one matrix operation over all trials.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Sequence

import numpy as np

from speakerlab.lists import ListError, Trial, check_trial_ids, read_trials
from speakerlab.metrics import compute_eer, compute_min_dcf


def cosine_scores(ids: Sequence[str], emb: np.ndarray, trials: List[Trial], trials_path="trials") -> np.ndarray:
    """`(N, D)` embeddings named by `ids` -> `(len(trials),)` cosine scores."""
    check_trial_ids(trials, ids, trials_path)
    pos = {u: i for i, u in enumerate(ids)}
    e = emb.astype(np.float64)
    e /= np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    a = np.fromiter((pos[t.enrol] for t in trials), dtype=np.int64, count=len(trials))
    b = np.fromiter((pos[t.test] for t in trials), dtype=np.int64, count=len(trials))
    return np.einsum("ij,ij->i", e[a], e[b])


def evaluate(ids, emb, trials_path, p_target: float = 0.01):
    """-> (scores, labels, eer, min_dcf) for a trials file."""
    trials = read_trials(trials_path)
    scores = cosine_scores(ids, emb, trials, trials_path)
    labels = np.array([t.target for t in trials])
    return scores, labels, compute_eer(scores, labels), compute_min_dcf(scores, labels, p_target)


def main(argv=None) -> int:
    from speakerlab.extract import load_embeddings

    ap = argparse.ArgumentParser(prog="python -m speakerlab.score", description=__doc__.split("\n")[0])
    ap.add_argument("--embeddings", required=True, help=".npz from speakerlab.extract")
    ap.add_argument("--trials", required=True)
    ap.add_argument("--out", required=True, help="output prefix: <out>.scores and <out>.result")
    ap.add_argument("--p-target", type=float, default=0.01)
    args = ap.parse_args(argv)
    ids, emb = load_embeddings(args.embeddings)
    try:
        scores, labels, eer, dcf = evaluate(ids, emb, args.trials, args.p_target)
    except ListError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    trials = read_trials(args.trials)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.scores", "w") as f:
        for t, s in zip(trials, scores):
            f.write(f"{t.enrol} {t.test} {s:.6f} {'target' if t.target else 'nontarget'}\n")
    result = (f"{Path(args.trials)}: {len(trials)} trials ({int(labels.sum())} target) "
              f"EER {eer * 100:.2f}% minDCF(p_target={args.p_target}) {dcf:.4f}")
    Path(f"{out}.result").write_text(result + "\n")
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
