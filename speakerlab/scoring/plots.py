"""Pictures of a scored trial list: the DET curve and the target / nontarget score histograms.

Both are PNG files of WIDTH x HEIGHT pixels (640 x 480), drawn with matplotlib's Agg backend (no
display needed). The DET curve plots p_miss against p_fa on normal-deviate (probit) axes, as is usual
for speaker verification, with the EER and minDCF points marked; it is thinned to at most `max_points`
points, so its cost does not grow with the number of trials.
"""

from __future__ import annotations

from pathlib import Path
from statistics import NormalDist
from typing import Dict

import numpy as np

WIDTH, HEIGHT, DPI = 640, 480, 100
_TICKS = [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95]
_CLIP = (5e-4, 0.97)  # axis range in probability


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never try to open a window
    import matplotlib.pyplot as plt

    return plt


def _probit(p: np.ndarray) -> np.ndarray:
    inv = NormalDist().inv_cdf
    return np.array([inv(float(v)) for v in np.clip(p, *_CLIP)])


def _thin(p_miss: np.ndarray, p_fa: np.ndarray, max_points: int):
    """At most about `max_points` points of the curve: evenly spaced by index, plus the first point past
    each value of a log-spaced grid in p_fa and in p_miss (so the low-error ends keep their shape)."""
    k = len(p_miss)
    if k <= max_points:
        return p_miss, p_fa
    grid = np.geomspace(_CLIP[0] / 2, 1.0, max_points // 3)
    idx = np.r_[
        np.linspace(0, k - 1, max_points // 3).astype(np.int64),
        np.searchsorted(-p_fa, -grid),  # p_fa falls along the curve
        np.searchsorted(p_miss, grid),
    ]  # p_miss rises
    idx = np.unique(np.clip(idx, 0, k - 1))
    return p_miss[idx], p_fa[idx]


def plot_det(
    p_miss: np.ndarray,
    p_fa: np.ndarray,
    path,
    title: str,
    eer: float,
    min_dcf: Dict[float, float],
    max_points: int = 4000,
) -> Path:
    """DET curve of error curves `p_miss`, `p_fa` (K,) (from `metrics.verification_metrics`) -> PNG at path."""
    plt = _pyplot()
    pm, pf = _thin(np.asarray(p_miss), np.asarray(p_fa), max_points)
    fig, ax = plt.subplots(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    ax.plot(_probit(pf), _probit(pm), color="C0", lw=1.5, label="DET")
    ax.plot(_probit(np.array([eer])), _probit(np.array([eer])), "o", color="C3", label=f"EER {eer * 100:.2f}%")
    dcf_txt = ", ".join(f"minDCF({p:g}) {v:.3f}" for p, v in min_dcf.items())
    lo, hi = NormalDist().inv_cdf(_CLIP[0]), NormalDist().inv_cdf(_CLIP[1])
    ax.plot([lo, hi], [lo, hi], ls=":", color="grey", lw=0.8)
    ticks = _probit(np.array(_TICKS))
    labels = [f"{t * 100:g}" for t in _TICKS]
    ax.set_xticks(ticks, labels)
    ax.set_yticks(ticks, labels)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("false alarm rate (%)")
    ax.set_ylabel("miss rate (%)")
    ax.set_title(f"{title}\n{dcf_txt}", fontsize=9)
    ax.grid(True, lw=0.5, alpha=0.5)
    ax.legend(loc="upper right", fontsize=8)
    return _save(fig, plt, path)


def plot_histogram(scores: np.ndarray, labels: np.ndarray, path, title: str, bins: int = 100) -> Path:
    """Target and nontarget score densities of `scores (N,)`, `labels (N,)` -> PNG at path."""
    plt = _pyplot()
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels, bool)
    lo, hi = float(scores.min()), float(scores.max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    fig, ax = plt.subplots(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    for mask, name, colour in ((~labels, "nontarget", "C0"), (labels, "target", "C1")):
        # Histogram counts first, then stairs: drawing cost does not grow with the number of trials.
        counts, _ = np.histogram(scores[mask], edges, density=True)
        ax.stairs(counts, edges, fill=True, alpha=0.5, color=colour, label=f"{name} ({int(mask.sum())})")
    ax.set_xlabel("score")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def _save(fig, plt, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)  # no bbox_inches="tight": the size stays WIDTH x HEIGHT
    plt.close(fig)
    return path
