"""Verification metrics: EER and minimum detection cost, vectorised over all thresholds."""
from __future__ import annotations

from typing import Tuple

import numpy as np


def error_rates(scores: np.ndarray, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Miss and false-alarm rates at every operating point between distinct scores.

    `scores (N,)`, `labels (N,)` bool or 0/1 -> `(p_miss (K+1,), p_fa (K+1,), thresholds (K,))`, ordered by
    rising threshold: point k accepts trials with score >= thresholds[k] (point 0 accepts all,
    p_miss 0 and p_fa 1); the last point accepts nothing.
    """
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    if scores.shape != labels.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be equal 1-D shapes")
    n_tar, n_non = int(labels.sum()), int((~labels).sum())
    if n_tar == 0 or n_non == 0:
        raise ValueError(f"need target and nontarget trials, got {n_tar} target, {n_non} nontarget")
    order = np.argsort(scores, kind="mergesort")
    s, l = scores[order], labels[order]
    # Rejecting the i lowest scores: misses = targets among them, false alarms = nontargets above.
    miss = np.concatenate([[0], np.cumsum(l)])
    fa = n_non - np.concatenate([[0], np.cumsum(~l)])
    # Only thresholds between distinct scores are operating points: drop cut points inside ties.
    keep = np.concatenate([[True], s[1:] != s[:-1], [True]])
    return miss[keep] / n_tar, fa[keep] / n_non, s[keep[:-1]]


def compute_eer(scores, labels) -> float:
    """Equal error rate (fraction, 0..1), linearly interpolated where p_miss crosses p_fa."""
    p_miss, p_fa, _ = error_rates(scores, labels)
    diff = p_miss - p_fa  # rises from -1 to +1 along the thresholds
    i = int(np.searchsorted(diff, 0.0))
    if i == 0:
        return float(p_fa[0])
    d0, d1 = diff[i - 1], diff[i]
    w = 0.0 if d1 == d0 else -d0 / (d1 - d0)
    return float((1 - w) * (p_miss[i - 1] + p_fa[i - 1]) / 2 + w * (p_miss[i] + p_fa[i]) / 2)


def compute_min_dcf(scores, labels, p_target: float = 0.01, c_miss: float = 1.0, c_fa: float = 1.0) -> float:
    """Normalised minimum detection cost: min over thresholds of
    (c_miss p_miss p_target + c_fa p_fa (1 - p_target)) / min(c_miss p_target, c_fa (1 - p_target))."""
    p_miss, p_fa, _ = error_rates(scores, labels)
    dcf = c_miss * p_miss * p_target + c_fa * p_fa * (1 - p_target)
    return float(dcf.min() / min(c_miss * p_target, c_fa * (1 - p_target)))
