"""Verification metrics: EER, minimum detection cost and operating points, from one sort of the trials.

`error_rates` sorts the trials once by score, the label riding along: float32 scores (what the scorer
gives) are mapped to order-preserving 32-bit keys with the label in an extra low bit, so one SIMD sort of
64-bit integers orders scores and labels together (no argsort); other dtypes take a stable argsort.
A running count of targets then gives the miss and false-alarm counts at every threshold. EER, minDCF at
several p_target values, the thresholds of the EER and of given false-alarm rates, and the thinned DET
curve all come from that one pass (`verification_metrics`): 10 M trials take well under a second.
"""

from __future__ import annotations

import sys
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

FA_RATES = (0.01, 0.001)  # operating points reported besides the EER: false-alarm rates 1 % and 0.1 %


def _sorted_scores_and_labels(scores: np.ndarray, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """`(N,)` scores and bool labels -> both ordered by rising score (ties in any order)."""
    if scores.dtype != np.float32:
        order = np.argsort(scores, kind="stable")
        return scores[order], labels[order]
    u = scores.view(np.uint32)
    # IEEE order as unsigned order: set the sign bit of positives, flip every bit of negatives.
    key = u ^ ((u >> np.uint32(31)) * np.uint32(0x7FFFFFFF) | np.uint32(0x80000000))
    packed = key.astype(np.uint64)
    del key
    packed <<= np.uint64(1)
    packed |= labels.view(np.uint8)
    packed.sort()
    low = packed.view(np.uint8)[::8] if sys.byteorder == "little" else packed.view(np.uint8)[7::8]
    lab = (low & 1).view(bool)  # the low byte of each word holds the label bit
    packed >>= np.uint64(1)
    key = packed.astype(np.uint32)
    del packed
    key ^= np.where(key >> np.uint32(31), np.uint32(0x80000000), np.uint32(0xFFFFFFFF))
    return key.view(np.float32), np.ascontiguousarray(lab)


def error_rates(scores: np.ndarray, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Miss and false-alarm rates at every operating point between distinct scores.

    `scores (N,)`, `labels (N,)` bool or 0/1 -> `(p_miss (K+1,), p_fa (K+1,), thresholds (K,))`, ordered by
    rising threshold: point k accepts trials with score >= thresholds[k] (point 0 accepts all,
    p_miss 0 and p_fa 1); the last point accepts nothing.
    """
    scores = np.asarray(scores)
    if scores.dtype != np.float32:
        scores = scores.astype(np.float64)
    labels = np.asarray(labels).astype(bool)
    if scores.shape != labels.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be equal 1-D shapes")
    n_tar = int(np.count_nonzero(labels))
    n_non = len(labels) - n_tar
    if n_tar == 0 or n_non == 0:
        raise ValueError(f"need target and nontarget trials, got {n_tar} target, {n_non} nontarget")
    s, lab = _sorted_scores_and_labels(scores, labels)
    # Thresholds: the distinct scores. Rejecting everything below thresholds[k] rejects first[k] trials,
    # of which below[first[k]] are targets (misses).
    first = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    thresholds = s[first]
    del s  # (memory: at 10 M trials each of these arrays is 40-80 MB)
    below = np.zeros(len(lab) + 1, np.int32 if len(lab) < 2**31 else np.int64)
    np.cumsum(lab, out=below[1:])
    del lab
    miss = np.r_[below[first], n_tar]
    del below
    rejected = np.r_[first, len(scores)]
    del first
    p_fa = (n_non - (rejected - miss)) / n_non  # nontargets at or above the threshold
    return miss / n_tar, p_fa, thresholds


def eer_between(miss0, fa0, miss1, fa1):
    """The EER between two neighbouring operating points where p_miss - p_fa turns from < 0 (point 0) to
    >= 0 (point 1): the mean of the two rates, linearly interpolated to where the difference is zero.
    Elementwise on arrays of such pairs (the speaker bootstrap's replicates) as on floats."""
    d0, d1 = miss0 - fa0, miss1 - fa1
    step = np.where(d1 == d0, 1.0, d1 - d0)
    w = np.where(d1 == d0, 0.0, -d0 / step)
    return (1 - w) * (miss0 + fa0) / 2 + w * (miss1 + fa1) / 2


def _eer(p_miss: np.ndarray, p_fa: np.ndarray) -> float:
    diff = p_miss - p_fa  # rises from -1 to +1 along the thresholds
    i = int(np.searchsorted(diff, 0.0))
    if i == 0:
        return float(p_fa[0])
    return float(eer_between(p_miss[i - 1], p_fa[i - 1], p_miss[i], p_fa[i]))


def _min_dcf(p_miss: np.ndarray, p_fa: np.ndarray, p_target: float, c_miss: float, c_fa: float) -> float:
    dcf = c_miss * p_miss * p_target + c_fa * p_fa * (1 - p_target)
    return float(dcf.min() / min(c_miss * p_target, c_fa * (1 - p_target)))


def _point(p_miss: np.ndarray, p_fa: np.ndarray, thresholds: np.ndarray, k: int) -> Dict[str, float]:
    """Operating point k: its threshold (inf for the last point, which accepts nothing) and error rates."""
    t = float(thresholds[k]) if k < len(thresholds) else float("inf")
    return {"threshold": t, "p_miss": float(p_miss[k]), "p_fa": float(p_fa[k])}


def eer_point(p_miss: np.ndarray, p_fa: np.ndarray, thresholds: np.ndarray) -> Dict[str, float]:
    """Among the distinct scores t (decide target iff score >= t), the t where |P_miss - P_fa| is smallest,
    the lower t on a tie -> {"threshold", "p_miss", "p_fa"}."""
    gap = np.abs(p_miss[:-1] - p_fa[:-1])  # the last point (accept nothing) has no threshold
    return _point(p_miss, p_fa, thresholds, int(np.argmin(gap)))  # argmin: the first, i.e. lowest, on ties


def fa_point(p_miss: np.ndarray, p_fa: np.ndarray, thresholds: np.ndarray, rate: float) -> Dict[str, float]:
    """The lowest threshold whose false-alarm rate is at most `rate` -> {"threshold", "p_miss", "p_fa"}."""
    k = int(np.searchsorted(-p_fa, -rate, side="left"))  # p_fa falls along the points; the last is 0
    return _point(p_miss, p_fa, thresholds, k)


def thin_curve(p_miss: np.ndarray, p_fa: np.ndarray, max_points: int, floor: float = 5e-4):
    """At most about `max_points` points of an error curve (K,): evenly spaced by index, plus the first
    point past each value of a log-spaced grid in p_fa and in p_miss down to `floor` (so the low-error
    ends of a DET curve keep their shape) -> (p_miss, p_fa)."""
    k = len(p_miss)
    if k <= max_points:
        return p_miss, p_fa
    grid = np.geomspace(floor / 2, 1.0, max_points // 3)
    idx = np.r_[
        np.linspace(0, k - 1, max_points // 3).astype(np.int64),
        np.searchsorted(-p_fa, -grid),  # p_fa falls along the curve
        np.searchsorted(p_miss, grid),  # p_miss rises
    ]
    idx = np.unique(np.clip(idx, 0, k - 1))
    return p_miss[idx], p_fa[idx]


def compute_eer(scores, labels) -> float:
    """Equal error rate (fraction, 0..1), linearly interpolated where p_miss crosses p_fa."""
    p_miss, p_fa, _ = error_rates(scores, labels)
    return _eer(p_miss, p_fa)


def compute_min_dcf(scores, labels, p_target: float = 0.01, c_miss: float = 1.0, c_fa: float = 1.0) -> float:
    """Normalised minimum detection cost: min over thresholds of
    (c_miss p_miss p_target + c_fa p_fa (1 - p_target)) / min(c_miss p_target, c_fa (1 - p_target))."""
    p_miss, p_fa, _ = error_rates(scores, labels)
    return _min_dcf(p_miss, p_fa, p_target, c_miss, c_fa)


def verification_metrics(
    scores,
    labels,
    p_targets: Sequence[float] = (0.01, 0.05),
    c_miss: float = 1.0,
    c_fa: float = 1.0,
    fa_rates: Sequence[float] = FA_RATES,
    curve_points: Optional[int] = None,
) -> Dict[str, object]:
    """`scores (N,)`, `labels (N,)` -> {"eer", "min_dcf": {p_target: value}, "eer_point", "fa_points":
    {rate: point}, "p_miss", "p_fa"} from one sort; a point is {"threshold", "p_miss", "p_fa"}.

    `p_miss`, `p_fa` are the error curves (for the DET picture): whole (K+1,), or thinned to about
    `curve_points` points (`thin_curve`)."""
    p_miss, p_fa, thresholds = error_rates(scores, labels)
    out = {
        "eer": _eer(p_miss, p_fa),
        "min_dcf": {float(p): _min_dcf(p_miss, p_fa, p, c_miss, c_fa) for p in p_targets},
        "eer_point": eer_point(p_miss, p_fa, thresholds),
        "fa_points": {float(r): fa_point(p_miss, p_fa, thresholds, r) for r in fa_rates},
    }
    if curve_points is not None:
        p_miss, p_fa = thin_curve(p_miss, p_fa, curve_points)
    out["p_miss"], out["p_fa"] = p_miss, p_fa
    return out
